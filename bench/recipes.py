"""
The CPU recipe against nanoGPT's: config/shakespeare_cpu.py against nanoGPT's CPU
settings (config/shakespeare_cpu_classic.py), each trained to the end by train.py,
on this CPU as it is and capped at AVX2 (no AVX-512, no native bfloat16, like most
laptops): whole-val loss and wall time. With --nanogpt=PATH, a nanoGPT checkout
(its data prepared) whose own train.py runs beside ours.

With --minutes=15, the good model instead: config/shakespeare_cpu_15min.py against
nanoGPT's baby GPT settings (config/shakespeare_classic.py), both in float32 through
train.py, each given the same minutes of training: their val loss against training
time (the curve, drawn into --png) and their last val loss over the whole split.

    python -m bench.recipes [--nanogpt=PATH] [--threads=N] [--out=bench.json]
    python -m bench.recipes --minutes=15 --png=docs/recipes_15min.png
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import re
import subprocess
import tempfile
import time

import torch

from bench import common
from support.configurator import parse_settings
from support.run_log import read_evaluations
from support.settings import Settings as TrainSettings


@dataclasses.dataclass
class Settings(common.Settings):
    nanogpt: str = ""  # a nanoGPT checkout (its data prepared) whose own train.py runs beside ours
    # > 0: the good model against the baby GPT for this many minutes of training each
    minutes: float = 0.0
    png: str = ""  # with --minutes: where to draw the two val-loss curves
    keep: str = ""  # with --minutes: keep each run's folder (checkpoint, log) under this one


# The CPU recipe's targets (docs/benchmarks.md): the val loss nanoGPT's CPU settings
# reach, in at most this fraction of their wall time, on the same machine.
TARGET_RECIPE_LOSS = 1.88
TARGET_RECIPE_WALL = 0.30
RECIPES = [
    ("nanoGPT CPU settings", "config/shakespeare_cpu_classic.py"),
    ("ours", "config/shakespeare_cpu.py"),
]
# ATen, oneDNN and MKL each cap the instructions they use at these settings, so a
# CPU with AVX-512 and native bfloat16 runs like one with AVX2 alone.
AVX2_CAP = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}

# nanoGPT's README command for a CPU (its train.py trains in float32 there)
NANOGPT_CPU = [
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--dropout=0.0",
]


def cpu_classes():
    """[(name, environment, train.py arguments)]: this CPU as it is; where it runs
    bfloat16 natively, the same in float32 (the class whose bfloat16 crashes or
    is slower, like a VM that advertises AMX it does not allow); then capped at
    AVX2 if it has more."""
    from support.hardware import native_bf16

    native, why = native_bf16("cpu")
    capability = torch.backends.cpu.get_cpu_capability()
    classes = [(f"this CPU ({capability}, {why})", {}, [])]
    if native:
        classes.append(
            (f"this CPU in float32 ({capability}, bfloat16 not used)", {}, ["--dtype=float32"])
        )
    if capability != "AVX2" or native:
        classes.append(("capped at AVX2 (no native bfloat16)", AVX2_CAP, []))
    return classes


def train_run(config, env, out_dir, data_root=None, args=()):
    """Run train.py on a config to the end: (wall seconds, its last log record, device
    and dtype, phases). Phases split the wall time by when train.py's lines appear:
    start-up (to the line naming the device), training (train.py's own clock),
    evaluations and saving (the rest until its last line), exit (after it). The config
    is a path from the repository, where train.py runs; the folders are from here."""
    command = [
        sys.executable,
        "train.py",
        config,
        f"--out_dir={os.path.abspath(out_dir)}",
        "--eval_full_val=True",
    ]
    if data_root:
        command.append(f"--data_root={os.path.abspath(data_root)}")
    command += list(args)
    stamps = {}
    stdout = []
    # the progress bar's stderr goes to a file: a pipe left unread would fill
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=dict(os.environ, **env),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        for line in proc.stdout:
            stdout.append(line)
            for key, mark in (("start", "parameters |"), ("done", "done at iter")):
                if mark in line:
                    stamps[key] = time.perf_counter() - t0
        proc.wait()
        wall = time.perf_counter() - t0
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0 or len(stamps) < 2:
        raise common.BenchError(f"train.py {config} failed: {stderr.strip().splitlines()[-1:]}")
    last = read_evaluations(out_dir)[-1]
    start = next(line for line in stdout if "parameters |" in line)
    phases = dict(
        startup_s=stamps["start"],
        training_s=last["elapsed_s"],
        evaluations_s=stamps["done"] - stamps["start"] - last["elapsed_s"],
        exit_s=wall - stamps["done"],
    )
    # the line: parameters | layers, heads, width | device, dtype (why) | processes | ...
    return wall, last, start.split("|")[2].strip(), phases


def nanogpt_run(path, env, out_dir):
    """nanoGPT's own train.py, as its README runs it on a CPU: (wall seconds, its
    last val loss, an estimate over eval_iters batches)."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "train.py", *NANOGPT_CPU, f"--out_dir={out_dir}"],
        cwd=path,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    losses = re.findall(r"step \d+: train loss [\d.]+, val loss ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not losses:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise common.BenchError(f"nanoGPT's train.py failed: {last}")
    return wall, float(losses[-1])


def bench_recipes(log, recipes=RECIPES, data_root=None, nanogpt=""):
    """Each recipe trained to the end on each CPU class, the first recipe (nanoGPT's
    settings) first: the others' wall times are given as fractions of its, and of
    nanoGPT's own train.py's when a checkout is given."""
    from data.dataset import ensure_dataset

    ensure_dataset("shakespeare_char", data_root)  # prepared before the clocks start
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cpu, env, args in cpu_classes():
            walls = {}
            if nanogpt:
                log(f"recipes: nanoGPT's own train.py on {cpu} ...")
                out_dir = os.path.join(tmp, f"nanogpt{len(rows)}")
                walls["nanoGPT"], val = nanogpt_run(nanogpt, env, out_dir)
                rows.append(
                    dict(
                        cpu=cpu,
                        recipe="nanoGPT itself",
                        config="nanoGPT train.py",
                        reference=True,
                        device="cpu, float32",
                        iters=2000,
                        val_loss=val,
                        wall_s=walls["nanoGPT"],
                    )
                )
            for i, (name, config) in enumerate(recipes):
                log(f"recipes: {config} on {cpu} ...")
                # the reference keeps its own settings: nanoGPT trains in float32 on a CPU anyway
                recipe_args = args
                if i == 0:
                    recipe_args = ()
                out_dir = os.path.join(tmp, f"{len(rows)}")
                wall, last, device, phases = train_run(config, env, out_dir, data_root, recipe_args)
                walls[name] = wall
                rows.append(
                    dict(
                        cpu=cpu,
                        recipe=name,
                        config=config,
                        reference=i == 0,
                        device=device,
                        iters=last["iter"],
                        val_loss_full=last["val_loss_full"],
                        wall_s=wall,
                        wall_over_classic=wall / walls[recipes[0][0]],
                        **phases,
                    )
                )
                if nanogpt:
                    rows[-1]["wall_over_nanogpt"] = wall / walls["nanoGPT"]
    return rows


def cell(row, key, form):
    """row[key] formatted, or '-' where the row has no such figure."""
    if key not in row:
        return "-"
    return format(row[key], form)


def recipes_table(rows):
    lines = [
        "| CPU | recipe | device, dtype | iters | val loss | start-up s | training s "
        "| evaluations s | exit s | wall s | wall / nanoGPT's settings "
        "| wall / nanoGPT itself |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "val_loss_full" in r:
            loss = f"{r['val_loss_full']:.4f} (whole split)"
        else:
            loss = f"{r['val_loss']:.4f} (estimate)"
        phases = [cell(r, k, ".1f") for k in ("startup_s", "training_s", "evaluations_s", "exit_s")]
        lines.append(
            f"| {r['cpu']} | `{r['config']}` | {r['device']} | {r['iters']} | {loss} | "
            + " | ".join(phases)
            + f" | {r['wall_s']:.1f} | {cell(r, 'wall_over_classic', '.2f')} | "
            f"{cell(r, 'wall_over_nanogpt', '.2f')} |"
        )
    return "\n".join(lines)


def recipe_targets(rows):
    return [
        dict(
            target=f"{r['cpu']}: whole-val loss <= {TARGET_RECIPE_LOSS} in <= "
            f"{TARGET_RECIPE_WALL}x the wall time of nanoGPT's CPU settings",
            measured=r["wall_over_classic"],
            met=r["val_loss_full"] <= TARGET_RECIPE_LOSS
            and r["wall_over_classic"] <= TARGET_RECIPE_WALL,
        )
        for r in rows
        if "wall_over_classic" in r and not r["reference"]
    ]


def section(args, log):
    """The figures, the table and the targets, for common.run."""
    if args.device == "cuda":
        raise common.ConfigError("--recipes compares CPU training recipes; drop --device=cuda")
    rows = bench_recipes(log, nanogpt=args.nanogpt)
    table = "## Training to the target loss\n\n" + recipes_table(rows)
    return dict(recipes=rows), [table], recipe_targets(rows)


# The good model ----------
# nanoGPT's baby GPT settings against the recipe that spends 15 minutes of two cores
# well, each given the same minutes of training, both in float32 (a CPU without native
# bfloat16). The baby GPT evaluates every 10 of its slow iters so that its curve has
# points; train.py keeps evaluations off the training clock, so they cost neither run
# training time.
BUDGET_RECIPES = [
    ("nanoGPT's baby GPT settings", "config/shakespeare_classic.py", ["--eval_interval=10"]),
    ("ours", "config/shakespeare_cpu_15min.py", []),
]
BUDGET_EVAL_ITERS = 4  # batches per point of the curves
BUDGET_ARGS = ["--device=cpu", "--dtype=float32", f"--eval_iters={BUDGET_EVAL_ITERS}"]
BUDGET_MARKS = (5, 10, 15)  # minutes of training at which the table reads each curve
GPU_RESULT = 1.4697  # the baby GPT's val loss in nanoGPT's README, on an A100


def budget_run(config, minutes, out_dir, data_root=None, args=()):
    """One recipe given `minutes` of training (train.py's max_time): its val-loss
    curve against training seconds, and its last evaluation over the whole split."""
    args = [*BUDGET_ARGS, f"--max_time={60 * minutes}", *schedule_args(config, minutes), *args]
    wall, last, device, phases = train_run(config, {}, out_dir, data_root, args)
    evaluations = read_evaluations(out_dir)
    curve = [[r["elapsed_s"], r["val_loss"]] for r in evaluations]
    train_curve = [[r["elapsed_s"], r["train_loss"]] for r in evaluations]
    return dict(
        config=config,
        device=device,
        iters=last["iter"],
        val_loss_full=last["val_loss_full"],
        curve=curve,
        train_curve=train_curve,
        wall_s=wall,
        **phases,
    )


def schedule_args(config, minutes):
    """A recipe whose lr decays by seconds of training (lr_decay_time) decays over
    the minutes given, not over those its config names; one that decays by iters
    runs as its config says."""
    cfg = parse_settings(TrainSettings, [os.path.join(REPO, config)], allow_files=True)
    if cfg.lr_decay_time > 0:
        return [f"--lr_decay_time={60 * minutes}"]
    return []


def loss_at(curve, seconds):
    """The curve's last evaluation at or before `seconds` of training; None before its
    first. Read, not interpolated: the figure a run would have stopped with."""
    earlier = [loss for t, loss in curve if t <= seconds]
    if not earlier:
        return None
    return earlier[-1]


def bench_budget(log, minutes, recipes=BUDGET_RECIPES, data_root=None, keep=""):
    """Each recipe for the same minutes of training, one after the other; their
    folders under `keep`, or in a temporary one."""
    from data.dataset import ensure_dataset

    ensure_dataset("shakespeare_char", data_root)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config, args in recipes:
            log(f"recipes: {config} for {minutes:g} minutes of training ...")
            out_dir = os.path.join(keep or tmp, os.path.splitext(os.path.basename(config))[0])
            row = budget_run(config, minutes, out_dir, data_root, args)
            rows.append(dict(recipe=name, out_dir=out_dir, **row))
    return rows


def budget_table(rows, minutes):
    marks = [m for m in BUDGET_MARKS if m <= minutes] or [minutes]
    head = [
        "recipe",
        "precision",
        "iters",
        *[f"val at {m:g} min" for m in marks],
        "val at the end (whole split)",
        "training s",
        "wall s",
    ]
    lines = [head]
    for r in rows:
        at = [loss_at(r["curve"], 60 * m) for m in marks]
        lines.append(
            [
                f"{r['recipe']} (`{r['config']}`)",
                r["device"],
                str(r["iters"]),
                *["-" if x is None else f"{x:.4f}" for x in at],
                f"**{r['val_loss_full']:.4f}**",
                f"{r['training_s']:.0f}",
                f"{r['wall_s']:.0f}",
            ]
        )
    return (
        f"## {minutes:g} minutes of training each\n\n"
        + common.markdown(lines)
        + "\n\n(val at N min: the last evaluation by then, an estimate from "
        + f"{BUDGET_EVAL_ITERS} batches; nanoGPT's GPU result is {GPU_RESULT})"
    )


def plot_budget(rows, png):
    """Val loss (and train loss, dashed) against minutes of training, per recipe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in rows:
        minutes = [t / 60 for t, _ in r["curve"]]
        losses = [loss for _, loss in r["curve"]]
        label = f"{r['recipe']}: val ({r['val_loss_full']:.3f} over the whole split)"
        (line,) = ax.plot(minutes, losses, marker=".", label=label)
        # the train loss, dashed: where it leaves the val loss behind, the model memorises
        train = [loss for _, loss in r["train_curve"]]
        ax.plot(minutes, train, linestyle="--", color=line.get_color(), label="train")
    ax.axhline(
        GPU_RESULT,
        color="gray",
        linestyle=":",
        linewidth=1,
        label=f"nanoGPT's baby GPT on an A100, {GPU_RESULT}",
    )
    ax.set_ylim(1.0, 3.0)
    ax.set_xlabel("minutes of training (evaluations not counted)")
    ax.set_ylabel("loss (estimates; the label: whole split)")
    ax.set_title(
        "Tiny Shakespeare, characters, float32, " + common.cpu_class().split(";")[0], fontsize=9
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def budget_section(args, log):
    """The --minutes comparison, for common.run; --png and --keep checked before
    half an hour of training, not after."""
    if args.device == "cuda":
        raise common.ConfigError("--minutes compares CPU training recipes; drop --device=cuda")
    if args.png and not os.access(os.path.dirname(os.path.abspath(args.png)), os.W_OK):
        raise common.ConfigError(f"cannot write --png={args.png}: pass a path in a writable folder")
    if args.keep:
        try:
            os.makedirs(args.keep, exist_ok=True)
        except OSError as e:
            raise common.ConfigError(
                f"cannot make --keep={args.keep} ({e.strerror}); pass a writable path"
            ) from None
    rows = bench_budget(log, args.minutes, keep=args.keep)
    if args.png:
        plot_budget(rows, args.png)
    return dict(budget=rows), [budget_table(rows, args.minutes)], []


def sections(args):
    if args.minutes < 0:
        raise common.ConfigError(f"--minutes must be 0 or more, got {args.minutes}")
    if args.minutes > 0:
        return [budget_section]
    return [section]


if __name__ == "__main__":
    sys.exit(common.main("bench.recipes", __doc__, Settings, sections, sys.argv[1:]))
