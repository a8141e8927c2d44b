"""
The project's GPU figures, in one command of under eight minutes on one GPU, written as
gpu.md (a page) and gpu.json beside it (every figure) into --work, or into --out_dir:

    python -m bench.gpu --out_dir=docs   # from the repository root, on a machine with a GPU
    python -m bench.gpu                  # the same, its page in out-gpu/ (docs/ untouched)
    python -m bench.gpu --dry_run=True   # on a CPU: every part at toy size, to try the script

Four parts, in this order, each with a time budget (PARTS) within --budget:
  a. the main command, python train.py config/shakespeare.py, to its end in a fresh
     out_dir: the whole-val loss of its final evaluation, the wall time from the
     process's start to the first val loss <= 1.47 (compiling included: each evaluation
     is timestamped as its line reaches out_dir/log.jsonl), the val curve, and tokens/s
     from its step records
  b. GPT-2 124M training steps (bf16 autocast, torch.compile, batch 12 x 1024, fused
     AdamW, random tokens): tokens/s and MFU against the device's bf16 peak
  c. decoding GPT-2 124M at batch 1 (random weights in bf16, a 1-token prompt to the
     full context), eager and compiled (CUDA graphs): tokens/s and the fraction of the
     memory-bandwidth limit
  d. bench/smoke_gpu.py's steps, in the time left
Parts b and c run in a process of their own (python -m bench.gpu --part=...), as do
the commands of a and d, each killed at the end of its budget. Each part prints its line
when it ends and the page is written again, so a run cut short keeps what it measured.
The compile cache starts empty (the figures include compiling from cold) and the parts
after (a) share it. Without CUDA it says so and writes nothing.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import datetime
import json
import platform
import re
import shutil
import subprocess
import time
from statistics import median

import torch

from bench import common, decode, smoke_gpu, train_step
from model import GPT, GPTConfig
from support import cli
from support.configurator import ConfigError
from support.mfu import peak_bandwidth, peak_flops
from support.run_log import is_evaluation, read_log

MAIN_COMMAND = ["train.py", "config/shakespeare.py"]
DATASET = "shakespeare_char"  # config/shakespeare.py's, prepared before the clock starts
GOAL_SECONDS = 30  # the whole-val loss at or below the target within this wall time
GOAL_MFU = 0.5  # GPT-2 124M's training step
POLL_S = 0.05  # how often the training run's log is read
MIN_PART_S = 10  # a part with less time left is not started

# (key, title, the most it may take as a share of --budget: 225, 90 and 112 s of the
# default 450 s); the smoke steps take what is left
PARTS = [
    ("train", "a. The main command", 0.5),
    ("gpt2", "b. GPT-2 124M training steps", 0.2),
    ("decode", "c. Decoding GPT-2 124M, batch 1", 0.25),
    ("smoke", "d. The smoke steps", None),
]

# GPT-2 124M as nanoGPT trains it: the vocabulary padded to 50,304, a multiple of 64
GPT2_TRAIN = dict(common.GPT2_124M, vocab_size=50304)
GPT2_BATCH = 12
GPT2_COUNTS = (10, 10, 10)  # warm-up steps (the first compiles), repeats, steps per repeat
DECODE_TOKENS = common.GPT2_124M["block_size"] - 1

# the dry run: the same parts at toy size on the CPU, uncompiled
DRY_TRAIN = [
    "--device=cpu",
    "--compile=False",
    "--dtype=float32",
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=32",
    "--batch_size=8",
    "--dropout=0.0",
    "--max_iters=30",
    "--lr_decay_iters=30",
    "--warmup_iters=5",
    "--max_time=0",
    "--lr_decay_time=0",
    "--eval_interval=10",
    "--eval_iters=4",
    "--log_interval=5",
    "--eval_full_val=True",
]
DRY_SHAPE = common.NANOGPT_CPU
DRY_DECODE_TOKENS = 32


@dataclasses.dataclass
class Settings:
    budget: float = 450.0  # seconds for the four parts (each also within its share, PARTS)
    target: float = 1.47  # the val loss whose wall time part a measures
    # the folder of the page and the figures; '': --work; docs replaces the page of record
    out_dir: str = ""
    page: str = ""  # the page of the figures; '': gpu.md in --out_dir
    figures: str = ""  # every figure, machine-readable; '': gpu.json in --out_dir
    work: str = "out-gpu"  # the runs' folders, the compile cache and each part's output
    data_root: str = ""  # where the datasets are; '': data/ in this repository
    # on the CPU, every part at toy size: tries the script, measures nothing about a GPU
    dry_run: bool = False
    # reuse the compile cache a previous run left in --work (a warm start) instead of a fresh one
    warm_cache: bool = False
    # how parts b and c run, each in a process of its own: gpt2 or decode alone, its
    # record written to --record
    part: str = ""
    record: str = ""


# -----------------------------------------------------------------------------
# The machine


def device_info(dry_run):
    """The device's name, its data-sheet peaks (None where not known), and the versions."""
    info = dict(torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version())
    if dry_run:
        name = common.device_name("cpu")
        return dict(info, type="cpu", name=name, peak_flops=None, peak_bandwidth=None)
    name = torch.cuda.get_device_name()
    return dict(
        info,
        type="cuda",
        name=name,
        capability=".".join(map(str, torch.cuda.get_device_capability())),
        memory_bytes=torch.cuda.get_device_properties().total_memory,
        peak_flops=peak_flops(name),
        peak_bandwidth=peak_bandwidth(name),
    )


# -----------------------------------------------------------------------------
# a. The main command, timed from outside


def from_repo(path):
    """path as the page shows it: from the repository root when it lies inside it."""
    path = os.path.abspath(path)
    if path.startswith(REPO + os.sep):
        return os.path.relpath(path, REPO)
    return path


def train_command(work, dry_run, data_root=""):
    """(command, out_dir) of the main command in a fresh out_dir under work; the
    command runs from the repository root."""
    out_dir = from_repo(os.path.join(work, "train"))
    command = [sys.executable, *MAIN_COMMAND, f"--out_dir={out_dir}"]
    if data_root:
        command.append(f"--data_root={data_root}")
    if dry_run:
        command += DRY_TRAIN
    return command, out_dir


def watch(command, out_dir, output, timeout, poll=POLL_S, log=print):
    """Run command, a training run that writes out_dir/log.jsonl, for at most timeout
    seconds, reading the log as it grows; its output goes to the file output.
    Returns (return code or None if it ran out of time, wall seconds, seen): seen
    lists (wall seconds when the record was first read, the record), and the wall
    seconds count from just before the process starts. out_dir must hold no log yet."""
    seen = []
    t0 = time.monotonic()
    with open(output, "w") as f:
        proc = subprocess.Popen(
            command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while True:
                code = proc.poll()
                now = time.monotonic() - t0
                read_new(out_dir, seen, now, log)
                if code is not None:
                    return code, now, seen
                if now > timeout:
                    smoke_gpu.kill_group(proc)
                    proc.wait()
                    return None, now, seen
                time.sleep(poll)
        except BaseException:
            smoke_gpu.kill_group(proc)
            raise


def read_new(out_dir, seen, now, log):
    """Append to seen the records of out_dir/log.jsonl not yet in it, seen at now;
    a line for each evaluation. A log not written yet has none."""
    try:
        records, _ = read_log(out_dir)
    except OSError:
        return
    for record in records[len(seen) :]:
        seen.append((now, record))
        if is_evaluation(record):
            log(f"   iter {record['iter']}: val loss {record['val_loss']:.4f}, {now:.1f} s")


def time_to_target(curve, target):
    """The first point of the curve whose val loss is at or below target, or None."""
    return next((point for point in curve if point["val_loss"] <= target), None)


def train_figures(seen, target, text):
    """Part a's figures from what watch() saw and the run's output text."""
    evaluations = [(t, r) for t, r in seen if is_evaluation(r)]
    steps = [(t, r) for t, r in seen if not is_evaluation(r)]
    curve = [
        dict(
            iter=r["iter"],
            wall_s=round(t, 2),
            val_loss=r["val_loss"],
            train_loss=r["train_loss"],
            training_s=r.get("elapsed_s"),
        )
        for t, r in evaluations
    ]
    final = {}
    if evaluations:
        final = evaluations[-1][1]
    whole_val_wall_s = None
    if "val_loss_full" in final:
        whole_val_wall_s = round(evaluations[-1][0], 2)
    # the first step record's rate holds the first iters' compiling
    rates = [r["tok_per_s"] for _, r in steps[1:]]
    mfus = [r["mfu"] for _, r in steps[1:] if "mfu" in r]
    tokens_per_s_run = None
    if final.get("elapsed_s"):
        tokens_per_s_run = final["tokens"] / final["elapsed_s"]
    printed = smoke_gpu.figures(text)
    parameters = re.search(r"([\d.]+)M parameters", text)
    return dict(
        whole_val_loss=final.get("val_loss_full"),
        whole_val_wall_s=whole_val_wall_s,
        target=target,
        reached=time_to_target(curve, target),
        iters=final.get("iter"),
        first_evaluation_wall_s=curve[0]["wall_s"] if curve else None,
        first_step_wall_s=round(steps[0][0], 2) if steps else None,
        tokens_per_s=median(rates) if rates else None,
        tokens_per_s_run=tokens_per_s_run,
        mfu=median(mfus) if mfus else None,
        step_records=len(steps),
        ms_per_iter=printed.get("ms_per_iter"),
        device_and_dtype=printed.get("device_and_dtype"),
        parameters_m=float(parameters.group(1)) if parameters else None,
        curve=curve,
    )


def train_part(cfg, timeout, log):
    """Part a: the dataset prepared, then the main command watched to its end."""
    from data.dataset import ensure_dataset
    from data.shards import DataError

    command, out_dir = train_command(cfg.work, cfg.dry_run, cfg.data_root)
    out_dir = os.path.join(REPO, out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    output = os.path.join(cfg.work, "train.log")
    try:
        ensure_dataset(DATASET, cfg.data_root or None)
    except (DataError, OSError) as e:
        return dict(status="failed", error=f"preparing the dataset: {e}", log=None)
    code, wall_s, seen = watch(command, out_dir, output, timeout, log=log)
    with open(output, errors="replace") as f:
        text = f.read()
    rec = dict(command=" ".join(["python", *command[1:]]), returncode=code, wall_s=round(wall_s, 2))
    rec.update(train_figures(seen, cfg.target, text))
    rec.update(status="ok", error=None, log=output)
    if code is None:
        rec.update(status="timed out", error=f"stopped after {timeout:.0f} s")
    elif code != 0:
        rec.update(status="failed", error=last_line(text) or f"exit code {code}")
    elif rec["whole_val_loss"] is None:
        rec.update(error="no whole-val loss in the log (is eval_full_val off?)")
    return rec


def last_line(text):
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1] if lines else None


# -----------------------------------------------------------------------------
# b and c: measured in a process of their own


def gpt2_part(dry_run, log):
    """Part b: GPT-2 124M's compiled training step at batch 12 (halved until it fits)."""
    batch = GPT2_BATCH
    if dry_run:
        return train_step.bench_ours(DRY_SHAPE, batch, (2, 2, 2), "cpu", compiled=False)
    while True:
        log(f"gpt2: batch {batch} x {GPT2_TRAIN['block_size']} ...")
        try:
            return train_step.bench_ours(GPT2_TRAIN, batch, GPT2_COUNTS, "cuda", compiled=True)
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
        # out of the except block, so the failed attempt's tensors are freed
        torch.cuda.empty_cache()
        batch //= 2


def decode_part(dry_run, log):
    """Part c: GPT-2 124M decoding at batch 1, eager and compiled."""
    if dry_run:
        torch.manual_seed(0)
        model = GPT(GPTConfig(dropout=0.0, **DRY_SHAPE)).eval()
        return decode.bench_decode(
            model, DRY_DECODE_TOKENS, "cpu", "toy model", compiled=False, repeats=2, log=log
        )
    return decode.bench_decode(decode.gpt2_model("cuda"), DECODE_TOKENS, "cuda", log=log)


MEASURED = {"gpt2": gpt2_part, "decode": decode_part}


def child_part(cfg, timeout, log):
    """Part b or c (cfg.part) in a process of its own, killed after timeout seconds."""
    record = os.path.join(os.path.abspath(cfg.work), f"{cfg.part}.json")
    if os.path.exists(record):
        os.remove(record)
    command = [
        sys.executable,
        "-m",
        "bench.gpu",
        f"--part={cfg.part}",
        f"--record={record}",
        f"--dry_run={cfg.dry_run}",
    ]
    code, _, text = smoke_gpu.run_command(command, timeout, cwd=REPO)
    output = os.path.join(cfg.work, f"{cfg.part}.log")
    with open(output, "w") as f:
        f.write(" ".join(command) + "\n\n" + text)
    if code is None:
        return dict(status="timed out", error=f"stopped after {timeout:.0f} s", log=output)
    if code != 0:
        return dict(status="failed", error=last_line(text) or f"exit code {code}", log=output)
    if not os.path.exists(record):
        return dict(status="failed", error=f"no record written; {last_line(text)}", log=output)
    with open(record) as f:
        return dict(json.load(f), status="ok", error=None, log=output)


# -----------------------------------------------------------------------------
# d. The smoke steps


def smoke_part(cfg, timeout, log):
    """Part d: bench/smoke_gpu.py's steps until the deadline, each line as it ends."""
    out = os.path.join(cfg.work, "smoke")
    os.makedirs(out, exist_ok=True)
    if cfg.dry_run:
        records = [
            smoke_gpu.not_run(name, command, "not run: a dry run has no GPU")
            for name, command in smoke_gpu.steps(out, gpus=1)
        ]
    else:
        records = smoke_gpu.run_steps(out, time.monotonic() + timeout, log=log)
    kept = [{k: v for k, v in r.items() if k != "stdout"} for r in records]
    ok = sum(r["ok"] for r in records)
    skipped = sum(bool(r.get("skipped")) for r in records)
    failed = len(records) - ok - skipped
    status = "ok"
    error = None
    if failed:
        status = "failed"
        error = f"{failed} of {len(records)} failed"
    return dict(
        status=status, error=error, log=out, ok=ok, failed=failed, skipped=skipped, steps=kept
    )


# -----------------------------------------------------------------------------
# The run


def run_parts(cfg, result, log):
    """Each part in turn within the budget; after each, its line and the page again."""
    started = time.monotonic()
    deadline = started + cfg.budget
    for key, title, share in PARTS:
        left = deadline - time.monotonic()
        timeout = left
        if share is not None:
            timeout = min(share * cfg.budget, left)
        t0 = time.monotonic()
        if timeout < MIN_PART_S:
            rec = dict(status="not run", error="no time left", log=None)
        elif key == "train":
            rec = train_part(cfg, timeout, log)
        elif key == "smoke":
            rec = smoke_part(cfg, timeout, log)
        else:
            rec = child_part(dataclasses.replace(cfg, part=key), timeout, log)
        rec["seconds"] = round(time.monotonic() - t0, 1)
        result["parts"][key] = rec
        result["seconds"] = round(time.monotonic() - started, 1)
        result["goals"] = goals(result)
        log(f"{title}: {summary(key, rec)} ({rec['seconds']:.0f} s)")
        write_report(result, cfg.page, cfg.figures)
    return result


def start(cfg, compile_cache):
    """The result before any part: the machine, the versions, the date, the settings."""
    return dict(
        command="python -m bench.gpu" + "".join(f" {a}" for a in sys.argv[1:]),
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        device=device_info(cfg.dry_run),
        dry_run=cfg.dry_run,
        budget_s=cfg.budget,
        compile_cache=compile_cache,
        seconds=0.0,
        parts={},
        goals=[],
    )


def fresh_cache(work, keep):
    """The compile cache every part's processes share, under work: emptied first unless
    keep, so that the figures include compiling from cold. Returns 'cold' or 'warm'."""
    cache = os.path.join(os.path.abspath(work), "inductor")
    if not keep:
        shutil.rmtree(cache, ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    if os.path.isdir(cache) and os.listdir(cache):
        return "warm (kept from an earlier run by --warm_cache)"
    return "cold"


def check(cfg):
    """One line for each bad option, before any work."""
    if not cfg.budget > 0:
        raise ConfigError(f"--budget must be a number of seconds above 0, got {cfg.budget}")
    if cfg.part and cfg.part not in MEASURED:
        raise ConfigError(f"--part must be one of {', '.join(MEASURED)}, got {cfg.part!r}")
    if cfg.part and not cfg.record:
        raise ConfigError("--part needs --record=PATH, where its figures go")


# -----------------------------------------------------------------------------
# The goals, each part's line, and the page


def goals(result):
    """The project's two GPU goals, each with the figure measured and whether it is met
    (None where there is no figure to judge)."""
    train = result["parts"].get("train", {})
    target = train.get("target", 1.47)
    whole = train.get("whole_val_loss")
    measured = f"not measured ({train.get('status', 'not run')})"
    met = None
    if whole is not None:
        measured = f"{whole:.4f} at {train['whole_val_wall_s']:.1f} s; " + reached_text(train)
        met = whole <= target and train["whole_val_wall_s"] < GOAL_SECONDS
    found = [
        dict(
            goal=f"whole-val loss <= {target} within {GOAL_SECONDS} s of wall time, "
            "compile included (python train.py config/shakespeare.py)",
            measured=measured,
            met=met,
        )
    ]
    gpt2 = result["parts"].get("gpt2", {})
    measured = f"not measured ({gpt2.get('status', 'not run')})"
    met = None
    if gpt2.get("status") == "ok":
        measured = "peak unknown"
        if gpt2["mfu"] is not None:
            measured = f"{gpt2['mfu']:.1%} MFU"
            met = gpt2["mfu"] >= GOAL_MFU
    found.append(
        dict(goal=f"GPT-2 124M training at >= {GOAL_MFU:.0%} MFU", measured=measured, met=met)
    )
    return found


def reached_text(train):
    """When the val estimate first reached the target, in words."""
    r = train["reached"]
    if r is None:
        return f"the val estimate never reached {train['target']}: not reached"
    return (
        f"the val estimate first <= {train['target']} at {r['wall_s']:.1f} s "
        f"(iter {r['iter']}, {r['val_loss']:.4f})"
    )


def verdict(met):
    if met is None:
        return "not judged"
    if met:
        return "met"
    return "NOT met"


def fraction(x):
    """A fraction of a peak as a percentage; the peak may be unknown."""
    if x is None:
        return "peak unknown"
    return f"{x:.1%}"


def of_limit(path):
    """A decode path's share of the bandwidth limit, in words."""
    if path["fraction_of_limit"] is None:
        return "bandwidth peak unknown"
    return f"{path['fraction_of_limit']:.1%} of the bandwidth limit"


def rate(x):
    if x is None:
        return "n/a"
    return f"{x:,.0f}"


def summary(key, rec):
    """A part's line: its figures, or why it has none."""
    if key == "smoke" and "steps" in rec:
        line = f"{rec['ok']} ok, {rec['failed']} failed, {rec['skipped']} not run"
        if rec["status"] != "ok":
            line = f"FAILED: {line}"
        return line
    if rec["status"] != "ok" and key != "train":
        return f"{rec['status'].upper()}: {rec['error']}"
    if key == "train":
        if not rec.get("curve"):
            return f"{rec['status'].upper()}: {rec['error']}"
        whole = "no whole-val loss"
        if rec["whole_val_loss"] is not None:
            whole = f"whole val {rec['whole_val_loss']:.4f} at {rec['whole_val_wall_s']:.1f} s"
        line = f"{whole}; {reached_text(rec)}; {rate(rec['tokens_per_s'])} tok/s"
        if rec["status"] != "ok":
            line = f"{rec['status'].upper()} ({rec['error']}); {line}"
        return line
    if key == "gpt2":
        return (
            f"{rec['ms_per_step']:.1f} ms/step at batch {rec['batch']}, "
            f"{rate(rec['tokens_per_s'])} tok/s, MFU {fraction(rec['mfu'])}"
        )
    if key == "decode":
        paths = [
            f"{path} {rate(rec[path]['tokens_per_s'])} tok/s ({of_limit(rec[path])})"
            for path in ("eager", "compiled")
            if rec[path] is not None
        ]
        return ", ".join(paths)
    raise ValueError(f"no part {key!r}")


def device_text(d):
    """The device in words, with its peaks."""
    text = d["name"]
    if d["type"] == "cuda":
        text += f" (compute capability {d['capability']}, {d['memory_bytes'] / 2**30:.0f} GiB)"
    flops = "bf16 peak unknown"
    if d["peak_flops"]:
        flops = f"bf16 peak {d['peak_flops'] / 1e12:,.0f} TFLOP/s"
    bandwidth = "memory bandwidth peak unknown"
    if d["peak_bandwidth"]:
        bandwidth = f"memory bandwidth {d['peak_bandwidth'] / 1e12:.2f} TB/s"
    return f"{text}; {flops}, {bandwidth} (data sheets, support/mfu.py)"


def missing(rec):
    """The sentence that stands for a part's figures when it has none."""
    where = ""
    if rec.get("log"):
        where = f" (its output: {from_repo(rec['log'])})"
    return f"Not measured: {rec['status']}, {rec['error']}{where}."


def train_section(rec):
    lines = [f"## {PARTS[0][1]}: `python train.py config/shakespeare.py`", ""]
    if not rec.get("curve"):
        return lines + [missing(rec)]
    ended = "run to its end"
    if rec["status"] != "ok":
        ended = f"{rec['status']}: {rec['error']}"
    lines += [
        f"`{rec['command']}`, in a fresh out_dir, {ended} "
        f"(exit code {rec['returncode']}, {rec['wall_s']:.1f} s of wall time). Wall times count "
        "from just before the process starts (Python, imports, compiling, evaluations and "
        "saving included): each evaluation is timestamped when its line appears in "
        f"out_dir/log.jsonl, read every {POLL_S} s. The dataset was prepared before the "
        "clock started. Every evaluation but the last estimates the val loss on "
        "eval_iters random batches; the last also scores every token of the val split.",
        "",
    ]
    whole = "none in the log"
    if rec["whole_val_loss"] is not None:
        whole = f"{rec['whole_val_loss']:.4f}"
    when = "n/a"
    if rec["whole_val_wall_s"] is not None:
        when = f"{rec['whole_val_wall_s']:.1f} s"
    reached = "not reached"
    if rec["reached"] is not None:
        reached = f"{rec['reached']['wall_s']:.1f} s (iter {rec['reached']['iter']})"
    rows = [
        ["figure", "value"],
        ["whole-val loss (the final evaluation, every val token)", whole],
        ["wall time to the whole-val loss", when],
        [f"wall time to the first val estimate <= {rec['target']}", reached],
        [
            "wall time to the first step record (start-up, data, compiling the step included)",
            seconds(rec["first_step_wall_s"]),
        ],
        [
            "wall time to the first evaluation",
            seconds(rec["first_evaluation_wall_s"]),
        ],
        [
            f"tokens/s (median of {max(rec['step_records'] - 1, 0)} step records, the first "
            "left out)",
            rate(rec["tokens_per_s"]),
        ],
        [
            "tokens/s over the seconds of training (compile included, evaluations not)",
            rate(rec["tokens_per_s_run"]),
        ],
        ["MFU (median of the step records)", fraction(rec["mfu"])],
        ["iters", str(rec["iters"])],
        ["ms/iter (train.py's own count)", str(rec["ms_per_iter"])],
        ["parameters, device and dtype", f"{rec['parameters_m']}M, {rec['device_and_dtype']}"],
    ]
    lines += [common.markdown(rows), "", "Val curve:", ""]
    curve = [["iter", "wall s", "val loss (estimate)", "train loss", "s of training"]]
    for p in rec["curve"]:
        curve.append(
            [
                str(p["iter"]),
                f"{p['wall_s']:.1f}",
                f"{p['val_loss']:.4f}",
                f"{p['train_loss']:.4f}",
                seconds(p["training_s"]),
            ]
        )
    return lines + [common.markdown(curve)]


def seconds(x):
    if x is None:
        return "n/a"
    return f"{x:.1f} s"


def gpt2_section(rec):
    lines = [f"## {PARTS[1][1]}", ""]
    if rec["status"] != "ok":
        return lines + [missing(rec)]
    m = rec["model"]
    compiled = "uncompiled"
    if rec["compiled"]:
        compiled = "torch.compile (default mode)"
    precision = "float32, no autocast"
    if rec["autocast"]:
        precision = f"{rec['autocast']} autocast"
    lines += [
        f"{m['n_layer']} layers, {m['n_head']} heads, {m['n_embd']} wide, context "
        f"{m['block_size']}, vocabulary {m['vocab_size']:,} ({rec['parameters']:,} "
        f"parameters), batch {rec['batch']} x {m['block_size']}, {precision}, {compiled}, "
        "fused AdamW, random tokens "
        "(bench/train_step.py, bench_ours). The median of "
        f"{rec['repeats']} repeats of {rec['steps_per_repeat']} steps after "
        f"{rec['warmup_steps']} warm-up steps; the first step, where compiling happens, took "
        f"{rec['first_step_s']:.1f} s. MFU: {rec['flops_per_token']:,} FLOPs per token "
        "(6N + 12 L d T, support/mfu.py) x tokens/s / the bf16 peak.",
        "",
        common.markdown(
            [
                ["ms/step", "tokens/s", "MFU"],
                [f"{rec['ms_per_step']:.1f}", rate(rec["tokens_per_s"]), fraction(rec["mfu"])],
            ]
        ),
    ]
    return lines


def decode_section(rec):
    lines = [f"## {PARTS[2][1]}", ""]
    if rec["status"] != "ok":
        return lines + [missing(rec)]
    limit = "unknown (peak unknown)"
    if rec["limit_tokens_per_s"]:
        limit = (
            f"{rec['limit_tokens_per_s']:,.0f} tokens/s = "
            f"{rec['peak_bandwidth'] / 1e12:.2f} TB/s / "
            f"{(rec['weight_bytes'] + rec['mean_cache_bytes']) / 1e6:.1f} MB"
        )
    lines += [
        f"{rec['model']}, random weights in {rec['dtype']} (of the published model's shapes, "
        "so the same bytes to read), "
        f"batch 1, a 1-token prompt to {rec['new_tokens']} new tokens, greedy: the eager "
        "cached loop (model.generate) and the compiled decode step (support/engine.py, "
        "CUDA graphs writing the KV cache in place), alternating, medians "
        "(bench/decode.py). The bandwidth limit is the peak bandwidth over the bytes "
        f"read per token: {rec['weight_bytes'] / 1e6:.1f} MB of weights (every parameter but "
        f"the position embedding) + {rec['mean_cache_bytes'] / 1e6:.1f} MB of keys and "
        f"values on average; here {limit}.",
        "",
    ]
    rows = [["path", "tokens/s", "fraction of the bandwidth limit"]]
    for path in ("eager", "compiled"):
        if rec[path] is None:
            rows.append([path, "not run", ""])
        else:
            r = rec[path]
            rows.append([path, rate(r["tokens_per_s"]), fraction(r["fraction_of_limit"])])
    lines.append(common.markdown(rows))
    if rec["compile_s"] is not None:
        lines += ["", f"Compiling the decode step took {rec['compile_s']:.1f} s."]
    return lines


def smoke_section(rec):
    lines = [f"## {PARTS[3][1]}", ""]
    if "steps" not in rec:
        return lines + [missing(rec)]
    lines += [
        "bench/smoke_gpu.py's steps (the CUDA tests, train and resume, sampling, the "
        f"compiled samples' agreement, bench --quick) in the time left: {summary('smoke', rec)}. "
        f"Each step's whole output is in {from_repo(rec['log'])}.",
        "",
    ]
    rows = [["step", "result", "seconds", "figures or error"]]
    for step in rec["steps"]:
        result = "ok"
        if not step["ok"]:
            result = "FAIL"
        if step.get("skipped"):
            result = "not run"
        shown = ", ".join(f"{k} {v}" for k, v in step["figures"].items())
        if not step["ok"]:
            shown = step["error"]
        rows.append([step["name"], result, f"{step['seconds']:.0f}", shown.replace("|", "/")])
    return lines + [common.markdown(rows)]


def page(result):
    """gpu.md: the device, the versions, the goals, then each part's figures."""
    d = result["device"]
    lines = ["# GPU figures", ""]
    if result["dry_run"]:
        lines += [
            "**A dry run on the CPU** (`--dry_run=True`): every part at toy size, "
            "uncompiled, to try the script. These figures say nothing about a GPU.",
            "",
        ]
    lines += [
        f"Measured by `{result['command']}` on {device_text(d)}, torch {d['torch']}, "
        f"CUDA {d['cuda']}, Python {d['python']}, on {result['date']}. The four parts ran "
        f"in {result['seconds']:.0f} s of a {result['budget_s']:.0f} s budget, in this order, "
        f"each within its share; the compile cache started {result['compile_cache']}. Every "
        "figure is also in gpu.json beside this page.",
        "",
        "## Goals",
        "",
        common.markdown(
            [["goal", "measured", "verdict"]]
            + [[g["goal"], g["measured"], verdict(g["met"])] for g in result["goals"]]
        ),
        "",
    ]
    parts = result["parts"]
    if result["dry_run"]:
        lines += ["Every part below ran at toy size (DRY_TRAIN, DRY_SHAPE in bench/gpu.py).", ""]
    sections = [
        ("train", train_section),
        ("gpt2", gpt2_section),
        ("decode", decode_section),
        ("smoke", smoke_section),
    ]
    for key, section in sections:
        rec = parts.get(key, dict(status="not run", error="not reached yet", log=None))
        lines += section(rec) + [""]
    return "\n".join(lines)


def write_report(result, page_path, figures_path):
    """The page and the JSON, each written whole (a temporary file, then renamed)."""
    common.write_json(result, figures_path)
    tmp = page_path + ".tmp"
    with open(tmp, "w") as f:
        f.write(page(result))
    os.replace(tmp, page_path)


def with_outputs(cfg):
    """cfg with its page and figures paths: in --out_dir where given, else in --work, so
    that no run writes over the page of record unless asked to (--out_dir=docs)."""
    folder = cfg.out_dir or cfg.work
    page = cfg.page or os.path.join(folder, "gpu.md")
    figures = cfg.figures or os.path.join(folder, "gpu.json")
    return dataclasses.replace(cfg, page=page, figures=figures)


def log_line(message):
    print(message, flush=True)


def main(cfg):
    check(cfg)
    cfg = dataclasses.replace(cfg, work=os.path.abspath(cfg.work))
    if not cfg.dry_run and not torch.cuda.is_available():
        print(
            f"bench.gpu: no CUDA GPU here (torch {torch.__version__}); nothing measured, "
            "run it on a machine with an NVIDIA GPU (or try the script with --dry_run=True)"
        )
        return
    if cfg.part:
        rec = MEASURED[cfg.part](cfg.dry_run, lambda m: print(m, file=sys.stderr, flush=True))
        common.write_json(rec, cfg.record)
        return
    if cfg.out_dir:
        cli.output_folder(cfg.out_dir)
    cfg = with_outputs(cfg)
    for path in (cfg.page, cfg.figures):
        cli.output_folder(os.path.dirname(os.path.abspath(path)), "--page or --figures")
    cli.output_folder(cfg.work, "--work")
    result = start(cfg, fresh_cache(cfg.work, cfg.warm_cache))
    d = result["device"]
    log_line(f"{d['name']}, torch {d['torch']}, CUDA {d['cuda']}, budget {cfg.budget:.0f} s")
    run_parts(cfg, result, log_line)
    log_line(f"wrote {cfg.page} and {cfg.figures} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], __doc__, Settings))
