"""
Did my hack help? Train two arms in pairs of seeds and compare their val loss, with an
interval and a p-value.

    python compare.py                          # the working tree (your edit) against HEAD
    python compare.py --ref=main --pairs=8     # against another commit or branch
    python compare.py --a="--qk_norm=True" --b="--qk_norm=False"    # two settings, this code
    python compare.py --a=config/x.py --b=config/y.py               # two config files
    python compare.py --config=config/shakespeare_cpu_15min.py --minutes=3 --batch_size=16

Arm A is the baseline: the commit --ref names (HEAD by default), taken with `git archive` into
a folder of its own. Arm B is the working tree as it is, new untracked files included and
ignored ones (outputs, datasets) left out, copied likewise: the tree itself is only read. With
--a or --b and no --ref both arms run the working tree's code, each with its own settings.
Every run is a real `python train.py` of the recipe (config/shakespeare_cpu.py on a CPU, a
short baby GPT on a GPU; any --key=value that is not compare.py's own goes to both arms),
one at a time, in the order A1 B1 B2 A2 A3 B3 ... (a machine that speeds up or slows down
through the runs favours neither arm), the two runs of a pair with the same seed: the
same batches, and the same initialisation where the shapes agree. Held equal and printed:
the threads, the dtype ('auto' resolved once, for A's model), the attention path and compile.
An edit inside attention() or causal_mask() changes nothing while the fused kernel trains:
where the arms differ there, both train with --fused=False, and the first lines say so.

The report (printed, and <out_dir>/compare.json, compare.png): each arm's whole-val loss per
seed, the paired difference B - A with its 95% interval (Student's t) and p-value, a verdict
in words, the step time and parameters of each arm, and the val curves. Each finished run is
kept in <out_dir>/runs, keyed by its code, settings and seed: the same comparison again, or
with more --pairs, trains only the new runs. Ctrl-C stops and reports the pairs finished.
Options are --key=value; `python compare.py --help` lists them.
"""

import dataclasses
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile

from support import arms, compare_runs, compare_stats
from support.configurator import (
    BAD_INPUT,
    FAILED,
    INTERRUPTED,
    ConfigError,
    error,
    parse_settings,
    wants_help,
)
from support.hardware import FLAG_FIELDS, cpuinfo

ROOT = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(ROOT, "support", "arm_probe.py")
CPU_RECIPE = ["config/shakespeare_cpu.py"]
# the baby GPT of config/shakespeare.py, cut to 1,000 iters: a few minutes a run
GPU_RECIPE = ["config/shakespeare.py", "--max_iters=1000", "--lr_decay_iters=1000"]


@dataclasses.dataclass
class Settings:
    pairs: int = 4  # pairs of runs; a pair's two runs share one seed
    # arm A's code: a commit, branch or tag (None: HEAD, or with --a/--b the working tree)
    ref: str | None = None
    a: str | None = None  # arm A's own settings: "--key=value ..." or a config file
    b: str | None = None  # arm B's own settings
    config: str = ""  # the recipe; "": config/shakespeare_cpu.py on a CPU, the baby GPT on a GPU
    minutes: float = 0.0  # each run trains this long by its own clock, lr decaying over it
    seed: int = 1337  # pair i trains with seed + i
    # arm B's seeds shifted by this: unpaired runs, for measuring the command under the null
    seed_offset: int = 0
    threads: int = 0  # threads of each run (OMP_NUM_THREADS); 0: what torch takes here
    evals: int = 4  # evaluations per run, for the val curves; 0: the recipe's eval_interval
    out_dir: str = "out-compare"  # the kept runs, compare.json and compare.png


class CompareError(Exception):
    """Bad input to compare.py; the message is one line saying what to do."""


class CompareFailed(Exception):
    """An arm that failed: its code or its training; the message is one line."""


# -----------------------------------------------------------------------------
# The command line: compare.py's own options, and train.py's settings for both arms


OWN = {field.name for field in dataclasses.fields(Settings)}


def split_argv(argv):
    """(compare.py's own options, train.py's settings) from the command line, each in order."""
    own = []
    rest = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        key, sep, _ = arg[2:].partition("=")
        if arg in ("-h", "--help") or (arg.startswith("--") and key in OWN):
            own.append(arg)
            # --a "--qk_norm=False": the value is the next word, whatever it looks like
            if arg.startswith("--") and key in OWN and not sep and i < len(argv):
                own.append(argv[i])
                i += 1
        else:
            rest.append(arg)
    return own, rest


def in_arm(words, folder, project):
    """train.py's words with paths made to work from the arm's folder: a config file of the
    project is the arm's own copy; any other file, and --data_root, an absolute path."""
    out = []
    for i, word in enumerate(words):
        follows_key = i > 0 and words[i - 1].startswith("--") and "=" not in words[i - 1]
        if word.startswith("--data_root="):
            word = "--data_root=" + os.path.abspath(word.partition("=")[2])
        elif not word.startswith("--") and not follows_key:
            path = os.path.abspath(word)
            mine = os.path.relpath(path, project)
            inside = not mine.startswith("..") and os.path.exists(os.path.join(folder, mine))
            word = mine if inside else path
        out.append(word)
    return out


def recipe(cfg, shared):
    """(the recipe's config file, or None for the default, which arm A's check picks by
    the hardware it finds; the settings both arms train with)."""
    base = None
    if cfg.config:
        base = [cfg.config]
    elif any(not w.startswith("--") for w in shared):
        base = []  # a config file given as a bare word
    elif all(names_a_file(words) for words in (cfg.a, cfg.b)):
        base = []  # two config files, one for each arm: each is its arm's recipe
    timed = []
    if cfg.minutes > 0:
        seconds = round(cfg.minutes * 60, 3)
        # the iters out of reach, so that the clock ends the run and the lr's schedule
        timed = [f"--max_time={seconds}", f"--lr_decay_time={seconds}"]
        timed += ["--max_iters=1000000000", "--lr_decay_iters=1000000000"]
    return base, shared + timed


def names_a_file(words):
    """Whether an arm's own settings (--a, --b) name a config file."""
    return any(not w.startswith("--") for w in shlex.split(words or ""))


def check(cfg):
    if cfg.pairs < 1:
        raise CompareError(f"--pairs must be at least 1, got {cfg.pairs}")
    if not 0 <= cfg.minutes < math.inf:
        raise CompareError(f"--minutes must be a number >= 0, got {cfg.minutes}")
    if cfg.evals < 0:
        raise CompareError(f"--evals must be >= 0 (0: the recipe's own), got {cfg.evals}")
    cores = os.cpu_count() or 1
    if not 0 <= cfg.threads <= cores:
        raise CompareError(
            f"--threads must be 0 to {cores} (this machine's cores), got {cfg.threads}"
        )
    for name in ("a", "b"):
        try:
            shlex.split(getattr(cfg, name) or "")
        except ValueError as e:
            raise CompareError(f"--{name} does not parse as a command line ({e})") from None


# -----------------------------------------------------------------------------
# The arms: their code, and what each would train


@dataclasses.dataclass
class Arm:
    name: str  # "A" or "B"
    label: str  # what it is, in words
    folder: str  # its code's snapshot (the project inside it)
    code: str  # the hash of its code
    argv: list  # train.py's settings, but seed and out_dir
    probe: dict | None = None  # what arm_probe.py found


def snapshots(cfg, top, project, scratch, cache):
    """Arms A and B, their code snapshot into scratch."""
    inside = os.path.relpath(project, top)
    tree = os.path.join(scratch, "tree")
    arms.copy_working_tree(top, tree, skip=cache)
    # the project's code, where the project is a folder of a larger repository too
    tree_files = arms.python_files(os.path.join(tree, inside))
    same_code = (cfg.a is not None or cfg.b is not None) and cfg.ref is None
    if same_code:
        folder = os.path.normpath(os.path.join(tree, inside))
        code = arms.code_hash(tree_files)
        a = Arm("A", "the working tree", folder, code, [])
        b = Arm("B", "the working tree", folder, code, [])
        return a, b, []
    ref = cfg.ref or "HEAD"
    sha, short = arms.commit(top, ref)
    base = os.path.join(scratch, "ref")
    arms.extract_commit(top, sha, base)
    base_files = arms.python_files(os.path.join(base, inside))
    edits = arms.changed(base_files, tree_files)
    a = Arm(
        "A",
        f"{ref} ({short})",
        os.path.normpath(os.path.join(base, inside)),
        arms.code_hash(base_files),
        [],
    )
    b = Arm(
        "B",
        "the working tree",
        os.path.normpath(os.path.join(tree, inside)),
        arms.code_hash(tree_files),
        [],
    )
    return a, b, edits


def probe(arm, argv, threads, cache, resolve_dtype=False, recipes=None):
    """What the arm would train (support/arm_probe.py in its folder), kept in the cache.
    threads 0: torch's own choice; recipes: the default recipe by device, for it to pick."""
    request = {"argv": argv, "resolve_dtype": resolve_dtype, "recipes": recipes}
    key = compare_runs.run_key(arm.code, request, 0, threads)
    path = os.path.join(cache, "probes", f"{key}.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')",
            PROBE,
            json.dumps(request),
        ],
        cwd=arm.folder,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        line = said[-1].removeprefix("error: ") if said else done.stderr.strip()[-300:]
        where = f"arm {arm.name}, {arm.label}"
        if done.returncode == 2:
            raise CompareError(f"{where}: {line}")
        raise CompareFailed(f"{where}, fails before training: {line}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(found, f)
    return found


def hold_equal(a, b, forced_fused):
    """The settings held equal across the arms, set last in each arm's argv: the dtype
    'auto' resolves to for A's model, compile as 'None' resolves, and the attention path.
    Returns the words that describe them."""
    dtype = {}
    for arm in (a, b):
        own = arm.probe["settings"]["dtype"]
        dtype[arm.name] = a.probe["dtype"] if own == "auto" else own
        arm.argv = with_keys(arm.argv, dtype=dtype[arm.name], compile=arm.probe["compile"])
    why = a.probe["dtype_why"] if a.probe["settings"]["dtype"] == "auto" else "as set"
    return {
        "dtype": describe(dtype["A"], dtype["B"], f" ({why})"),
        "attention": describe(
            path_name(a.probe["fused"] and not forced_fused),
            path_name(b.probe["fused"] and not forced_fused),
        ),
        "compile": describe(on_off(a.probe["compile"]), on_off(b.probe["compile"])),
        "device": describe(a.probe["device"], b.probe["device"]),
    }


def with_keys(argv, **values):
    """argv with --key=value for each of values, last (the last word wins), and any earlier
    --key=... of those keys left out."""
    kept = [w for w in argv if w.partition("=")[0].removeprefix("--") not in values]
    return kept + [f"--{key}={value}" for key, value in values.items()]


def path_name(fused):
    if fused:
        return "fused kernel"
    return "written out (attention(), --fused=False)"


def on_off(flag):
    return "on" if flag else "off"


def describe(a, b, note=""):
    if a == b:
        return f"{a}{note}"
    return f"A {a}, B {b} (the arms' settings differ)"


# -----------------------------------------------------------------------------
# The runs


def machine(device):
    """The machine the runs train on, in words: the CPU, its cores and its bfloat16
    instructions, and the GPU where the runs use one (its name, as arm A's check found it)."""
    name = cpuinfo(("model name", "Model", "Hardware")) or platform.processor()
    flags = set(cpuinfo(FLAG_FIELDS).split())
    native = [flag for flag in ("avx512_bf16", "amx_bf16", "amx_tile") if flag in flags]
    words = f"{name or platform.machine()}, {os.cpu_count()} cores, bf16 in hardware: "
    words += ", ".join(native) or "none"
    if device:
        words = f"{device}; {words}"
    return words


def busy_now(watch):
    """A line saying the machine is busy before the runs start, or None: another train.py,
    or other processes taking more than BUSY_CORES while the arms were made and checked
    (watch: a compare_runs.Watch of this process, started then)."""
    others = compare_runs.other_trainers(set())
    taken = watch.result()["other_cores"]
    if others:
        return (
            f"the machine is busy: another train.py is running ({others[0][:100]}); the runs "
            "will be slower and their step times not comparable (their losses are)"
        )
    if taken is not None and taken > compare_runs.BUSY_CORES:
        return (
            f"the machine is busy: other processes took {taken:.1f} of its "
            f"{os.cpu_count()} cores just now; the step times may not be comparable "
            "(the losses are)"
        )
    return None


def run_line(arm, i, seed, record, trained):
    how = "trained" if trained else "kept"
    busy = ""
    if compare_runs.busy(record):
        machine = record["machine"]
        busy = f"; busy: others took {machine['other_cores']} cores"
        if machine["other_trainers"]:
            busy = "; busy: another train.py ran"
    step = f"{record['ms_per_iter']:.1f} ms/iter" if record["ms_per_iter"] else "no step time"
    print(
        f"{arm.name}{i + 1} seed {seed}: val {record['val_loss']:.4f} "
        f"({record['iters']} iters, {step}, {how}{busy})",
        flush=True,
    )


def run_pairs(cfg, a, b, cache, threads):
    """The pairs, A1 B1 B2 A2 A3 B3 ..., each run kept or trained. Returns (the pairs
    finished, whether Ctrl-C stopped it)."""
    pairs = []
    try:
        for i in range(cfg.pairs):
            pair = {}
            order = ((a, 0), (b, cfg.seed_offset))
            # every other pair runs B first: where the machine's speed drifts through the
            # runs, a clock-bound run's iters drift with it, and the second run of every pair
            # would gain (or lose) them; alternating cancels a steady drift over two pairs
            if i % 2 == 1:
                order = order[::-1]
            for arm, offset in order:
                seed = cfg.seed + i + offset
                argv = with_keys(arm.argv, seed=seed)
                key = compare_runs.run_key(arm.code, argv, seed, threads)
                record = compare_runs.kept(cache, key)
                fresh = record is None
                if fresh:
                    try:
                        record = compare_runs.train(arm.folder, argv, cache, key, threads)
                    except compare_runs.RunFailed as e:
                        raise CompareFailed(
                            f"arm {arm.name}, {arm.label}, failed at seed {seed}: {e.line}; "
                            f"its output is in {e.output}; the runs that finished are kept "
                            f"in {cache}, and the command again trains only the others"
                        ) from None
                record["seed"] = seed
                record["trained_now"] = fresh  # by this command, not kept from before
                run_line(arm, i, seed, record, fresh)
                pair[arm.name] = record
            pairs.append(pair)
    except KeyboardInterrupt:
        return pairs, True
    return pairs, False


# -----------------------------------------------------------------------------
# The report


def runs(n):
    if n == 1:
        return "1 run"
    return f"{n} runs"


def summary(cfg, a, b, pairs):
    """The statistics of the finished pairs, as compare.json holds them."""
    loss_a = [p["A"]["val_loss"] for p in pairs]
    loss_b = [p["B"]["val_loss"] for p in pairs]
    result = compare_stats.paired(loss_a, loss_b)
    steps = {}
    for name in ("A", "B"):
        times = [p[name]["ms_per_iter"] for p in pairs if p[name]["ms_per_iter"]]
        steps[name] = sorted(times)[len(times) // 2] if times else None
    # the step time's ratio B/A: its pairs' log ratios, their mean and interval, as for the
    # loss (a pair's two runs ran one after the other, on the machine as it was then)
    timed = [p for p in pairs if p["A"]["ms_per_iter"] and p["B"]["ms_per_iter"]]
    speed = compare_stats.paired(
        [math.log(p["A"]["ms_per_iter"]) for p in timed],
        [math.log(p["B"]["ms_per_iter"]) for p in timed],
    )
    ratio = None
    if timed:
        ratio = {"ratio": math.exp(speed.mean), "low": None, "high": None}
    if speed.low is not None:
        ratio.update(low=math.exp(speed.low), high=math.exp(speed.high))
    same_batches = [p["A"]["data_generator"] == p["B"]["data_generator"] for p in pairs]
    iters = {name: sorted(p[name]["iters"] for p in pairs)[len(pairs) // 2] for name in "AB"}
    seconds = {name: compare_stats.mean([p[name]["seconds"] for p in pairs]) for name in "AB"}
    return {
        "pairs": len(pairs),
        "loss": {"A": loss_a, "B": loss_b},
        "mean": {"A": compare_stats.mean(loss_a), "B": compare_stats.mean(loss_b)},
        "sd": {"A": compare_stats.sample_sd(loss_a), "B": compare_stats.sample_sd(loss_b)},
        "difference": dataclasses.asdict(result),
        "unpaired_sd": compare_stats.unpaired_sd(loss_a, loss_b),
        "verdict": compare_stats.verdict(result),
        "ms_per_iter": steps,
        "step_ratio": ratio,
        "params": {"A": a.probe["params"], "B": b.probe["params"]},
        "same_batches": same_batches,
        "iters": iters,
        "train_seconds": seconds,
        "busy_runs": sum(compare_runs.busy(p[n]) for p in pairs for n in ("A", "B")),
    }


def number(value, digits=4):
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def print_report(cfg, a, b, pairs, stats):
    rows = [("seed", f"A: {a.label}", f"B: {b.label}", "B - A")]
    for p in pairs:
        seed = str(p["A"]["seed"])
        if p["B"]["seed"] != p["A"]["seed"]:
            seed += f" / {p['B']['seed']}"
        rows.append(
            (
                seed,
                number(p["A"]["val_loss"]),
                number(p["B"]["val_loss"]),
                f"{p['B']['val_loss'] - p['A']['val_loss']:+.4f}",
            )
        )
    d = stats["difference"]
    rows.append(
        ("mean", number(stats["mean"]["A"]), number(stats["mean"]["B"]), f"{d['mean']:+.4f}")
    )
    rows.append(("sd", number(stats["sd"]["A"]), number(stats["sd"]["B"]), number(d["sd"])))
    rows.append(("parameters", f"{stats['params']['A']:,}", f"{stats['params']['B']:,}", ""))
    ratio = ""
    if stats["step_ratio"]:
        ratio = f"B/A {stats['step_ratio']['ratio']:.2f}x"
    rows.append(
        (
            "ms per iter",
            number(stats["ms_per_iter"]["A"], 1),
            number(stats["ms_per_iter"]["B"], 1),
            ratio,
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    print()
    print("whole-val loss (nats per token) of each run:")
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if d["low"] is not None:
        print(
            f"paired difference B - A: {d['mean']:+.4f} nats, 95% CI {d['low']:+.4f} to "
            f"{d['high']:+.4f}, t = {d['t']:.2f} with {d['n'] - 1} df, p = "
            f"{compare_stats.p_text(d['p'])}"
        )
    step = stats["step_ratio"]
    if step and step["low"] is not None:
        print(
            f"step time B/A: {step['ratio']:.2f}x, 95% CI {step['low']:.2f} to "
            f"{step['high']:.2f} (the pairs' ratios)"
        )
    if stats["unpaired_sd"] is not None and d["sd"] is not None:
        print(
            f"pairing: the paired differences' sd is {d['sd']:.4f}; unpaired runs' "
            f"(B_j - A_i, i != j) {stats['unpaired_sd']:.4f}"
        )
    print(batches_line(cfg, stats["same_batches"], stats["iters"]))
    if stats["busy_runs"]:
        spoilt = "their step times are not comparable (their losses are)"
        if cfg.minutes:
            spoilt = "their step times are not comparable, nor, in a time budget, their losses"
        print(
            f"busy: {stats['busy_runs']} of {2 * stats['pairs']} runs shared the machine with "
            f"other work: {spoilt}"
        )
    print(f"verdict: {stats['verdict']}")
    speed = speed_line(cfg, stats)
    if speed:
        print(speed)


def batches_line(cfg, same, iters):
    if cfg.seed_offset:
        return f"batches: unpaired (--seed_offset={cfg.seed_offset}): each run drew its own"
    if cfg.minutes:
        return (
            "batches: the same sequence for the two runs of a pair, each to where its time "
            f"ran out (iters, median: A {iters['A']}, B {iters['B']})"
        )
    if all(same):
        return (
            "batches: the two runs of each pair drew the same batches "
            "(their data generators ended in the same state)"
        )
    which = ", ".join(str(i + 1) for i, s in enumerate(same) if not s)
    return (
        f"batches: the runs of pair {which} drew different batches (their batch_size, "
        "block_size, iters or the code's draws differ)"
    )


def speed_line(cfg, stats):
    """Where the arm that wins per step is slower per step, by an interval that leaves 1
    out, or the other way round: the command that compares them at equal time."""
    step = stats["step_ratio"]
    d = stats["difference"]
    if cfg.minutes or step is None or step["low"] is None:
        return None
    if d["p"] is None or d["p"] >= compare_stats.ALPHA:
        return None
    # A's minutes of training, to the half minute above
    minutes = max(0.5, math.ceil(stats["train_seconds"]["A"] / 30) / 2)
    then = f"compare at equal time with --minutes={minutes:g} to find out"
    b_better = d["mean"] < 0
    if b_better and step["low"] > 1:
        return (
            f"speed: B is better per step but each of its steps takes {step['ratio']:.2f}x "
            f"A's: in the same time it trains fewer; {then}"
        )
    if not b_better and step["high"] < 1:
        return (
            f"speed: B is worse per step but its steps take {step['ratio']:.2f}x A's: in the "
            f"same time it trains more; {then}"
        )
    return None


def save_picture(a, b, pairs, stats, path):
    """Each arm's val curve, its mean over the seeds and the spread (min to max), with the
    whole-val losses at the end; beside it each pair's difference and the interval."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(11, 4.2), layout="constrained", width_ratios=[2.2, 1]
    )
    for arm, colour in ((a, "tab:blue"), (b, "tab:orange")):
        curves = [p[arm.name]["curve"] for p in pairs]
        iters = sorted({it for curve in curves for it, _ in curve})
        rows = [dict(curve) for curve in curves]
        mean = [compare_stats.mean([r[it] for r in rows if it in r]) for it in iters]
        low = [min(r[it] for r in rows if it in r) for it in iters]
        high = [max(r[it] for r in rows if it in r) for it in iters]
        left.plot(iters, mean, color=colour, label=f"{arm.name}: {arm.label}")
        left.fill_between(iters, low, high, color=colour, alpha=0.2, linewidth=0)
        ends = [(p[arm.name]["iters"], p[arm.name]["val_loss"]) for p in pairs]
        left.scatter(*zip(*ends), color=colour, marker="x", s=25, zorder=3)
    left.set_xlabel("iter")
    left.set_ylabel("val loss (nats)")
    left.set_title("val loss: mean over seeds, min to max shaded; x: whole val split", fontsize=9)
    left.legend(fontsize=8)
    # the curves' first evaluations dwarf the differences at the end
    finals = [p[n]["val_loss"] for p in pairs for n in ("A", "B")]
    spread = max(finals) - min(finals)
    top = max(max(finals) + 3 * spread + 0.05, max(finals) * 1.05)
    left.set_ylim(min(finals) - spread - 0.02, top)
    diffs = [p["B"]["val_loss"] - p["A"]["val_loss"] for p in pairs]
    right.scatter(range(1, len(diffs) + 1), diffs, color="black", s=20)
    d = stats["difference"]
    right.axhline(0, color="grey", linewidth=0.8)
    if d["low"] is not None:
        right.errorbar(
            [len(diffs) + 1],
            [d["mean"]],
            yerr=[[d["mean"] - d["low"]], [d["high"] - d["mean"]]],
            fmt="o",
            color="tab:red",
            capsize=4,
        )
    right.set_xticks(
        range(1, len(diffs) + 2), [*map(str, range(1, len(diffs) + 1)), "mean"], fontsize=8
    )
    right.set_xlabel("pair")
    right.set_ylabel("B - A (nats; below 0: B better)")
    right.set_title("each pair's difference, and the mean's 95% CI", fontsize=9)
    fig.suptitle(f"A: {a.label}, B: {b.label}. {stats['verdict']}", fontsize=9, wrap=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(cfg, a, b, pairs, stats, header, cache, interrupted):
    """compare.json and compare.png into the cache folder; their paths."""
    data = {
        "command": ["python", "compare.py", *sys.argv[1:]],
        "settings": dataclasses.asdict(cfg),
        "arms": {
            arm.name: {
                "label": arm.label,
                "code": arm.code,
                "argv": arm.argv,
                "probe": arm.probe,
            }
            for arm in (a, b)
        },
        "held_equal": header,
        "runs": pairs,
        "statistics": stats,
        "interrupted": interrupted,
    }
    json_path = os.path.join(cache, "compare.json")
    png_path = os.path.join(cache, "compare.png")
    with open(json_path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(json_path + ".tmp", json_path)
    save_picture(a, b, pairs, stats, png_path)
    return json_path, png_path


# -----------------------------------------------------------------------------
# The command


def main(cfg, shared):
    check(cfg)
    cache = os.path.abspath(cfg.out_dir)
    writable(cache)
    # what other processes take while the arms are made and checked: is the machine busy?
    watch = compare_runs.Watch(os.getpid())
    top = arms.repository(ROOT)
    base, words = recipe(cfg, shared)
    if not any(w.startswith("--data_root=") for w in words):
        # one prepared dataset for both arms: the project's, not one per snapshot
        words.append(f"--data_root={os.path.join(ROOT, 'data')}")
    with tempfile.TemporaryDirectory(prefix="compare-") as scratch:
        a, b, edits = snapshots(cfg, top, ROOT, scratch, cache)
        # each arm named with its own settings too: two arms of the same code are told
        # apart in the header, the table, the figure and compare.json alike
        a.label += own_words(cfg.a)
        b.label += own_words(cfg.b)
        same = a.code == b.code and (cfg.a or "") == (cfg.b or "")
        if same and not cfg.seed_offset:
            if cfg.a is None and cfg.b is None:
                raise CompareError(
                    f"the working tree's code is the same as {a.label}: nothing to compare; "
                    "edit model.py (or any .py file) first, or pass --ref=REF for another "
                    'commit, or --a="--key=value" --b="--key=value" for two settings'
                )
            raise CompareError(
                "--a and --b give the same settings on the same code: nothing to compare"
            )
        for arm, own in ((a, cfg.a), (b, cfg.b)):
            arm.argv = in_arm((base or []) + words + shlex.split(own or ""), arm.folder, ROOT)
        forced = arms.written_out_edits(a.folder, b.folder)
        if forced:
            for arm in (a, b):
                arm.argv = with_keys(arm.argv, fused=False)
        # A's check picks the default recipe by the hardware, and the threads torch takes
        recipes = None
        if base is None:
            recipes = {"cpu": CPU_RECIPE, "cuda": GPU_RECIPE}
        a.probe = probe(a, a.argv, cfg.threads, cache, resolve_dtype=True, recipes=recipes)
        if base is None:
            # the default recipe's path is the project's, inside each arm, wherever the user is
            for arm in (a, b):
                arm.argv = a.probe["recipe"] + arm.argv
        threads = cfg.threads or a.probe["threads"]
        b.probe = probe(b, b.argv, threads, cache)
        header = hold_equal(a, b, forced)
        for arm in (a, b):
            settings = arm.probe["settings"]
            if cfg.evals and not settings["max_time"]:
                interval = max(1, -(-settings["max_iters"] // cfg.evals))
                arm.argv = with_keys(arm.argv, eval_interval=interval)
            # the loss of record: the whole val split
            arm.argv = with_keys(arm.argv, eval_full_val=True)
        header["threads"] = threads
        header["machine"] = machine(a.probe.get("device_name"))
        print_header(cfg, a, b, edits, forced, header, threads, watch)
        pairs, interrupted = run_pairs(cfg, a, b, cache, threads)
    if interrupted:
        print(f"\nstopped by Ctrl-C: {len(pairs)} of {cfg.pairs} pairs finished", flush=True)
    if not pairs:
        print(f"no pair finished: nothing to report; the finished runs are kept in {cache}")
        return
    stats = summary(cfg, a, b, pairs)
    print_report(cfg, a, b, pairs, stats)
    json_path, png_path = write_report(cfg, a, b, pairs, stats, header, cache, interrupted)
    now = sum(p[name]["trained_now"] for p in pairs for name in ("A", "B"))
    print(f"{runs(now)} trained, {2 * len(pairs) - now} kept; wrote {json_path} and {png_path}")
    if interrupted:
        print("the same command again trains the pairs not yet finished")


def print_header(cfg, a, b, edits, forced, header, threads, watch):
    if forced:
        print(
            f"{', '.join(f'{name}()' for name in forced)} differs between the arms: both "
            "train with --fused=False, the attention written out, since the fused kernel "
            "never runs it"
        )
    code = ""
    if a.code != b.code:
        code = f": {', '.join(edits[:4])}{' ...' if len(edits) > 4 else ''} changed"
    print(f"A: {a.label}")
    print(f"B: {b.label}{code}")
    shared = " ".join(shlex.quote(w) for w in a.argv if not w.startswith("--data_root="))
    print(f"A trains: python train.py {shared}")
    if b.argv != a.argv:
        shared = " ".join(shlex.quote(w) for w in b.argv if not w.startswith("--data_root="))
        print(f"B trains: python train.py {shared}")
    seeds = f"seeds {cfg.seed} to {cfg.seed + cfg.pairs - 1}"
    if cfg.pairs == 1:
        seeds = f"seed {cfg.seed}"
    if cfg.seed_offset:
        seeds += f" (B's shifted by {cfg.seed_offset}: unpaired)"
    pairs = f"{cfg.pairs} pairs"
    if cfg.pairs == 1:
        pairs = "1 pair"
    print(f"{pairs}, {seeds}, in the order A1 B1 B2 A2 A3 B3 ...")
    plural = "s" if threads > 1 else ""
    print(f"machine: {header['machine']}")
    print(
        f"held equal: {threads} thread{plural}, dtype {header['dtype']}, attention "
        f"{header['attention']}, compile {header['compile']}, device {header['device']}"
    )
    busy = busy_now(watch)
    if busy:
        print(busy)
    print(flush=True)


def own_words(words):
    if words is None:
        return ""
    return f" with {words!r}"


def writable(folder):
    """Make the cache folder, or a CompareError before any work is spent."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise CompareError(
            f"cannot write into {folder} ({e.strerror or e}); pass --out_dir=DIR"
        ) from None


def run(argv):
    """The command: what `python compare.py ...` exits with, as every command's (cli.py).
    It loads neither torch nor the working tree's model.py, which is arm B's code to check
    in a process of its own: a hack that fails to import is B's one line."""
    own, shared = split_argv(argv)
    if wants_help(own):
        from support.help import describe_settings, print_help

        print_help(__doc__, describe_settings(Settings))
        return 0
    try:
        main(parse_settings(Settings, own, allow_files=False), shared)
    except (ConfigError, CompareError, arms.ArmError) as e:
        error(e)
        return BAD_INPUT
    except CompareFailed as e:
        error(e)
        return FAILED
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return INTERRUPTED
    except OSError as e:
        # the cache or a snapshot that cannot be written after the work began (a full disk)
        error(f"cannot read or write {e.filename or 'a file'} ({e.strerror or e})")
        return FAILED
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
