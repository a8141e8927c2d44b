"""
The first run on a machine with a GPU: one command that exercises every CUDA
path of this project and says, step by step, what works.

    python -m bench.smoke_gpu        # a few minutes on one GPU, from the repository root

Steps: the CUDA tests (pytest -m cuda; among them blockwise attention, and the
model through the context-parallel hooks in a one-process NCCL group), 20
iters of config/shakespeare.py and a resume to 40, on two GPUs or more 20
iters with each sequence split over two (--context_parallel=2), sample.py in
the default dtype with and without --compile, the same greedy sample in
float32 with and without --compile (which must agree), and python -m bench
--device=cuda --quick. It prints one line per step, ok or FAIL with the error,
and writes the figures to out-smoke-gpu/smoke.json and every step's whole
output to out-smoke-gpu/<step>.log. Without CUDA it says so and does nothing.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import functools
import json
import re
import shutil
import signal
import subprocess
import time

import torch

from support.configurator import BAD_INPUT, error, wants_help

OUT = "out-smoke-gpu"
# the folders under out that the steps train into
TRAINED = ("train", "context_parallel")
STEP_TIMEOUT = 900  # seconds; compiling is the slow part
MIN_STEP_S = 10  # under a deadline, a step with less time left is not started
SEPARATOR = "-" * 40  # what sample.py prints after each sample

# Figures read from a step's output, as (name, pattern): the last match wins,
# because the progress bar rewrites its line.
FIGURES = [
    ("ms_per_iter", r"\(([\d.]+) ms/iter\)"),
    ("best_val_loss", r"best val loss ([\d.]+)"),
    ("whole_val_loss", r"whole val split ([\d.]+)"),
    ("mfu_percent", r"mfu ([\d.]+)%"),
    ("train_tokens_per_s", r"tok_per_s ([\d,]+)"),
    ("sample_tokens_per_s", r"([\d.]+) tokens/s"),
    ("compile_s", r"compiled the decode step in ([\d.]+) s"),
    # train.py's second line: parameters | the shape | device, dtype (why) | ...
    ("device_and_dtype", r"parameters \| [^|]+ \| (\S+, \w+) \("),
]


def steps(out, gpus=None):
    """[(name, command)], in the order they run; gpus (default: this machine's)
    decides whether the sequence is also split over two GPUs."""
    gpus = torch.cuda.device_count() if gpus is None else gpus
    # the commands run in the repository (run_step), their output where out is from here
    out = os.path.abspath(out)
    python, ckpt = sys.executable, os.path.join(out, TRAINED[0])
    train = [python, "train.py", "config/shakespeare.py", f"--out_dir={ckpt}"]
    sample = [
        python,
        "sample.py",
        f"--out_dir={ckpt}",
        "--prompt=ROMEO:",
        "--max_new_tokens=300",
        "--seed=1337",
    ]
    greedy = sample + ["--dtype=float32", "--temperature=0", "--num_samples=1", "--attn_dir="]
    # each sequence split over 2 GPUs, NCCL passing keys and values round the ring
    split = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
        "config/shakespeare.py",
        f"--out_dir={os.path.join(out, TRAINED[1])}",
        "--max_iters=20",
        "--context_parallel=2",
        "--dropout=0.0",
        "--compile=False",
        "--eval_iters=20",
    ]
    return [
        ("cuda tests", [python, "-m", "pytest", "-q", "-m", "cuda", "tests"]),
        ("train 20 iters", train + ["--max_iters=20"]),
        ("resume to 40", train + ["--max_iters=40", "--init_from=resume"]),
        *([("context parallel, 2 GPUs", split)] if gpus >= 2 else []),
        ("sample", sample + ["--num_samples=2"]),
        ("sample --compile", sample + ["--num_samples=2", "--compile"]),
        ("float32 greedy", greedy),
        ("float32 greedy --compile", greedy + ["--compile"]),
        (
            "bench --quick",
            [
                python,
                "-m",
                "bench",
                "--device=cuda",
                "--quick",
                f"--out={os.path.join(out, 'bench.json')}",
            ],
        ),
    ]


def figures(text):
    found = {}
    for name, pattern in FIGURES:
        matches = re.findall(pattern, text)
        if matches:
            value = matches[-1]
            number = re.fullmatch(r"[\d,.]+", value)
            found[name] = float(value.replace(",", "")) if number else value
    return found


def samples(stdout):
    """The texts sample.py printed, in order."""
    return [s.strip("\n") for s in stdout.split(SEPARATOR)[:-1]]


def first_difference(a, b):
    """Where texts a and b first differ (a character index), or None if they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_command(command, timeout, cwd=None):
    """(return code, stdout, stdout + stderr) of command, run to its end or for timeout
    seconds; the code is None if it ran out of time. The command runs in a process group
    of its own, killed whole at the timeout (or on Ctrl-C here), so that no compile worker
    or test process it started lives on and holds the GPU."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stdout + stderr
    except subprocess.TimeoutExpired:
        kill_group(proc)
        stdout, stderr = proc.communicate()
        return None, stdout, stdout + stderr + f"\ntimed out after {timeout:.0f} s"
    except BaseException:
        kill_group(proc)
        raise


def kill_group(proc):
    """Kill the process group that proc leads (it was started in a session of its own)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # every process of the group has ended


def run_step(name, command, out, timeout=STEP_TIMEOUT):
    """Run one step; its record: command, return code, seconds, figures, error."""
    t0 = time.perf_counter()
    code, stdout, text = run_command(command, timeout, cwd=REPO)
    log = os.path.join(out, re.sub(r"[^\w.]+", "_", name).strip("_") + ".log")
    with open(log, "w") as f:
        f.write(" ".join(command) + "\n\n" + text)
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    return dict(
        name=name,
        command=command,
        returncode=code,
        seconds=round(time.perf_counter() - t0, 1),
        ok=code == 0,
        figures=figures(text),
        log=log,
        stdout=stdout,
        error=None if code == 0 else (lines[-1] if lines else f"exit code {code}"),
    )


def not_run(name, command, why):
    """The record of a step left out: not ok, with the reason as its error."""
    return dict(
        name=name,
        command=command,
        returncode=None,
        seconds=0.0,
        ok=False,
        skipped=True,
        figures={},
        log=None,
        stdout="",
        error=why,
    )


def run_steps(out, deadline=None, log=print):
    """Every step in order, then the checks across them, each line printed as it ends.
    deadline (time.monotonic()): a step gets at most the time left before it, and the
    steps with under MIN_STEP_S left are not run. The records, in order."""
    # the training steps start anew: train.py refuses to replace an earlier run's checkpoint
    for folder in TRAINED:
        shutil.rmtree(os.path.join(out, folder), ignore_errors=True)
    records = []
    for step, command in steps(out):
        timeout = STEP_TIMEOUT
        if deadline is not None:
            timeout = min(STEP_TIMEOUT, deadline - time.monotonic())
        if timeout < MIN_STEP_S:
            records.append(not_run(step, command, "not run: no time left"))
        else:
            records.append(run_step(step, command, out, timeout))
        log(report(records[-1]))
    for check in compare(records):
        records.append(check)
        log(report(check))
    return records


def report(rec):
    """One line for a step."""
    shown = ", ".join(f"{k} {v}" for k, v in rec["figures"].items())
    if rec.get("skipped"):
        return f"skip  {rec['name']}: {rec['error']}"
    if rec["ok"]:
        return f"ok    {rec['name']} ({rec['seconds']:.0f} s){': ' + shown if shown else ''}"
    return f"FAIL  {rec['name']} ({rec['seconds']:.0f} s): {rec['error']} (see {rec['log']})"


def compare(records):
    """The checks across steps: the float32 promise of --compile, and where the
    default dtype's compiled samples part from the plain ones."""
    by = {r["name"]: r for r in records}
    checks = []
    a, b = by.get("float32 greedy"), by.get("float32 greedy --compile")
    if a and b and a["ok"] and b["ok"]:
        at = first_difference("\n".join(samples(a["stdout"])), "\n".join(samples(b["stdout"])))
        checks.append(
            dict(
                name="float32: --compile gives the same tokens",
                ok=at is None,
                seconds=0.0,
                figures={},
                log=b["log"],
                error=f"the texts part at character {at}",
            )
        )
    a, b = by.get("sample"), by.get("sample --compile")
    if a and b and a["ok"] and b["ok"]:
        parts = [first_difference(x, y) for x, y in zip(samples(a["stdout"]), samples(b["stdout"]))]
        b["figures"]["compiled_sample_differs_at"] = parts
    return checks


def main(out=OUT):
    if not torch.cuda.is_available():
        print(
            f"bench.smoke_gpu: no CUDA GPU here (torch {torch.__version__}); nothing to do, "
            "run it on a machine with an NVIDIA GPU"
        )
        return 0
    os.makedirs(out, exist_ok=True)
    name = torch.cuda.get_device_name()
    print(
        f"{name}, compute capability {'.'.join(map(str, torch.cuda.get_device_capability()))}, "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}",
        flush=True,
    )
    records = run_steps(out, log=functools.partial(print, flush=True))
    path = os.path.join(out, "smoke.json")
    with open(path, "w") as f:
        json.dump(
            dict(
                device=name,
                torch=torch.__version__,
                cuda=torch.version.cuda,
                steps=[{k: v for k, v in r.items() if k != "stdout"} for r in records],
            ),
            f,
            indent=1,
        )
    failed = sum(not r["ok"] for r in records)
    print(f"{len(records) - failed} of {len(records)} ok; figures in {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    if wants_help(sys.argv[1:]):
        print(__doc__.strip())
        sys.exit(0)
    if sys.argv[1:]:
        error(f"python -m bench.smoke_gpu takes no options, got {sys.argv[1]!r}")
        sys.exit(BAD_INPUT)
    sys.exit(main())
