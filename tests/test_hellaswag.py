"""HellaSwag, completion style (support/hellaswag.py): a model built so that the
right ending is known, the model's own loss as a second computation, and
Hugging Face GPT-2 as the oracle for the command line."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import local_server, tiny_run

from data.dataset import load_meta
from data.tokenizer import CharTokenizer, gpt2_encoding
from model import GPT, GPTConfig
from support import hellaswag
from support.run_log import read_evaluations

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHARS = " .abcdefgh"


def NO_AUTOCAST():
    return torch.autocast("cpu", enabled=False)


def repeating_model():
    """A GPT whose blocks add nothing and whose embeddings are one-hot, so each
    position's logits peak on the token it reads: it predicts that a character
    repeats. An ending that repeats its characters is then the likeliest."""
    V = len(CHARS)
    model = GPT(GPTConfig(vocab_size=V, block_size=64, n_layer=1, n_head=1, n_embd=V, bias=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("c_proj.weight") or "wpe" in name:
                p.zero_()
        model.transformer.wte.weight.copy_(3 * torch.eye(V))  # tied to lm_head
    return model.eval()


def example(ctx, endings, label):
    return {"ctx": ctx, "endings": endings, "label": label}


EXAMPLES = [
    # the repeating ending is right; the others change character at every step
    example("aaaa", ["abab", "aaaa", "acdc", "aefg"], 1),
    example("cc", ["cccccc.", "chcgcf.", "cdcdcd.", "cacbca."], 0),
    # summed and mean loss disagree: the long ending repeats but is long, the
    # short one changes character once
    example("bb", ["bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbh", "bh", "bgh", "bfgh"], 0),
]


def independent_losses(model, tok, ex):
    """(summed, mean) loss of each ending, from the model's own loss with the
    context's targets ignored (-1), one ending at a time."""
    summed, mean = [], []
    for ending in ex["endings"]:
        ctx, end = tok.encode(ex["ctx"]), tok.encode(" " + ending)
        ids = torch.tensor([ctx + end])
        targets = ids[:, 1:].clone()
        targets[:, : len(ctx) - 1] = -1
        _, loss = model(ids[:, :-1], targets)
        summed.append(loss.item() * len(end))
        mean.append(loss.item())
    return summed, mean


def test_the_repeating_ending_wins_and_losses_match_another_computation():
    model, tok = repeating_model(), CharTokenizer(CHARS)
    records = hellaswag.score(model, tok, EXAMPLES, "cpu", NO_AUTOCAST)
    assert [r["pred_norm"] for r in records] == [1, 0, 0]
    assert records[2]["pred"] == 1  # the short ending has the lowest sum
    assert hellaswag.accuracy(records) == (2 / 3, 1.0)
    for ex, record in zip(EXAMPLES, records):
        summed, mean = independent_losses(model, tok, ex)
        assert record["losses"] == pytest.approx(summed, abs=1e-4)
        assert record["mean_losses"] == pytest.approx(mean, abs=1e-5)
        # acc_norm's choice, made another way
        assert record["pred_norm"] == min(range(4), key=mean.__getitem__)


def test_a_long_context_loses_its_start():
    tok = CharTokenizer(CHARS)
    ex = example("abcdefgh" * 20, ["a", "bb", "ccc", "dddd"], 0)
    tokens, mask = hellaswag.render(tok, ex, block_size=16)
    assert tokens.shape == (4, 16)
    assert mask.sum(dim=1).tolist() == [2, 3, 4, 5]  # the space, then the ending
    assert (
        tok.decode(tokens[3].tolist()) == "fghabcdefgh dddd"
    )  # the last 11 characters of the context


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    folder = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(folder)
    return model, str(folder)


def write_examples(path, examples):
    with open(path, "w") as f:
        for ex in examples:
            f.write(json.dumps(ex) + "\n")


def run_hellaswag(*args):
    return subprocess.run(
        [sys.executable, "-m", "support.hellaswag", "--device=cpu", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_command_on_a_gpt2_folder_matches_hugging_face(tmp_path, hf_gpt2):
    hf, folder = hf_gpt2
    examples = [
        example(
            "A man is sitting on a roof. He",
            ["is using wrap.", "starts pulling up roofing."]
            + ["is holding a cube.", "is ripping level tiles off."],
            i % 4,
        )
        for i in range(5)
    ]
    write_examples(tmp_path / "hs.jsonl", examples)
    out = tmp_path / "out.jsonl"
    result = run_hellaswag(
        f"--init_from={folder}", f"--data={tmp_path / 'hs.jsonl'}", f"--out={out}"
    )
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(5))

    enc = gpt2_encoding()
    right = 0
    for ex, record in zip(examples, records):
        mean = []
        for ending, summed in zip(ex["endings"], record["losses"]):
            ctx, end = enc.encode_ordinary(ex["ctx"]), enc.encode_ordinary(" " + ending)
            ids = torch.tensor([ctx + end])
            with torch.no_grad():
                logits = hf(ids).logits[0, len(ctx) - 1 : -1]
            loss = F.cross_entropy(logits, torch.tensor(end))
            assert summed == pytest.approx(loss.item() * len(end), abs=1e-3)
            mean.append(loss.item())
        pred_norm = min(range(4), key=mean.__getitem__)
        assert record["pred_norm"] == pred_norm
        right += pred_norm == ex["label"]
    assert f"acc_norm {right / 5:.4f}" in result.stdout


@pytest.mark.parametrize(
    "line, words",
    [
        ("{not json", "line 2 is not valid JSON"),
        (json.dumps(example("x", ["a", "b", "c"], 0)), "line 2 needs 'endings'"),
        (json.dumps(example("x", ["a", "b", "c", "d"], 4)), "line 2 needs 'label'"),
    ],
)
def test_a_malformed_line_is_one_line(tmp_path, hf_gpt2, line, words):
    good = json.dumps(example("x", ["a", "b", "c", "d"], 0))
    (tmp_path / "bad.jsonl").write_text(good + "\n" + line + "\n")
    out = tmp_path / "out.jsonl"
    result = run_hellaswag(
        f"--init_from={hf_gpt2[1]}", f"--data={tmp_path / 'bad.jsonl'}", f"--out={out}"
    )
    assert result.returncode == 2  # bad input
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert words in result.stderr
    assert not out.exists()  # nothing half-written


def test_a_failed_download_names_each_command_s_own_setting(
    tmp_path, data_root, hf_gpt2, monkeypatch, capsys
):
    """Where HellaSwag cannot be downloaded (here: a port that refuses), train.py names
    its --hellaswag_data and the command its --data, before any training."""
    import train
    from support import hellaswag

    monkeypatch.setattr(hellaswag, "HELLASWAG_URL", "http://127.0.0.1:9/hellaswag_val.jsonl")
    monkeypatch.setattr(hellaswag, "DEFAULT_DATA", str(tmp_path / "hs" / "hellaswag_val.jsonl"))
    hellaswag.training_examples.cache_clear()  # a file read before would answer instead
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        train.main(tiny_run(data_root, out, "--hellaswag=True", max_iters=2))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert lines[0].endswith(f"put it at {hellaswag.DEFAULT_DATA}, or pass --hellaswag_data=PATH")
    assert not out.exists()  # refused before any run started
    assert hellaswag.run([f"--init_from={hf_gpt2[1]}"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].endswith("or pass --data=PATH")


EXAMPLE = json.dumps({"ctx": "A man", "endings": ["a", "b", "c", "d"], "label": 0}) + "\n"
CUT = (EXAMPLE * 20)[:-25].encode()  # 19 examples and the cut start of a 20th


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + CUT, id="short"),
        pytest.param(b"HTTP/1.0 200 OK\r\n\r\n" + CUT, id="no length"),
    ],
)
def test_a_cut_download_is_one_line_and_not_kept(tmp_path, data_root, monkeypatch, capsys, cut):
    """A connection closed part way, by a real server: short of its Content-Length (an
    IncompleteRead, a traceback before), or with no length to check (the cut file was
    kept, and read as the official one from then on, before)."""
    import train

    monkeypatch.setattr(hellaswag, "DEFAULT_DATA", str(tmp_path / "hs" / "hellaswag_val.jsonl"))
    hellaswag.training_examples.cache_clear()
    with local_server(cut) as url, pytest.raises(SystemExit) as stop:
        monkeypatch.setattr(hellaswag, "HELLASWAG_URL", url)
        train.main(tiny_run(data_root, tmp_path / "out", "--hellaswag=True", max_iters=2))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    if b"Content-Length" in cut:
        assert "IncompleteRead" in lines[0] and "cannot download HellaSwag" in lines[0]
    else:
        assert "is damaged (its line 20 is not valid JSON)" in lines[0], lines[0]
    assert lines[0].endswith(f"put it at {hellaswag.DEFAULT_DATA}, or pass --hellaswag_data=PATH")
    assert not os.path.exists(hellaswag.DEFAULT_DATA)
    assert not os.path.exists(hellaswag.DEFAULT_DATA + ".tmp")


def test_train_refuses_hellaswag_outside_a_character_vocabulary(tmp_path, data_root, capsys):
    """HellaSwag's texts hold characters tiny Shakespeare's 65 lack (digits, brackets,
    accents): train.py says so before it trains (after training, at its first evaluation,
    a traceback, and no checkpoint saved, before)."""
    import train

    examples = EXAMPLES + [example("[header] 2 cups of café", ["a", "b", "c", "d"], 0)]
    write_examples(tmp_path / "hs.jsonl", examples)
    out = tmp_path / "out"
    argv = [
        "--hellaswag=True",
        f"--hellaswag_data={tmp_path / 'hs.jsonl'}",
        "--eval_at_start=False",
    ]
    with pytest.raises(SystemExit) as stop:
        train.main(tiny_run(data_root, out, *argv, max_iters=2))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    # the characters missing from the vocabulary, found another way than the check's
    vocabulary = set(load_meta(os.path.join(data_root, "shakespeare_char"))["tokenizer"]["chars"])
    missing = sorted(set("[header] 2 cups of café") - vocabulary)
    assert missing and f"hold {len(missing)} characters" in lines[0]
    assert f"({''.join(missing)!r})" in lines[0]
    assert not out.exists()


def test_train_logs_hellaswag_at_every_evaluation(tmp_path, data_root):
    import train

    write_examples(tmp_path / "hs.jsonl", EXAMPLES)
    out = tmp_path / "out"
    hellaswag_data = f"--hellaswag_data={tmp_path / 'hs.jsonl'}"
    keys = dict(n_layer=1, batch_size=4, max_iters=2, eval_interval=1, eval_iters=1)
    train.main(tiny_run(data_root, out, "--hellaswag=True", hellaswag_data, **keys))
    log = read_evaluations(out)
    assert [r["iter"] for r in log] == [0, 1, 2]
    for r in log:
        assert r["hellaswag_acc_norm"] in (0, 1 / 3, 2 / 3, 1)
        assert r["hellaswag_acc"] in (0, 1 / 3, 2 / 3, 1)


def test_a_stop_signal_ends_the_scoring_between_two_examples(
    tmp_path, data_root, monkeypatch, capsys
):
    import train

    write_examples(tmp_path / "hs.jsonl", EXAMPLES)
    out = tmp_path / "out"
    hellaswag_data = f"--hellaswag_data={tmp_path / 'hs.jsonl'}"
    keys = dict(n_layer=1, batch_size=4, max_iters=3, eval_interval=1, eval_iters=1)
    ending_losses, scored = hellaswag.ending_losses, []

    def signal_at_the_first_example_of_iter_1(*args):
        scored.append(1)
        if len(scored) == len(EXAMPLES) + 1:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this main thread
        return ending_losses(*args)

    monkeypatch.setattr(hellaswag, "ending_losses", signal_at_the_first_example_of_iter_1)
    train.main(tiny_run(data_root, out, "--hellaswag=True", hellaswag_data, **keys))
    assert "stopped by SIGTERM at iter 1; saved" in capsys.readouterr().out
    assert len(scored) == len(EXAMPLES) + 1  # no example after the signal
    assert [r["iter"] for r in read_evaluations(out)] == [0]  # iter 1's was cut short
