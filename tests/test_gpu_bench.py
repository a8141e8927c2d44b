"""bench/gpu.py, the script of the GPU figures, checked on the CPU: the FLOPs, bytes and
MFU of GPT-2 124M built on the meta device against counts done by hand; the peaks of
faked GPU names; a dry run of every part, whose main command is a real train.py run
watched from outside, its figures checked against its own log and output; the page and
the JSON from a recorded result; a run or a part killed at its budget with what it
started; and the command line without CUDA and with bad options."""

import json
import os
import subprocess
import sys
import time
import types
from statistics import median

import pytest
import torch
from conftest import child_env

from bench import common, decode, gpu, smoke_gpu
from model import GPT, GPTConfig
from support import cli, mfu
from support.run_log import is_evaluation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(gpu.__file__)))

# GPT-2 124M counted by hand. A block: two LayerNorms (gain and bias), the attention's
# query-key-value and output projections, the MLP's two matrices, each with its bias.
L, D, V, T = 12, 768, 50257, 1024
BLOCK = 2 * 2 * D + (D * 3 * D + 3 * D) + (D * D + D) + (D * 4 * D + 4 * D) + (4 * D * D + D)
# token and position embeddings, the blocks, the final LayerNorm; the head is tied to wte
GPT2_PARAMS = V * D + T * D + L * BLOCK + 2 * D
NON_EMBEDDING = GPT2_PARAMS - T * D  # less the position embedding, as nanoGPT counts


def gpt2_on_meta(vocab_size=V, dtype=torch.float32):
    with torch.device("meta"):
        shape = dict(common.GPT2_124M, vocab_size=vocab_size)
        return GPT(GPTConfig(dropout=0.0, bias=True, **shape)).to(dtype)


# -----------------------------------------------------------------------------
# The arithmetic, on the meta device


def test_gpt2_flops_per_token_match_the_count_by_hand():
    model = gpt2_on_meta()
    assert GPT2_PARAMS == 124_439_808  # GPT-2 124M's published parameter count
    assert model.num_params() == GPT2_PARAMS
    # 6 FLOPs per parameter and token, plus the attention scores: 12 L d T
    assert mfu.flops_per_token(model) == 6 * NON_EMBEDDING + 12 * L * D * T == 855_166_464
    # the padded vocabulary of part b adds 47 rows of 768 to the tied embedding
    padded = gpt2_on_meta(gpu.GPT2_TRAIN["vocab_size"])
    assert mfu.flops_per_token(padded) == 855_166_464 + 6 * 47 * D


def test_bytes_read_per_decoded_token_match_the_count_by_hand():
    model = gpt2_on_meta(dtype=torch.bfloat16)
    weights, cache = decode.decode_bytes(model, 1023)
    assert weights == NON_EMBEDDING * 2 == 247_306_752  # 2 bytes a bf16 parameter
    # keys and values, 12 layers of 768, 2 bytes each, for 512 positions on average
    assert cache == 2 * L * D * 2 * 512 == 18_874_368
    # an H100 SXM's 3.35 TB/s over 266,181,120 bytes a token
    assert mfu.peak_bandwidth("NVIDIA H100 80GB HBM3") / (weights + cache) == pytest.approx(
        12_585.4155, rel=1e-8
    )
    assert decode.decode_bytes(gpt2_on_meta(), 0) == (NON_EMBEDDING * 4, 2 * L * D * 4 * 0.5)


def test_mfu_matches_the_arithmetic_by_hand(fake_gpu):
    # 855,166,464 FLOPs x 12,288 tokens = 10,508,285,509,632 FLOPs a step; in 30 ms on
    # 989 TFLOP/s that is 0.354172...
    assert mfu.mfu(855_166_464, 12 * 1024, 0.030, 989e12) == pytest.approx(0.3541720765)
    assert mfu.estimate_mfu(gpt2_on_meta(), 12 * 1024, 0.030) == pytest.approx(0.3541720765)
    fake_gpu.name = "NVIDIA GeForce RTX 4090"
    assert mfu.estimate_mfu(gpt2_on_meta(), 12 * 1024, 0.030) is None


# -----------------------------------------------------------------------------
# Faked GPUs: the peaks by name


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU whose name the test sets: what torch.cuda says of it."""
    gpu_ = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: gpu_.name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda d=None: types.SimpleNamespace(total_memory=80 * 2**30),
    )
    return gpu_


@pytest.mark.parametrize(
    "name, flops, bandwidth",
    [
        ("NVIDIA H100 80GB HBM3", 989e12, 3.35e12),  # SXM
        ("NVIDIA H100 PCIe", 756e12, 2.0e12),
        ("NVIDIA H100 NVL", 835e12, 3.9e12),
        ("NVIDIA H200", 989e12, 4.8e12),
        ("NVIDIA H200 NVL", 835e12, 4.8e12),
        ("NVIDIA GH200 480GB", 989e12, 4.0e12),  # not the H200's 4.8 TB/s its name holds
        ("NVIDIA A100-SXM4-80GB", 312e12, 2.039e12),
        ("NVIDIA A100-SXM4-40GB", 312e12, 1.555e12),
        ("NVIDIA A100 80GB PCIe", 312e12, 1.935e12),
        ("NVIDIA L40S", 362e12, 864e9),
        ("NVIDIA L40", 181e12, 864e9),  # not the L4's
        ("NVIDIA L4", 121e12, 300e9),
        ("NVIDIA A10", 125e12, 600e9),
        ("NVIDIA GeForce RTX 4090", None, None),
        ("Tesla V100-SXM2-16GB", None, None),
    ],
)
def test_the_device_and_its_peaks(fake_gpu, name, flops, bandwidth):
    fake_gpu.name = name
    d = gpu.device_info(dry_run=False)
    assert (d["name"], d["peak_flops"], d["peak_bandwidth"]) == (name, flops, bandwidth)
    assert d["capability"] == "9.0" and d["memory_bytes"] == 80 * 2**30
    text = gpu.device_text(d)
    if flops is None:
        assert "bf16 peak unknown" in text and "memory bandwidth peak unknown" in text
    else:
        assert f"bf16 peak {flops / 1e12:,.0f} TFLOP/s" in text
        assert f"memory bandwidth {bandwidth / 1e12:.2f} TB/s" in text


def test_a_gpu_of_unknown_peak_says_so_on_the_page(fake_gpu, tmp_path):
    fake_gpu.name = "NVIDIA GeForce RTX 4090"
    result = recorded(gpu.device_info(dry_run=False))
    result["parts"]["gpt2"]["mfu"] = None
    result["parts"]["decode"]["limit_tokens_per_s"] = None
    for path in ("eager", "compiled"):
        result["parts"]["decode"][path]["fraction_of_limit"] = None
    result["goals"] = gpu.goals(result)
    text = gpu.page(result)
    assert "bf16 peak unknown, memory bandwidth peak unknown" in text
    assert "| GPT-2 124M training at >= 50% MFU | peak unknown | not judged |" in text
    assert "| 31.2 | 393,846 | peak unknown |" in text
    assert "| compiled | 5,012 | peak unknown |" in text
    assert "here unknown (peak unknown)" in text


# -----------------------------------------------------------------------------
# A dry run: every part for real at toy size, the main command watched as on a GPU


@pytest.fixture(scope="module")
def dry_run(data_root, tmp_path_factory):
    """python -m bench.gpu --dry_run=True: (its process, its --work folder, its result,
    docs/gpu.md as it was before)."""
    work = tmp_path_factory.mktemp("dry") / "work"
    with open(os.path.join(REPO, "docs", "gpu.md")) as f:
        page_of_record = f.read()
    proc = bench_gpu(
        REPO, "--dry_run=True", f"--work={work}", f"--data_root={data_root}", timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    with open(work / "gpu.json") as f:
        return proc, work, json.load(f), page_of_record


def test_a_dry_run_goes_through_every_part(dry_run):
    proc, work, result, page_of_record = dry_run
    lines = proc.stdout.splitlines()
    titles = [title for _, title, _ in gpu.PARTS]
    assert [line.split(":")[0] for line in lines if line.startswith(tuple(titles))] == titles
    parts = result["parts"]
    assert [parts[key]["status"] for key in ("train", "gpt2", "decode", "smoke")] == ["ok"] * 4
    assert result["dry_run"] and result["device"]["type"] == "cpu"
    # parts b and c, each from its own process
    assert parts["gpt2"]["tokens_per_s"] > 0 and parts["gpt2"]["mfu"] is None
    assert parts["decode"]["eager"]["tokens_per_s"] > 0 and parts["decode"]["compiled"] is None
    assert parts["smoke"]["skipped"] == len(parts["smoke"]["steps"]) > 0
    with open(work / "gpu.md") as f:
        text = f.read()
    assert text.startswith("# GPU figures\n\n**A dry run on the CPU**")
    assert f"{parts['train']['whole_val_loss']:.4f}" in text
    assert f"{parts['gpt2']['tokens_per_s']:,.0f}" in text
    # a dry run writes its page into --work, never over the page of record
    with open(os.path.join(REPO, "docs", "gpu.md")) as f:
        assert f.read() == page_of_record


def test_the_figures_of_a_real_run(dry_run):
    _, work, result, _ = dry_run
    fig = result["parts"]["train"]
    records, skipped = gpu.read_log(str(work / "train"))
    evaluations = [r for r in records if is_evaluation(r)]
    steps = [r for r in records if not is_evaluation(r)]
    assert skipped == 0 and len(evaluations) >= 3
    # every evaluation of the log on the curve, each timestamped in order, and every step
    assert [(p["iter"], p["val_loss"], p["train_loss"]) for p in fig["curve"]] == [
        (r["iter"], r["val_loss"], r["train_loss"]) for r in evaluations
    ]
    times = [p["wall_s"] for p in fig["curve"]]
    assert times == sorted(times) and 0 < times[0] and times[-1] <= fig["wall_s"]
    assert fig["step_records"] == len(steps) and fig["iters"] == records[-1]["iter"]
    assert fig["whole_val_loss"] == evaluations[-1]["val_loss_full"]
    assert fig["whole_val_wall_s"] == times[-1]
    # the first step record's rate holds the compiling; the median of the others
    assert fig["tokens_per_s"] == median(r["tok_per_s"] for r in steps[1:])
    assert fig["tokens_per_s_run"] == pytest.approx(
        evaluations[-1]["tokens"] / evaluations[-1]["elapsed_s"]
    )
    assert fig["mfu"] is None  # a CPU has no peak
    with open(work / "train.log") as f:
        text = f.read()
    assert f"{fig['parameters_m']}M parameters" in text
    assert fig["device_and_dtype"] == "cpu, float32" and f"({fig['ms_per_iter']} ms/iter)" in text
    # no evaluation before the first step (config/shakespeare.py: eval_at_start=False)
    assert fig["first_step_wall_s"] <= fig["first_evaluation_wall_s"] <= fig["wall_s"]


def test_the_time_to_a_target_the_run_reaches_and_one_it_does_not(dry_run):
    _, _, result, _ = dry_run
    train = result["parts"]["train"]
    curve = train["curve"]
    assert train["reached"] is None  # a toy model in 30 iters: far from 1.47
    assert curve[0]["val_loss"] > curve[1]["val_loss"]  # the second is the first this low
    reached = gpu.time_to_target(curve, curve[1]["val_loss"])
    # the log is polled: two evaluations written between two polls share a time
    assert reached == curve[1] and reached["wall_s"] >= curve[0]["wall_s"]
    below = min(p["val_loss"] for p in curve) - 0.5
    assert gpu.time_to_target(curve, below) is None
    rec = dict(train, target=below, reached=None)
    assert "not reached" in gpu.summary("train", rec)
    result = recorded(RECORDED_DEVICE)
    result["parts"]["train"] = rec
    result["goals"] = gpu.goals(result)
    text = gpu.page(result)
    assert f"| wall time to the first val estimate <= {below} | not reached |" in text
    assert f"the val estimate never reached {below}: not reached" in text


def test_a_run_out_of_time_is_stopped_with_what_it_started(tmp_path):
    # a child that starts a grandchild, as train.py starts compile workers
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    code, stdout, text = smoke_gpu.run_command([sys.executable, "-c", script], 3)
    assert code is None and "timed out after 3 s" in text
    assert time.monotonic() - t0 < 30
    grandchild = int(stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild)


def test_a_watched_run_out_of_time_is_stopped(tmp_path):
    # a run that writes one evaluation and then hangs
    record = json.dumps(dict(iter=0, val_loss=4.0, train_loss=4.0))
    script = (
        "import os, sys, time\n"
        "os.makedirs(sys.argv[1], exist_ok=True)\n"
        f"open(os.path.join(sys.argv[1], 'log.jsonl'), 'w').write({record!r} + '\\n')\n"
        "time.sleep(60)\n"
    )
    out_dir = str(tmp_path / "run")
    lines = []
    t0 = time.monotonic()
    code, wall, seen = gpu.watch(
        [sys.executable, "-c", script, out_dir], out_dir, str(tmp_path / "out"), 2, log=lines.append
    )
    assert code is None and 2 < wall < 30 and time.monotonic() - t0 < 30
    assert [r for _, r in seen] == [json.loads(record)] and seen[0][0] <= wall
    assert lines == [f"   iter 0: val loss 4.0000, {seen[0][0]:.1f} s"]


def alive(pid):
    """Whether pid is a running process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_part_without_time_left_is_not_started(monkeypatch, tmp_path):
    cfg = gpu.Settings(budget=5, page=str(tmp_path / "gpu.md"), figures=str(tmp_path / "gpu.json"))
    cfg = gpu.dataclasses.replace(cfg, work=str(tmp_path))
    result = recorded(RECORDED_DEVICE)
    result["parts"] = {}
    lines = []
    gpu.run_parts(cfg, result, lines.append)
    assert [result["parts"][key]["status"] for key, _, _ in gpu.PARTS] == ["not run"] * 4
    assert lines[0] == "a. The main command: NOT RUN: no time left (0 s)"
    with open(tmp_path / "gpu.json") as f:
        assert json.load(f)["parts"]["smoke"]["error"] == "no time left"
    with open(tmp_path / "gpu.md") as f:
        assert "Not measured: not run, no time left." in f.read()


def test_the_compile_cache_starts_empty_unless_kept(tmp_path, monkeypatch):
    # put back afterwards whatever the variables held
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "before")
    monkeypatch.setenv("TRITON_CACHE_DIR", "before")
    cache = tmp_path / "inductor"
    cache.mkdir()
    (cache / "graph").write_text("compiled")
    assert gpu.fresh_cache(str(tmp_path), keep=True).startswith("warm")
    assert (cache / "graph").exists()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert os.environ["TRITON_CACHE_DIR"] == str(cache / "triton")
    assert gpu.fresh_cache(str(tmp_path), keep=False) == "cold"
    assert not cache.exists()


# -----------------------------------------------------------------------------
# The page and the JSON, from a recorded result

RECORDED_DEVICE = dict(
    torch="2.13.0+cu128",
    cuda="12.8",
    python="3.11.7",
    type="cuda",
    name="NVIDIA H100 80GB HBM3",
    capability="9.0",
    memory_bytes=85_045_460_992,
    peak_flops=989e12,
    peak_bandwidth=3.35e12,
)


def recorded(device):
    """A result as a GPU run records it (the figures made up, the shapes GPT-2 124M's)."""
    curve = [
        dict(iter=250, wall_s=48.02, val_loss=1.9953, train_loss=1.9812, training_s=19.43),
        dict(iter=500, wall_s=55.61, val_loss=1.4687, train_loss=1.3921, training_s=25.1),
        dict(iter=750, wall_s=63.9, val_loss=1.4702, train_loss=1.2518, training_s=30.77),
    ]
    train = dict(
        command="python train.py config/shakespeare.py --out_dir=/w/out-gpu/train",
        returncode=0,
        wall_s=66.25,
        whole_val_loss=1.4612,
        whole_val_wall_s=63.9,
        target=1.47,
        reached=curve[1],
        iters=750,
        first_evaluation_wall_s=48.02,
        first_step_wall_s=44.8,
        tokens_per_s=1_234_567.8,
        tokens_per_s_run=399_123.4,
        mfu=0.1234,
        step_records=75,
        ms_per_iter=41.0,
        device_and_dtype="cuda:0, bfloat16",
        parameters_m=10.65,
        curve=curve,
        status="ok",
        error=None,
        log="/w/out-gpu/train.log",
        seconds=67.1,
    )
    gpt2 = dict(
        model=gpu.GPT2_TRAIN,
        parameters=124_475_904,
        batch=12,
        tokens_per_step=12288,
        compiled=True,
        autocast="bf16",
        first_step_s=38.2,
        warmup_steps=10,
        repeats=10,
        steps_per_repeat=10,
        ms_per_step=31.2,
        tokens_per_s=393_846.2,
        flops_per_token=855_383_040,
        mfu=0.3406,
        samples_ms=[31.2] * 10,
        status="ok",
        error=None,
        log="/w/out-gpu/gpt2.log",
        seconds=52.0,
    )
    weights, cache = 247_306_752, 18_874_368.0
    limit = 3.35e12 / (weights + cache)
    decode_ = dict(
        model="GPT-2 124M",
        dtype="bfloat16",
        batch=1,
        new_tokens=1023,
        compile_s=27.4,
        weight_bytes=weights,
        mean_cache_bytes=cache,
        peak_bandwidth=3.35e12,
        limit_tokens_per_s=limit,
        compiled=dict(tokens_per_s=5012.3, fraction_of_limit=5012.3 / limit, samples_s=[0.2]),
        eager=dict(tokens_per_s=211.9, fraction_of_limit=211.9 / limit, samples_s=[4.8]),
        status="ok",
        error=None,
        log="/w/out-gpu/decode.log",
        seconds=61.0,
    )
    steps = [
        dict(name="cuda tests", ok=True, seconds=71.0, figures={}, error=None),
        dict(
            name="train 20 iters",
            ok=True,
            seconds=24.0,
            figures={"best_val_loss": 3.1, "ms_per_iter": 9.5},
            error=None,
        ),
        dict(name="sample", ok=False, seconds=6.0, figures={}, error="error: no | pipe"),
        dict(
            name="bench --quick",
            ok=False,
            skipped=True,
            seconds=0.0,
            figures={},
            error="not run: no time left",
        ),
    ]
    smoke = dict(
        status="failed",
        error="1 of 4 failed",
        log="/w/out-gpu/smoke",
        ok=2,
        failed=1,
        skipped=1,
        steps=steps,
        seconds=101.0,
    )
    result = dict(
        command="python -m bench.gpu",
        date="2026-11-30T10:00:00+00:00",
        device=device,
        dry_run=False,
        budget_s=450.0,
        compile_cache="cold",
        seconds=281.1,
        parts=dict(train=train, gpt2=gpt2, decode=decode_, smoke=smoke),
    )
    result["goals"] = gpu.goals(result)
    return result


def test_the_page_and_the_json_hold_every_figure(tmp_path):
    result = recorded(RECORDED_DEVICE)
    md, js = str(tmp_path / "gpu.md"), str(tmp_path / "gpu.json")
    gpu.write_report(result, md, js)
    with open(js) as f:
        assert json.load(f) == json.loads(json.dumps(result))
    with open(md) as f:
        text = f.read()
    assert sorted(os.listdir(tmp_path)) == ["gpu.json", "gpu.md"]  # no temporary file left
    for shown in [
        # the device, the versions, the date
        "NVIDIA H100 80GB HBM3 (compute capability 9.0, 79 GiB); bf16 peak 989 TFLOP/s, "
        "memory bandwidth 3.35 TB/s",
        "torch 2.13.0+cu128, CUDA 12.8",
        "2026-11-30T10:00:00+00:00",
        # the goals beside the figures
        "| whole-val loss <= 1.47 within 30 s of wall time, compile included (python "
        "train.py config/shakespeare.py) | 1.4612 at 63.9 s; the val estimate first <= "
        "1.47 at 55.6 s (iter 500, 1.4687) | NOT met |",
        "| GPT-2 124M training at >= 50% MFU | 34.1% MFU | NOT met |",
        # a
        "| whole-val loss (the final evaluation, every val token) | 1.4612 |",
        "| wall time to the whole-val loss | 63.9 s |",
        "| wall time to the first val estimate <= 1.47 | 55.6 s (iter 500) |",
        "| wall time to the first step record (start-up, data, compiling the step included) "
        "| 44.8 s |",
        "| wall time to the first evaluation | 48.0 s |",
        "| tokens/s (median of 74 step records, the first left out) | 1,234,568 |",
        "| tokens/s over the seconds of training (compile included, evaluations not) | 399,123 |",
        "| MFU (median of the step records) | 12.3% |",
        "| parameters, device and dtype | 10.65M, cuda:0, bfloat16 |",
        "| 250 | 48.0 | 1.9953 | 1.9812 | 19.4 s |",
        "| 750 | 63.9 | 1.4702 | 1.2518 | 30.8 s |",
        # b
        "vocabulary 50,304 (124,475,904 parameters), batch 12 x 1024, bf16 autocast, "
        "torch.compile (default mode)",
        "took 38.2 s. MFU: 855,383,040 FLOPs per token",
        "| 31.2 | 393,846 | 34.1% |",
        # c
        "247.3 MB of weights",
        "18.9 MB of keys and values on average; here 12,585 tokens/s = 3.35 TB/s / 266.2 MB",
        "| eager | 212 | 1.7% |",
        "| compiled | 5,012 | 39.8% |",
        "Compiling the decode step took 27.4 s.",
        # d
        "2 ok, 1 failed, 1 not run",
        "| cuda tests | ok | 71 |  |",
        "| train 20 iters | ok | 24 | best_val_loss 3.1, ms_per_iter 9.5 |",
        "| sample | FAIL | 6 | error: no / pipe |",
        "| bench --quick | not run | 0 | not run: no time left |",
    ]:
        assert shown in text, shown
    assert "dry run" not in text


def test_a_part_cut_short_keeps_its_figures_and_says_why(tmp_path):
    result = recorded(RECORDED_DEVICE)
    train = result["parts"]["train"]
    train.update(status="timed out", error="stopped after 270 s", returncode=None)
    train.update(whole_val_loss=None, whole_val_wall_s=None)
    result["parts"]["decode"] = dict(
        status="failed", error="RuntimeError: CUDA error", log="/w/decode.log", seconds=3.0
    )
    result["goals"] = gpu.goals(result)
    text = gpu.page(result)
    assert "in a fresh out_dir, timed out: stopped after 270 s (exit code None" in text
    assert "| 500 | 55.6 | 1.4687 |" in text  # the curve measured before the cut
    assert "| whole-val loss (the final evaluation, every val token) | none in the log |" in text
    assert "| not measured (timed out) | not judged |" in text
    assert "Not measured: failed, RuntimeError: CUDA error (its output: /w/decode.log)." in text
    line = gpu.summary("train", train)
    assert line.startswith("TIMED OUT (stopped after 270 s); no whole-val loss;")
    assert gpu.summary("decode", result["parts"]["decode"]) == "FAILED: RuntimeError: CUDA error"


# -----------------------------------------------------------------------------
# The command line


def bench_gpu(cwd, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "bench.gpu", *args],
        cwd=cwd,
        env=dict(child_env(), PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_cuda_it_says_so_and_writes_nothing(tmp_path):
    proc = bench_gpu(tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert len(proc.stdout.splitlines()) == 1 and "no CUDA GPU" in proc.stdout
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget=0"], "--budget must be a number of seconds above 0"),
        (["--part=smoke", "--record=x.json"], "--part must be one of gpt2, decode"),
        (["--part=gpt2"], "--part needs --record=PATH"),
        (["--budjet=9"], "did you mean 'budget'"),
        # a folder that takes no file, met only at the end of the first part's minutes
        (["--dry_run=True", "--page=/proc/gpu.md"], "cannot write into /proc"),
        (["--dry_run=True", "--out_dir=/proc"], "; pass --out_dir=DIR"),
    ],
)
def test_bad_options_are_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert cli.run(gpu.main, args, gpu.__doc__, gpu.Settings) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1 and os.listdir(tmp_path) == []
