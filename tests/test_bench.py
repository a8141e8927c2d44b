"""The benchmarks keep running: `python -m bench --quick` end to end, checked for
structure and for the figures that have an exact answer (byte counts), never for
speed; each benchmark module alone; the recipe and long-context parts on small
shapes."""

import ast
import json
import os
import runpy
import statistics
import subprocess
import sys

import pytest
import torch

from bench import attention, common, long_context, recipes
from model import GPT, GPTConfig


def run_bench(repo_root, *args, timeout=240, module="bench"):
    # one thread: on a busy machine, OpenMP threads waiting on each other make the
    # run many times slower, and this test checks structure, not speed
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def quick(repo_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = run_bench(repo_root, "--quick", "--device=cpu", f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out) as f:
        result = json.load(f)
    assert result["command"] == f"python -m bench --quick --device=cpu --out={out}"
    return result, proc.stdout


def positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def test_header(quick):
    result, _ = quick
    assert result["device"]["type"] == "cpu" and result["device"]["name"]
    assert result["torch"] == torch.__version__
    assert result["quick"] is True
    assert "T" in result["date"]  # ISO 8601


def test_train_section(quick):
    result, stdout = quick
    rows = {r["name"]: r for r in result["train"]}
    # GPT-2 124M training is too slow for --quick on a CPU
    assert set(rows) == {"nanoGPT CPU settings", "baby model"}
    nano = rows["nanoGPT CPU settings"]
    assert nano["model"] == dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65)
    assert nano["batch"] == 12 and nano["tokens_per_step"] == 12 * 64
    assert rows["baby model"]["batch"] == 1  # --quick on a CPU: one sequence a step
    for r in rows.values():
        assert r["max_logit_diff_vs_hf"] < 1e-3  # same weights, same function
        for key in ("ours", "hf", "hf_fused_gelu"):
            fig = r[key]
            assert positive(fig["ms_per_step"]) and positive(fig["tokens_per_s"])
            assert len(fig["samples_ms"]) == r["repeats"]
            assert fig["ms_per_step"] == pytest.approx(statistics.median(fig["samples_ms"]))
            assert fig["tokens_per_s"] == pytest.approx(
                r["tokens_per_step"] / fig["ms_per_step"] * 1e3
            )
        assert r["hf_over_ours"] == pytest.approx(r["hf"]["ms_per_step"] / r["ours"]["ms_per_step"])
    assert "## Training step" in stdout and "| nanoGPT CPU settings | 12 x 64 |" in stdout


def test_generate_section(quick):
    result, stdout = quick
    rows = result["generate"]
    assert [r["batch"] for r in rows] == [1, 8]
    for r in rows:
        assert r["greedy_tokens_agree"] >= 1
        for key in ("ours_cache", "ours_nocache", "hf"):
            assert positive(r[key]["tokens_per_s"]) and positive(r[key]["s"])
            assert r[key]["tokens_per_s"] == pytest.approx(
                r["batch"] * r["new_tokens"] / r[key]["s"]
            )
        # keys and values of 6 layers, batch x 6 heads x 256 positions x 64 floats, 4 bytes each
        assert r["kv_cache_bytes"] == 2 * 6 * r["batch"] * 6 * 256 * 64 * 4
        assert r["peak_rss_bytes"] > 10 * 2**20
    assert "## Generation" in stdout


def test_attention_section(quick):
    result, stdout = quick
    rows = result["attention"]
    assert [r["T"] for r in rows] == [64, 128, 256, 512]
    for r in rows:
        assert r["weights_bytes"] == 1 * 12 * r["T"] * r["T"] * 4  # float32 (B, nh, T, T)
        assert positive(r["explicit"]["ms"]) and positive(r["sdpa"]["ms"])
        assert r["max_abs_diff"] < 1e-4
        for path in ("explicit", "sdpa"):  # against a float64 reference, in float32 ulps
            assert 0 <= r[path]["error_ulps"] <= attention.ATTENTION_TOLERANCE_ULPS
    assert "| 512 |" in stdout


def test_targets_listed(quick):
    result, stdout = quick
    names = [t["target"] for t in result["targets"]]
    assert len(names) == 5 and any("nanoGPT CPU settings" in n for n in names)
    for t in result["targets"]:
        assert (
            positive(t["measured"]) and t["met"] is None
        )  # --quick stops short of the full context
    assert "## Targets" in stdout


def test_converted_weights_give_hugging_face_the_same_logits():
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    ours = GPT(
        GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
    ).eval()
    hf = common.to_hf(ours).eval()
    assert isinstance(hf, GPT2LMHeadModel) and hf.config._attn_implementation == "sdpa"
    idx = torch.randint(0, 37, (2, 16))
    with torch.no_grad():
        assert torch.allclose(ours(idx)[0], hf(input_ids=idx).logits, atol=1e-5)
    # a converted copy, not shared storage: training one must not move the other
    assert (
        hf.transformer.h[0].attn.c_attn.weight.data_ptr()
        != ours.transformer.h[0].attn.c_attn.weight.data_ptr()
    )


def test_alternate_rotates_the_order():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = common.alternate(fns, repeats=3, calls=2, device="cpu")
    assert calls == list("aabbccbbccaaccaabb")
    assert all(len(ts) == 3 and all(t >= 0 for t in ts) for ts in times.values())


@pytest.mark.parametrize(
    "args,message",
    [
        (["--device=tpu"], "--device must be cpu or cuda"),
        (["--quik"], "did you mean 'quick'"),
        (["extra.py"], "unexpected argument"),
        (["--out=/nonexistent-folder/bench.json"], "pass --out="),
        (["--threads=-1"], "--threads must be 0"),
        # a billion OpenMP threads killed the process without a word
        (["--threads=1e9"], "(this machine's cores)"),
    ],
)
def test_bad_arguments_are_one_line_errors(repo_root, args, message):
    proc = run_bench(repo_root, *args, timeout=60)
    assert proc.returncode == 2  # bad input, as in every command
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_says_what_to_do(repo_root):
    proc = run_bench(repo_root, "--device=cuda", timeout=60)
    assert proc.returncode == 2 and "--device=cpu" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_help(repo_root):
    proc = run_bench(repo_root, "--help", timeout=60)
    assert (
        proc.returncode == 0 and "--quick=False" in proc.stdout and "--device='cpu'" in proc.stdout
    )


MODULES = ["train_step", "generate", "attention", "decode", "recipes", "long_context"]


def run_module(name, argv, monkeypatch):
    """`python -m bench.NAME argv` in this process (its __main__ block run as the
    command line runs it): the exit code."""
    monkeypatch.setattr(sys, "argv", [f"bench/{name}.py", *argv])
    # runpy runs a fresh copy; the one this file imported comes back afterwards
    monkeypatch.delitem(sys.modules, f"bench.{name}", raising=False)
    with pytest.raises(SystemExit) as stop:
        runpy.run_module(f"bench.{name}", run_name="__main__")
    return stop.value.code


@pytest.mark.parametrize("name", MODULES)
def test_each_benchmark_has_its_own_help(name, monkeypatch, capsys):
    assert run_module(name, ["--help"], monkeypatch) == 0
    out = capsys.readouterr().out
    assert f"python -m bench.{name}" in out and "--out='bench.json'" in out
    assert ("--compile=False" in out) == (name == "train_step")
    assert ("--nanogpt=''" in out) == (name == "recipes")


def test_decode_alone_on_a_cpu_says_what_to_do(monkeypatch, capsys):
    assert run_module("decode", [], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.decode: ") and "--device=cuda" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("long_context", ["--long_context_part=both"], "is all, attention or cache"),
        # os.access says yes to root in /proc, where no file can be made
        ("attention", ["--out=/proc/bench.json"], "pass --out=PATH somewhere writable"),
        ("attention", ["--out="], "--out is the JSON file to write"),
        ("__main__", ["--long_context_part=cache"], "add --long_context"),
        ("__main__", ["--nanogpt=../nanoGPT"], "add --recipes"),
        ("__main__", ["--recipes", "--long_context"], "give one"),
    ],
)
def test_a_benchmarks_own_bad_option_is_bad_input(name, argv, message, monkeypatch, capsys):
    assert run_module(name, argv, monkeypatch) == 2  # before any measuring
    err = capsys.readouterr().err
    prog = "bench" if name == "__main__" else f"bench.{name}"
    assert err.startswith(f"{prog}: ") and message in err
    assert len(err.strip().splitlines()) == 1


# Each command of bench/ and experiments/ run as a file, its --help: Python puts the
# file's own folder on sys.path, not the repository, and `python bench/gpu.py` failed
# with ModuleNotFoundError (27 of 28 did). One process for all, torch loaded once: before
# each, the repository leaves sys.path and the project's modules leave sys.modules, so
# that each file must find them itself.
BY_PATH = """
import contextlib, io, json, os, runpy, sys
root, paths = sys.argv[1], sys.argv[2:]
ours = ("model", "train", "support", "data", "bench", "experiments", "explorer", "heads")
answers = {}
for path in paths:
    for name in [name for name in sys.modules if name.split(".")[0] in ours]:
        del sys.modules[name]
    sys.path[:] = [entry for entry in sys.path if entry not in ("", root)]
    sys.path.insert(0, os.path.dirname(path))
    sys.argv = [path, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code
    except Exception as e:
        code = repr(e)
    answers[os.path.relpath(path, root)] = [code, out.getvalue()]
print(json.dumps(answers))
"""


def commands_in(repo_root, folder):
    names = sorted(os.listdir(os.path.join(repo_root, folder)))
    paths = [os.path.join(repo_root, folder, name) for name in names if name.endswith(".py")]
    return [path for path in paths if 'if __name__ == "__main__":' in open(path).read()]


def test_each_bench_and_experiment_runs_by_its_path_with_its_help(repo_root, tmp_path):
    paths = commands_in(repo_root, "bench") + commands_in(repo_root, "experiments")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", BY_PATH, repo_root, *paths],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    answers = json.loads(proc.stdout.splitlines()[-1])
    assert len(answers) == len(paths) >= 28
    for path, (code, out) in answers.items():
        # the command's docstring, not a part run, not a traceback
        assert code in (0, None), f"{path}: {code}"
        doc = ast.get_docstring(ast.parse(open(os.path.join(repo_root, path)).read()))
        # its first words (argparse, bench/holdout.py's, wraps them anew)
        assert " ".join(doc.split()[:8]) in " ".join(out.split()), path


@pytest.mark.parametrize("threads", ["0", "-1", "1e9"])
def test_the_explorer_bench_takes_threads_from_one_to_the_cores(threads, monkeypatch, capsys):
    # 0 and -1 reached torch.set_num_threads, a traceback; a billion, OpenMP's abort
    assert run_module("explore", [f"--threads={threads}"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --threads must be 1 to ") and "(this machine's cores)" in err
    assert len(err.strip().splitlines()) == 1


def test_a_benchmark_runs_alone(repo_root, tmp_path):
    """`python -m bench.attention` measures attention and nothing else, with the
    same header, table and JSON as in the whole run."""
    out = tmp_path / "attention.json"
    proc = run_bench(repo_root, "--quick", f"--out={out}", module="bench.attention")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out) as f:
        result = json.load(f)
    assert result["command"] == f"python -m bench.attention --quick --out={out}"
    assert [r["T"] for r in result["attention"]] == [64, 128, 256, 512]
    assert "train" not in result and "generate" not in result and result["targets"] == []
    assert result["markdown"] == proc.stdout.strip()
    assert proc.stdout.startswith(result["device"]["name"])
    assert "## Attention alone" in proc.stdout and "## Targets" not in proc.stdout


def test_recipe_race_on_both_cpu_classes(tmp_path, corpus_path, monkeypatch):
    """--recipes with two tiny configs: each CPU class runs both, in order, through train.py."""
    from data.dataset import ensure_dataset

    ensure_dataset("shakespeare_char", str(tmp_path / "data"), input_path=corpus_path)
    tiny = (
        "n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 32\nbatch_size = 64\neval_iters = 2\n"
        "device = 'cpu'\ncompile = False\ngradient_accumulation_steps = 1\n"
    )
    configs = []
    for name, iters in (("slow", 6), ("fast", 3)):
        path = tmp_path / f"{name}.py"
        path.write_text(tiny + f"max_iters = {iters}\neval_interval = {iters}\n")
        configs.append((name, str(path)))
    monkeypatch.setattr(
        recipes, "cpu_classes", lambda: [("as it is", {}, []), ("capped", recipes.AVX2_CAP, [])]
    )
    rows = recipes.bench_recipes(lambda msg: None, configs, str(tmp_path / "data"))
    assert [(r["cpu"], r["recipe"], r["iters"]) for r in rows] == [
        ("as it is", "slow", 6),
        ("as it is", "fast", 3),
        ("capped", "slow", 6),
        ("capped", "fast", 3),
    ]
    assert (
        rows[0]["wall_over_classic"] == 1.0
        and rows[1]["wall_over_classic"] == rows[1]["wall_s"] / rows[0]["wall_s"]
    )
    assert (
        rows[2]["device"].startswith("cpu, float32 (")
        and "ONEDNN_MAX_CPU_ISA=AVX2" in rows[2]["device"]
    )
    classes = recipes.cpu_classes()  # the real ones: each named, the first as it is
    assert classes[0][1:] == ({}, []) and all(name for name, _, _ in classes)
    assert all(r["val_loss_full"] > 0 and r["training_s"] > 0 for r in rows)
    for r in rows:  # the phases add up to the wall time, each measured
        assert all(r[k] > 0 for k in ("startup_s", "evaluations_s", "exit_s"))
        assert (
            abs(r["startup_s"] + r["training_s"] + r["evaluations_s"] + r["exit_s"] - r["wall_s"])
            < 1e-6
        )
    targets = recipes.recipe_targets(rows)
    assert len(targets) == 2 and all(t["met"] is False for t in targets)  # 3 iters reach no 1.88
    assert "| capped | `" in recipes.recipes_table(rows)


def test_long_context_rolling_cache_figures_small(monkeypatch):
    """The rolling-cache half on a small model: its byte counts have exact answers,
    and the windowed and dense models decode the same number of tokens."""
    monkeypatch.setattr(
        long_context,
        "DECODE_SHAPE",
        dict(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=65, rope=True),
    )
    monkeypatch.setattr(long_context, "DECODE_W", 8)
    roll = long_context.bench_rolling_cache(common.Settings(quick=False), lambda msg: None)
    assert roll["tokens"] == 20 * 32 and len(roll["tokens_per_s_by_tenth"]) == 10
    assert (
        roll["cache_bytes_dense"] == 2 * 1 * 2 * 32 * 16 * 4
    )  # k and v, 1 layer, 2 heads, 32 slots, hs 16
    assert roll["cache_bytes_window"] * 32 == roll["cache_bytes_dense"] * (
        8 + long_context.DECODE_S
    )
    targets = long_context.long_context_targets([], roll, quick=False)
    assert [t["met"] for t in targets][0] is True  # the byte fraction is exact
    assert len(roll["tokens_per_s_by_tenth_median_step"]) == 10 and len(targets) == 4
    assert set(roll["step_ms"]) == {"window", "dense, S + W cached", "dense, 3/4 block_size cached"}
    table, cache = long_context.long_context_tables([], roll)
    assert "(S + W) / block_size = 0.3750" in cache


def test_long_context_attention_rows_check_the_window(monkeypatch):
    monkeypatch.setattr(long_context, "LONG_QUICK", [100, 333])
    monkeypatch.setattr(long_context, "LONG_W", 16)
    rows = long_context.bench_window_attention(common.Settings(quick=True), lambda msg: None)
    assert [r["T"] for r in rows] == [100, 333]
    assert all(r["max_abs_error"] < 1e-5 and r["attention_dense"] > 0 for r in rows)
    monkeypatch.setattr(
        long_context, "windowed_attention", lambda q, k, v, w: q
    )  # a wrong path is caught
    with pytest.raises(common.BenchError, match="explicit path"):
        long_context.bench_window_attention(common.Settings(quick=True), lambda msg: None)


def test_recipes_table_gives_nanogpt_its_estimate_and_ours_the_whole_split():
    """With --nanogpt, nanoGPT's own run reports an estimated val loss and no phases;
    the table says which loss is which and leaves the missing figures as '-'."""
    nanogpt = dict(
        cpu="as it is",
        recipe="nanoGPT itself",
        config="nanoGPT train.py",
        reference=True,
        device="cpu, float32",
        iters=2000,
        val_loss=1.8765,
        wall_s=100.0,
    )
    ours = dict(
        cpu="as it is",
        recipe="ours",
        config="config/shakespeare_cpu.py",
        reference=False,
        device="cpu, bfloat16",
        iters=500,
        val_loss_full=1.8312,
        wall_s=25.0,
        wall_over_classic=0.5,
        wall_over_nanogpt=0.25,
        startup_s=1.0,
        training_s=20.0,
        evaluations_s=3.0,
        exit_s=1.0,
    )
    lines = recipes.recipes_table([nanogpt, ours]).splitlines()
    assert lines[2] == (
        "| as it is | `nanoGPT train.py` | cpu, float32 | 2000 | 1.8765 (estimate) "
        "| - | - | - | - | 100.0 | - | - |"
    )
    assert lines[3].endswith(
        "| 1.8312 (whole split) | 1.0 | 20.0 | 3.0 | 1.0 | 25.0 | 0.50 | 0.25 |"
    )
    (target,) = recipes.recipe_targets([nanogpt, ours])
    assert target["measured"] == 0.5 and target["met"] is False  # 0.50x is over 0.30x


@pytest.mark.parametrize(
    "argv, message",
    [
        # it printed its header and exited 0, having measured nothing
        (["--parts=sped"], "--parts are speed, memory, step, comma-separated; got 'sped'"),
        # data/prepare.py failed under it, exit 1
        (["--mb=0"], "--mb and --rounds must be 1 or more, got 0 and 3"),
        # min() of nothing: a traceback after the corpus was made
        (["--rounds=-1"], "--mb and --rounds must be 1 or more, got 250 and -1"),
        (["--num_procs=1,two"], "--num_procs is whole numbers of 1 or more"),
        (["--memory_mb=0"], "--memory_mb is whole numbers of 1 or more"),
        (["--tmp=/nonexistent-folder"], "--tmp is the folder the corpora are made in"),
        (["--mb=1000000000"], "ask for less (--mb, --memory_mb) or point --tmp elsewhere"),
    ],
)
def test_corpus_bench_bad_options_are_one_line_before_any_corpus(argv, message, capsys):
    from bench import corpus

    assert corpus.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # not even the header: nothing was measured
    assert captured.err.startswith("error: ") and message in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_corpus_preparation_bench_runs_every_contender(repo_root, tmp_path):
    """`python -m bench.corpus` on a 1 MB corpus, one round: the CPU's class named,
    every contender measured on the same file, the ratios printed; an unknown key
    is one line."""
    proc = run_bench(
        repo_root,
        "--parts=speed",
        "--mb=1",
        "--rounds=1",
        f"--tmp={tmp_path}",
        module="bench.corpus",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(common.cpu_class())
    rates = {}
    for line in proc.stdout.splitlines():
        name, _, rate = line.strip().rpartition("  ")
        if name and rate.replace(",", "").isdigit():
            rates[name.strip()] = int(rate.replace(",", ""))
    contenders = [
        "ours, 1 process",
        "ours, 2 processes",
        "tiktoken batch, 1 thread",
        "tiktoken batch, 2 threads",
        "nanoGPT method, num_proc=2",
    ]
    assert sorted(rates) == sorted(contenders)
    assert all(rate > 0 for rate in rates.values())
    assert "2 processes / nanoGPT method:" in proc.stdout
    # the command timed whole, its main process's share of the CPU time named
    assert "--num_proc 2:" in proc.stdout and "the main process" in proc.stdout
    assert os.listdir(tmp_path) == []  # the corpora are deleted afterwards
    bad = run_bench(repo_root, "--mbb=1", module="bench.corpus", timeout=60)
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "error: unknown config key 'mbb'; did you mean 'mb'?"
    )
