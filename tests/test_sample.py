"""sample.py and attention_maps.py, on a tiny character model trained here.

The command-line runs are started together (most of them forked from one process
that has imported torch, tests/forker.py) and checked by the tests below; the
attention maps are compared with one full forward of the model over the final
sequence.
"""

import base64
import concurrent.futures
import dataclasses
import errno
import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import ctrl_c_reaches_it, train_char_model

import sample
from data.tokenizer import get_tokenizer
from model import GPT, GPTConfig
from support import attention_maps
from support.checkpoint import checkpoint_path, save_checkpoint

BLOCK = 32
DASHES = "-" * 40
SUMMARY = re.compile(r"^prompt (\d+) tokens, (\d+) x (\d+) new tokens, [\d.]+ tokens/s \(.*\)$")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_NAMES = "|".join(attention_maps.NAMES)
LABEL = re.compile(rf"^({_NAMES}|broad|other|weak ({_NAMES})|mixed: ({_NAMES})\+({_NAMES}))$")


# -----------------------------------------------------------------------------
# A small trained model


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_path):
    """A checkpoint folder: a 2-layer, 64-wide char model after 150 AdamW steps."""
    with open(corpus_path, encoding="utf-8") as f:
        text = f.read()
    run = train_char_model(text, BLOCK, steps=150, batch_size=32)
    model = run["model"]
    tok = run["tok"]
    config = run["config"]
    opt = run["opt"]
    gen = run["gen"]
    # well below log(65) = 4.17: it has learned something
    assert run["loss"] < 3.0
    folder = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "model_args": dataclasses.asdict(config),
            "iter_num": 150,
            "best_val_loss": run["loss"],
            "config": {"batch_size": 32, "learning_rate": 3e-3},
            "tokenizer": tok.describe(),
            "dataset": "shakespeare_char",
            "rng": {"torch": torch.get_rng_state()},
            "data": {"generator": gen.get_state()},
        },
        checkpoint_path(folder),
    )
    model.eval()
    return {"dir": str(folder), "model": model, "tok": tok}


# -----------------------------------------------------------------------------
# The command-line runs, all started at once

PROMPT = "First Citi"  # 10 characters: with 60 new tokens the 32-token window slides
LONG_PROMPT = "Before we proceed any further, hear me speak. All: Speak, speak."


def bad_inputs(ckpt, tmp):
    """name -> (argv, what the error line must say); write_corrupt(tmp) makes the bad file."""
    corrupt = os.path.join(tmp, "corrupt")
    return {
        "bad_char": ([f"--out_dir={ckpt}", "--prompt=Café"], "'é'"),
        "empty_prompt": ([f"--out_dir={ckpt}", "--prompt="], "prompt is empty"),
        "no_checkpoint": ([f"--out_dir={tmp}/nothing-here", "--prompt=ROMEO:"], "no checkpoint at"),
        "corrupt_checkpoint": ([f"--out_dir={corrupt}", "--prompt=ROMEO:"], "not a checkpoint"),
        "zero_tokens": ([f"--out_dir={ckpt}", "--max_new_tokens=0"], "--max_new_tokens"),
        "negative_temperature": ([f"--out_dir={ckpt}", "--temperature=-1"], "--temperature"),
        "none_samples": ([f"--out_dir={ckpt}", "--num_samples=None"], "num_samples cannot be None"),
        "unknown_option": ([f"--out_dir={ckpt}", "--temprature=0.5"], "did you mean 'temperature'"),
        "missing_prompt_file": (
            [f"--out_dir={ckpt}", f"--prompt=FILE:{tmp}/missing.txt"],
            "prompt file not found",
        ),
        "cuda_without_gpu": ([f"--out_dir={ckpt}", "--device=cuda"], "no CUDA GPU"),
        "compile_without_cache": ([f"--out_dir={ckpt}", "--compile", "--no_cache"], "--compile"),
    }


def write_corrupt(tmp):
    os.makedirs(os.path.join(tmp, "corrupt"), exist_ok=True)
    with open(checkpoint_path(os.path.join(tmp, "corrupt")), "wb") as f:
        f.write(b"PK\x03\x04 not really a checkpoint")


def _runs(trained, tmp):
    ckpt = trained["dir"]
    # a copy for runs that must not write into the checkpoint folder
    quiet = os.path.join(tmp, "quiet")
    os.makedirs(quiet)
    shutil.copy(checkpoint_path(ckpt), quiet)
    prompt_file = os.path.join(tmp, "prompt.txt")
    with open(prompt_file, "w", encoding="utf-8") as f:
        f.write("ROMEO:")
    greedy = [
        f"--out_dir={quiet}",
        "--temperature=0",
        "--max_new_tokens=80",
        "--num_samples=1",
        "--attn_dir",
        "",
    ]
    return {
        "main": [
            f"--out_dir={ckpt}",
            f"--prompt={PROMPT}",
            "--max_new_tokens=60",
            "--num_samples=2",
            "--seed=3",
            f"--attn_dir={tmp}/attn_main",
        ],
        "short": [
            "--out_dir",
            ckpt,
            "--prompt",
            "ROMEO:",
            "--max_new_tokens",
            "20",
            "--num_samples=1",
        ],  # attention to the default place, <out_dir>/attention
        # the maps of the whole text (the window at the end), and of the last 10 tokens
        "span_all": [
            f"--out_dir={ckpt}",
            f"--prompt={PROMPT}",
            "--max_new_tokens=60",
            "--num_samples=1",
            "--seed=3",
            "--attn_span=all",
            f"--attn_dir={tmp}/attn_all",
        ],
        "span_last": [
            f"--out_dir={ckpt}",
            f"--prompt={PROMPT}",
            "--max_new_tokens=60",
            "--num_samples=1",
            "--seed=3",
            "--attn_span=-10:",
            f"--attn_dir={tmp}/attn_last",
        ],
        "greedy": greedy + ["--prompt=ROMEO:"],
        "greedy_no_cache": greedy + ["--prompt=ROMEO:", "--no_cache"],
        "greedy_compiled": greedy + ["--prompt=ROMEO:", "--compile"],
        "greedy_stream": greedy + ["--prompt=ROMEO:", "--stream"],
        "greedy_file": greedy + [f"--prompt=FILE:{prompt_file}"],
        "long_prompt": greedy + [f"--prompt={LONG_PROMPT}", "--max_new_tokens=5"],
        # two bad inputs through the real command line; bad_inputs() has them all
        "bad_char": bad_inputs(ckpt, tmp)["bad_char"][0],
        "no_checkpoint": bad_inputs(ckpt, tmp)["no_checkpoint"][0],
    }


@pytest.fixture(scope="module")
def runs(trained, tmp_path_factory, repo_root, forker):
    tmp = str(tmp_path_factory.mktemp("runs"))
    argvs = _runs(trained, tmp)
    # the --compile run is a process of its own, as a user starts it; its autotuner picks
    # among ATen's kernels only: C++ GEMM templates would add some 25 s of compiling, and
    # test_model.py's compiled generation already runs the full autotuner
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS="ATEN")
    command = [sys.executable, os.path.join(repo_root, "sample.py"), *argvs.pop("greedy_compiled")]
    # its output read as it comes (a full pipe would stall it) while the others run
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        # a hang guard: --compile on a slow, busy CPU takes minutes
        compiled = pool.submit(
            subprocess.run, command, capture_output=True, text=True, env=env, cwd=tmp, timeout=600
        )
        # the others forked from one process that has imported torch (forker.py): the
        # same command lines without an interpreter's start-up each
        jobs = [("sample.py", argv, {"cwd": tmp}) for argv in argvs.values()]
        results = dict(zip(argvs, forker.run(jobs, workers=2)))
        results["greedy_compiled"] = compiled.result()
    results["tmp"] = tmp
    return results


def samples_of(stdout):
    """The sample texts (without the final newline print adds) and the summary line."""
    parts = stdout.split("\n" + DASHES + "\n")
    return parts[:-1], parts[-1].splitlines()[0]


def ok(proc):
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


# -----------------------------------------------------------------------------
# Sampling


def test_prints_samples_and_summary(runs):
    texts, summary = samples_of(ok(runs["main"]).stdout)
    assert len(texts) == 2
    for text in texts:
        assert text.startswith(PROMPT) and len(text) == len(PROMPT) + 60  # one char per token
    assert texts[0] != texts[1]  # sampled at temperature 0.8, two draws
    m = SUMMARY.match(summary)
    assert m and m.groups() == ("10", "2", "60")


@pytest.mark.stock_formula
def test_greedy_same_with_and_without_cache_stream_and_file(runs, trained):
    greedy, _ = samples_of(ok(runs["greedy"]).stdout)
    assert len(greedy) == 1 and len(greedy[0]) == len("ROMEO:") + 80
    for name in ("greedy_no_cache", "greedy_compiled", "greedy_stream", "greedy_file"):
        assert samples_of(ok(runs[name]).stdout)[0] == greedy, name
    assert "compiled the decode step" in runs["greedy_compiled"].stderr
    assert "(compiled, kv cache" in samples_of(runs["greedy_compiled"].stdout)[1]
    # the oracle: argmax of a full forward at every step, no cache, no window logic
    model, tok = trained["model"], trained["tok"]
    ids = tok.encode("ROMEO:")
    with torch.no_grad():
        for _ in range(80):
            logits, _ = model(torch.tensor([ids[-BLOCK:]]))
            ids.append(int(logits[0, -1].argmax()))
    if len(tok.encode("ROMEO:")) + 80 <= BLOCK:
        assert greedy[0] == tok.decode(ids)
    else:  # past the window the model slides by a quarter, not one token: compare the start
        assert greedy[0][: BLOCK + 1] == tok.decode(ids)[: BLOCK + 1]
    # --attn_dir "" writes no maps
    assert not os.path.exists(os.path.join(runs["tmp"], "quiet", "attention"))


def test_long_prompt_is_cropped_with_a_notice(runs):
    proc = ok(runs["long_prompt"])
    notes = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(notes) == 1 and "keeping the last 32" in notes[0]
    texts, summary = samples_of(proc.stdout)
    assert texts[0].startswith(LONG_PROMPT[-BLOCK:]) and len(texts[0]) == BLOCK + 5
    assert SUMMARY.match(summary).group(1) == str(BLOCK)


def one_line_error(code, stderr):
    assert code == 2  # bad input (support/cli.py)
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("name", list(bad_inputs("ckpt", "tmp")))
def test_bad_input_gives_one_line_error(name, trained, tmp_path, capsys):
    if name == "cuda_without_gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    write_corrupt(str(tmp_path))
    argv, expected = bad_inputs(trained["dir"], str(tmp_path))[name]
    code = sample.run(argv)  # what `python sample.py ...` exits with
    line = one_line_error(code, capsys.readouterr().err)
    assert expected in line
    if name == "bad_char":
        assert "did you mean 'e'" in line


@pytest.mark.parametrize("name", ["bad_char", "no_checkpoint"])
def test_bad_input_on_the_command_line(runs, name):
    proc = runs[name]
    line = one_line_error(proc.returncode, proc.stderr)
    assert line.startswith("error: ") and bad_inputs("ckpt", runs["tmp"])[name][1] in line


# Ctrl-C: sample.py in a child that sends itself SIGINT, as a terminal's Ctrl-C does,
# once its second sample has 15 tokens; what it prints is compared with a run not stopped
CTRL_C_AT_TOKEN_15 = """
import os, signal, sys
import sample
from support import engine

real_stream = engine.stream
samples = []

def stream(*args, **kwargs):
    samples.append(0)
    for step in real_stream(*args, **kwargs):
        yield step
        samples[-1] += 1
        if len(samples) == 2 and samples[-1] == 15:
            os.kill(os.getpid(), signal.SIGINT)

engine.stream = stream
sys.exit(sample.run(sys.argv[1:]))
"""


@pytest.mark.stock_formula
@pytest.mark.parametrize("stream", [False, True])
def test_ctrl_c_prints_what_was_generated(trained, tmp_path, repo_root, capsys, stream):
    argv = [f"--out_dir={trained['dir']}", "--prompt=ROMEO:", "--max_new_tokens=40"]
    argv += ["--num_samples=2", "--seed=3", f"--stream={stream}"]
    proc = subprocess.run(
        [sys.executable, "-c", CTRL_C_AT_TOKEN_15, *argv, f"--attn_dir={tmp_path}/stopped"],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=ctrl_c_reaches_it,
    )
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, "nothing said of the samples"
    found = re.fullmatch(r"stopped by Ctrl-C: sample 2 of 2 has (\d+) of 40 new tokens", lines[-1])
    assert found, proc.stderr
    n = int(found.group(1))
    assert 14 <= n <= 15
    # the oracle: the same samples, not stopped
    assert sample.run(argv + ["--attn_dir="]) == 0
    whole, _ = samples_of(capsys.readouterr().out)
    # the partial sample ends with its rule, as a whole one does
    stopped = proc.stdout.split("\n" + DASHES + "\n")
    assert stopped[0] == whole[0]
    assert stopped[1] == whole[1][: len("ROMEO:") + n]  # one character a token
    # the first sample was done: its attention maps are saved, as after a whole run
    assert stopped[2].startswith("attention of sample 1 ")
    assert os.path.exists(os.path.join(tmp_path, "stopped", "index.html"))


# -----------------------------------------------------------------------------
# Attention files


def attention_dirs(runs, trained):
    return {
        "main": os.path.join(runs["tmp"], "attn_main"),
        "short": os.path.join(trained["dir"], "attention"),
        "span_all": os.path.join(runs["tmp"], "attn_all"),
        "span_last": os.path.join(runs["tmp"], "attn_last"),
    }


def drawn_span(name, n_tokens):
    """The (start, end) of the tokens a run's maps show: by default the first 64, cut
    to the context (the prompt and the start of the generation); the window at the end
    for --attn_span=all (its length found in the file); the last 10 for -10:."""
    return {
        "main": (0, min(64, BLOCK, n_tokens)),
        "short": (0, min(64, BLOCK, n_tokens)),
        "span_all": None,
        "span_last": (n_tokens - 10, n_tokens),
    }[name]


def test_attention_files(runs, trained):
    for name, folder in attention_dirs(runs, trained).items():
        ok(runs[name])
        z = np.load(os.path.join(folder, "attention.npz"))
        assert set(z.files) == {"layer_0", "layer_1", "tokens", "token_ids", "window_start"}
        T = len(z["tokens"])
        text = samples_of(runs[name].stdout)[0][0]  # the first printed sample
        start, end = drawn_span(name, len(text)) or (len(text) - T, len(text))
        # the drawn tokens are the span's, one character each
        assert "".join(z["tokens"]) == text[start:end] and int(z["window_start"]) == start
        for key in ("layer_0", "layer_1"):
            a = z[key]
            assert a.dtype == np.float32 and a.shape == (4, T, T)
            # a span from the first token holds every key its rows saw; a later one not
            if start == 0 or name == "span_all":
                np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-5)
            else:
                assert (a.sum(-1) <= 1 + 1e-5).all() and (a.sum(-1) < 0.999).any()
            assert (np.triu(a, 1) == 0).all()
            assert (a >= 0).all()

        for layer in (0, 1):
            with open(os.path.join(folder, f"layer_{layer}.png"), "rb") as f:
                png = f.read()
            assert png[:8] == PNG_SIGNATURE and png[12:16] == b"IHDR"
            width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
            assert width > 200 and height > 200

        with open(os.path.join(folder, "heads.json"), encoding="utf-8") as f:
            record = json.load(f)
        heads = record["heads"]
        assert sorted((h["layer"], h["head"]) for h in heads) == [
            (layer, h) for layer in range(2) for h in range(4)
        ]
        # the labels are heads.py's, measured over the whole window the generation ended
        # on (a full forward over it is the oracle), whatever span is drawn
        first, last = record["positions"]
        ids = trained["tok"].encode(text)[first : last + 1]
        assert record["tokens"] == len(ids) and (len(text) - first) == len(ids)
        window = [trained["tok"].decode([i]) for i in ids]
        expected = attention_maps.all_head_stats(full_forward_maps(trained["model"], ids), window)
        assert [h["label"] for h in heads] == [h["label"] for h in expected]
        for got, want in zip(heads, expected):
            for c in attention_maps.CLASSES:
                assert got["scores"][c] == pytest.approx(want["scores"][c], abs=1e-3)
        for h in heads:
            assert LABEL.match(h["label"]), h["label"]
            assert sum(h["scores"].values()) == pytest.approx(1.0, abs=3e-4)
            assert h["concentration"] in ("sparse", "focused", "broad") and h["entropy"] >= 0
            # sample.py prints the same table
            shares = r"\s+".join(f"{h['scores'][c]:.2f}" for c in attention_maps.CLASSES)
            row = (
                rf"^\s*{h['layer']}\s+{h['head']}\s+{re.escape(h['label'])}"
                rf"\s+{h['concentration']}\s+{shares}$"
            )
            assert re.search(row, runs[name].stdout, re.M)

        check_html(os.path.join(folder, "index.html"), z)


def page_data(path):
    """The JSON the page carries."""
    with open(path, encoding="utf-8") as f:
        html = f.read()
    found = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(found.group(1))


def check_html(path, z):
    with open(path, encoding="utf-8") as f:
        html = f.read()
    # self-contained: nothing fetched from anywhere
    assert not re.search(r"https?://|//cdn|@import|<link|<script[^>]*\bsrc=|<img", html, re.I)
    assert "<canvas" in html
    data = page_data(path)
    T = len(z["tokens"])
    assert data["tokens"] == [attention_maps.display_token(t) for t in z["tokens"]]
    assert len(data["maps"]) == 2 and all(len(heads) == 4 for heads in data["maps"])
    # one head decoded as the page does: bytes are round(255 sqrt(w)), lower triangle by rows
    b = np.frombuffer(base64.b64decode(data["maps"][1][2]), dtype=np.uint8)
    assert b.size == T * (T + 1) // 2
    np.testing.assert_allclose((b / 255.0) ** 2, z["layer_1"][2][np.tril_indices(T)], atol=0.005)


def full_forward_maps(model, ids):
    with torch.no_grad():
        _, maps = model.attention_maps(torch.tensor([ids]))
    return [m[0].numpy() for m in maps]


def test_maps_equal_a_full_forward(runs, trained):
    tok = trained["tok"]
    for name, folder in attention_dirs(runs, trained).items():
        z = np.load(os.path.join(folder, "attention.npz"))
        full = tok.encode(samples_of(ok(runs[name]).stdout)[0][0])  # the printed first sample
        T = len(z["tokens"])
        start = int(z["window_start"])
        ids = full[start : start + T]
        assert z["token_ids"].tolist() == ids
        if name == "span_all":  # 70 tokens through a 32-token window: it slid
            assert len(full) == 70 and BLOCK * 3 // 4 <= T <= BLOCK and start == len(full) - T
            expected = full_forward_maps(trained["model"], ids)
        elif name == "span_last":  # the last 10 rows, each over the 32 tokens up to the end
            assert (start, T) == (60, 10)
            expected = [m[:, -T:, -T:] for m in full_forward_maps(trained["model"], full[-BLOCK:])]
        else:  # the prompt and the start of the generation, a whole context's worth at most
            assert start == 0 and T == min(BLOCK, len(full))
            expected = full_forward_maps(trained["model"], ids)
        for layer, want in enumerate(expected):
            np.testing.assert_allclose(z[f"layer_{layer}"], want, atol=1e-5, rtol=0)


def test_the_pages_note_says_what_the_span_leaves_out(runs):
    data = page_data(os.path.join(runs["tmp"], "attn_last", "index.html"))
    # the last 10 rows also attended to the 22 tokens before them, in a 32-token context
    assert data["hidden"] == BLOCK - 10 and data["first_position"] == 60
    assert page_data(os.path.join(runs["tmp"], "attn_main", "index.html"))["hidden"] == 0


@pytest.mark.parametrize(
    "span, expected",
    [
        ("0-64", "--attn_span must be START:END"),
        ("a:b", "--attn_span must be START:END"),
        ("1:2:3", "--attn_span must be START:END"),
        ("100:200", "holds no token of a sample of 10"),
    ],
)
def test_a_bad_span_is_one_line_before_sampling(trained, capsys, span, expected):
    argv = [f"--out_dir={trained['dir']}", "--prompt=ROMEO:", "--max_new_tokens=4"]
    code = sample.run(argv + [f"--attn_span={span}", "--attn_dir="])
    out, err = capsys.readouterr()
    assert expected in one_line_error(code, err)
    assert out == ""  # said before any sample was drawn


def test_a_span_longer_than_the_context_keeps_its_start_and_says_so(trained, tmp_path, capsys):
    argv = [f"--out_dir={trained['dir']}", "--prompt=ROMEO:", "--max_new_tokens=60"]
    argv += ["--num_samples=1", "--attn_span=5:", f"--attn_dir={tmp_path}"]
    assert sample.run(argv) == 0
    err = capsys.readouterr().err
    assert f"--attn_span=5: spans 61 tokens, more than the model's context of {BLOCK}" in err
    z = np.load(tmp_path / "attention.npz")
    assert int(z["window_start"]) == 5 and len(z["tokens"]) == BLOCK


def options(**changes):
    return sample.Settings(**dict(dict(temperature=1.0, top_k=None, top_p=1.0), **changes))


@pytest.mark.stock_formula
@pytest.mark.parametrize("prompt_len, n_new", [(10, 60), (5, 27), (5, 28), (40, 3)])
@pytest.mark.parametrize("no_cache", [False, True])
def test_assembled_maps_equal_a_full_forward(trained, prompt_len, n_new, no_cache):
    """In process, around the window's edges: 5 + 27 fills the window exactly, 5 + 28 makes the
    last token slide it, a 40-token prompt starts past it."""
    model = trained["model"]
    ids = trained["tok"].encode(LONG_PROMPT[:prompt_len])
    idx = torch.tensor([ids])
    cfg = options(max_new_tokens=n_new, no_cache=no_cache)
    gen = torch.Generator().manual_seed(5)
    new, steps = sample.generate_one(model, idx, cfg, gen, attention=True)
    after = gen.get_state()
    # attention changes neither the sample nor the generator's state afterwards
    gen_plain = torch.Generator().manual_seed(5)
    assert sample.generate_one(model, idx, cfg, gen_plain)[0] == new
    assert torch.equal(gen_plain.get_state(), after)

    layers, start = attention_maps.assemble(steps)
    full = ids + new
    T = len(full) - start
    assert layers[0].shape == (4, T, T)
    assert (T == len(full)) if len(full) <= BLOCK else (BLOCK * 3 // 4 <= T <= BLOCK)
    for got, expected in zip(layers, full_forward_maps(model, full[start:])):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
        assert (np.triu(got, 1) == 0).all()


# -----------------------------------------------------------------------------
# Head patterns against maps whose answer is known


def pattern_maps(T):
    prev = np.eye(T, k=-1)
    prev[0, 0] = 1.0  # the first token has only itself to attend to
    first = np.zeros((T, T))
    first[:, 0] = 1.0
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    return {"previous": prev, "self": np.eye(T), "first": first, "broad": uniform}


def test_head_patterns_oracle(tmp_path):
    T = 12
    tokens = [chr(97 + i) for i in range(T)]
    maps = pattern_maps(T)
    for name, a in maps.items():
        stats = attention_maps.head_stats(a, tokens)
        assert stats["label"] == name, (name, stats)
        assert all(0 <= v <= 1 for v in stats["scores"].values())
    # the rows scored are i > BAND; a one-hot row has no entropy,
    # a uniform row over i + 1 keys log(i + 1)
    rows = range(attention_maps.BAND + 1, T)
    assert attention_maps.head_stats(maps["previous"], tokens)["entropy"] == 0
    expected = np.mean([math.log(i + 1) for i in rows])
    assert attention_maps.head_stats(maps["broad"], tokens)["entropy"] == pytest.approx(
        expected, abs=1e-4
    )
    # a head that mostly attends to the previous token, with some spread, is still "previous"
    mixed = 0.8 * maps["previous"] + 0.2 * maps["broad"]
    assert attention_maps.head_stats(mixed, tokens)["label"] == "previous"

    # the same through the files: heads.json lists them in head order
    layer = np.stack(list(maps.values())).astype(np.float32)
    attention_maps.write_all(str(tmp_path), [layer], tokens)
    with open(tmp_path / "heads.json", encoding="utf-8") as f:
        heads = json.load(f)["heads"]
    assert [h["label"] for h in heads] == list(maps)


# -----------------------------------------------------------------------------
# A Hugging Face GPT-2 folder


def write_hf_gpt2(model, folder):
    """Save model as Hugging Face GPT-2 files: config.json and model.safetensors,
    with the (in, out) Conv1D layout that format uses for its projections."""
    from safetensors.torch import save_file

    c = model.config
    tensors = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to wte
        if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            tensor = tensor.t()
        tensors[key.removeprefix("transformer.")] = tensor.contiguous().clone()
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(
            {
                "n_positions": c.block_size,
                "vocab_size": c.vocab_size,
                "n_layer": c.n_layer,
                "n_head": c.n_head,
                "n_embd": c.n_embd,
                "activation_function": "gelu_new",
            },
            f,
        )


def test_attention_folder_that_takes_no_file_stops_before_sampling(tmp_path, capsys):
    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=16, vocab_size=50257, n_layer=1, n_head=2, n_embd=16))
    (tmp_path / "gpt2-tiny").mkdir()
    write_hf_gpt2(model, str(tmp_path / "gpt2-tiny"))
    (tmp_path / "a_file").write_text("not a folder")
    attn_dir = tmp_path / "a_file" / "maps"
    code = sample.run(
        [f"--init_from={tmp_path / 'gpt2-tiny'}", "--max_new_tokens=4", f"--attn_dir={attn_dir}"]
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().startswith(f"error: cannot write into {attn_dir}"), err
    assert err.strip().endswith("pass --attn_dir=DIR"), err
    assert out == ""  # no sample was drawn only to be followed by this error


def test_default_maps_folder_that_takes_no_file_still_samples(trained, tmp_path, capsys):
    """The maps' default place is in the checkpoint's folder, which may not be writable
    (another's, read-only; here a file stands where the folder goes): the samples were
    refused for maps nobody asked for. Now they are drawn, and a note says why no maps."""
    folder = tmp_path / "ckpt"
    shutil.copytree(trained["dir"], folder)
    shutil.rmtree(folder / "attention", ignore_errors=True)  # the other tests' maps
    (folder / "attention").write_text("not a folder")
    code = sample.run([f"--out_dir={folder}", "--max_new_tokens=4", "--num_samples=1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(samples_of(out)[0]) == 1
    assert err.strip().splitlines() == [
        f"(no attention maps: cannot write into {folder / 'attention'} "
        f"({os.strerror(errno.EEXIST)}); pass --attn_dir=DIR for them)"
    ]
    assert (folder / "attention").read_text() == "not a folder"


def test_text_the_terminal_cannot_show_is_replaced_not_a_traceback(tmp_path, repo_root):
    # GPT-2's tokens hold characters that an ascii or latin-1 terminal (or a file written
    # on Windows, cp1252) cannot encode: print raised UnicodeEncodeError, a traceback
    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=64, vocab_size=50257, n_layer=1, n_head=2, n_embd=16))
    hf = tmp_path / "gpt2-tiny"
    hf.mkdir()
    write_hf_gpt2(model.eval(), str(hf))
    # the prompt starts the sample: what it holds is shown whatever the model writes
    argv = [sys.executable, "sample.py", f"--init_from={hf}", "--prompt=Café — naïve", "--seed=3"]
    argv += ["--max_new_tokens=60", "--num_samples=1", f"--attn_dir={tmp_path / 'attn'}"]
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    proc = subprocess.run(argv, cwd=repo_root, env=env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    texts, summary = samples_of(proc.stdout.decode("ascii"))
    assert len(texts) == 1 and texts[0].startswith("Caf? ? na?ve") and "tokens/s" in summary


def test_init_from_hugging_face_folder(tmp_path, capsys):
    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=64, vocab_size=50257, n_layer=1, n_head=2, n_embd=16)).eval()
    hf = tmp_path / "gpt2-tiny"
    hf.mkdir()
    write_hf_gpt2(model, str(hf))
    code = sample.run(
        [
            f"--init_from={hf}",
            "--prompt=Hello, world",
            "--temperature=0",
            "--max_new_tokens=6",
            "--num_samples=1",
            f"--attn_dir={tmp_path}/attn",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    # the oracle: the same weights in memory, greedy, with GPT-2's BPE
    tok = get_tokenizer({"kind": "gpt2"})
    expected = model.generate(torch.tensor([tok.encode("Hello, world")]), 6, temperature=0)[
        0
    ].tolist()
    assert samples_of(out)[0] == [tok.decode(expected)]
    z = np.load(tmp_path / "attn" / "attention.npz")
    assert z["token_ids"].tolist() == expected and z["layer_0"].shape == (
        2,
        len(expected),
        len(expected),
    )
