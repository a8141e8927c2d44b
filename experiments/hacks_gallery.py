"""
A gallery of hacks, measured: the lectures' choices and this project's own, each compared with
the CPU recipe by compare.py, and written up as docs/hacks.md.

    python -m experiments.hacks_gallery                        # every row
    python -m experiments.hacks_gallery --rows=one_head,nope   # some of them
    python -m experiments.hacks_gallery --out_dir=docs         # docs/hacks.md and hacks.json

Each row is one run of the command as a user types it, in a clone of this repository at
--commit (HEAD by default): a change that is a setting compares two settings
(`python compare.py --a="--n_head=4" --b="--n_head=1"`), and one that is not is an edit to
model.py, a patch of experiments/hacks/ applied with `git apply` in the clone, compared
against the clone's HEAD (`python compare.py`). The recipe is the command's default
(config/shakespeare_cpu.py on a CPU, 4 pairs). The driver adds only --data_root (the corpus
prepared once, in this checkout) and --out_dir (the row's cache).

Each row's clone, its cache of finished runs and the command's output go into
--work_dir/NAME/ (default out-experiments/hacks_gallery/): the same rows again, at the same
commit, train nothing and only rewrite the page. hacks.md and hacks.json go into --out_dir
(the same folder by default; docs/ only when given --out_dir=docs).
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses
import json
import subprocess
import time

from experiments import ROOT, SCRATCH
from experiments.comparing import clone, command, compare, cpu_class
from support import compare_stats

PATCHES = os.path.join("experiments", "hacks")


@dataclasses.dataclass
class Settings:
    out_dir: str = os.path.join(SCRATCH, "hacks_gallery")  # hacks.md, hacks.json; docs: shipped
    work_dir: str = os.path.join(SCRATCH, "hacks_gallery")  # the clones, caches and outputs
    rows: str = ""  # the rows to run, by name, comma-separated; "": all
    commit: str = "HEAD"  # the code every row starts from
    pairs: int = 0  # pairs of runs per row; 0: the command's default (4)


@dataclasses.dataclass
class Hack:
    """One row of the gallery: what B is against A, and how the command is told it."""

    name: str  # the row's key, and its folder under work_dir
    title: str  # B against A, in words
    a: str | None = None  # arm A's settings (--a); None with b None: the clone's HEAD
    b: str | None = None  # arm B's settings (--b)
    patch: str | None = None  # the edit to model.py, experiments/hacks/NAME.patch
    touches: tuple = ()  # the functions of model.py the patch changes, and nothing else
    more: tuple = ()  # compare.py's other options for the row
    note: str = ""  # what to read into the row, beyond its verdict


ROWS = [
    Hack(
        "scores_over_d",
        "scores divided by d, not sqrt(d)",
        patch="scores_over_d.patch",
        touches=("attention",),
        note=(
            "The lectures' argument for sqrt(d) is about queries and keys of unit-variance "
            "entries, where q . k has variance d. The recipe RMS-normalises its queries and "
            "keys (QK-norm), which bounds q . k by d = 32 (the head size) whatever the scale, "
            "so dividing by d rather than sqrt(d) leaves every score within +/-1: the softmax "
            "is kept from saturating, and its weights are held near uniform instead. "
            "docs/why_sqrt_d.md measures the argument itself."
        ),
    ),
    Hack(
        "scores_unscaled",
        "scores divided by 1 (not scaled at all)",
        patch="scores_unscaled.patch",
        touches=("attention",),
        note=(
            "Unscaled, with QK-norm, a score can reach d = 32 in size: where the sqrt(d) "
            "recipe's scores stay within +/-5.7, these can saturate the softmax."
        ),
    ),
    Hack("one_head", "one head of 128 instead of four of 32", a="--n_head=4", b="--n_head=1"),
    Hack(
        "nope",
        "no position information (NoPE) against rotary",
        patch="nope.patch",
        touches=("GPT.embed",),
        note=(
            "The patch drops both ways GPT.embed gives positions: the rotary tables and the "
            "learned table (the recipe has no learned table with rope on). A causal model "
            "still learns where it is: the mask lets position t see t + 1 tokens, and "
            "counting them is information (Haviv et al. 2022, Kazemnejad et al. 2023)."
        ),
    ),
    Hack(
        "learned_positions",
        "learned position embeddings against rotary",
        a="--rope=True",
        b="--rope=False",
        note="B has a learned table of 64 positions x 128 (8,192 parameters more).",
    ),
    Hack("qk_norm_off", "QK-norm off", a="--qk_norm=True", b="--qk_norm=False"),
    Hack(
        "qk_norm_off_equal_time",
        "QK-norm off, at equal time (half a minute of training each)",
        a="--qk_norm=True",
        b="--qk_norm=False",
        more=("--minutes=0.5",),
        note=(
            "The row above's speed line asked for it: each run trains 30 s by its own clock, "
            "the learning rate decaying over that time, so the faster arm takes more steps. "
            "Under a time budget the losses depend on the machine's speed too: a busy run "
            "spoils them, not only its step time."
        ),
    ),
    Hack("gelu", "GELU against ReLU^2", a="--activation=relu2", b="--activation=gelu"),
    Hack(
        "post_layernorm",
        "post-LayerNorm against pre-LayerNorm",
        patch="post_layernorm.patch",
        touches=("Block.forward",),
        note=(
            "Block.forward as the 2017 transformer has it: x = LN(x + f(x)). The final "
            "LayerNorm (ln_f) stays, so the last block's output is normalised twice: the "
            "second is nearly the identity, up to its gain."
        ),
    ),
    Hack(
        "sliding_window",
        "a sliding window of 32 (the context is 64)",
        a="--sliding_window=None",
        b="--sliding_window=32",
    ),
    Hack(
        "linear_attention",
        "linear attention against softmax",
        a="--attention=softmax",
        b="--attention=linear",
        note="docs/linear_attention.md has what linear attention computes here.",
    ),
    Hack(
        "gqa_2",
        "grouped-query attention, 2 key/value heads for 4 query heads",
        a="--n_kv_head=4",
        b="--n_kv_head=2",
    ),
    Hack(
        "gqa_1",
        "multi-query attention, 1 key/value head for 4 query heads",
        a="--n_kv_head=4",
        b="--n_kv_head=1",
    ),
    Hack(
        "no_causal_mask",
        "the causal mask removed (a leak)",
        patch="no_causal_mask.patch",
        touches=("causal_mask",),
        note=(
            "This number is meaningless as a measure of a model: without the mask, position "
            "t attends to position t + 1, which holds the very token it is asked to predict, "
            "in training and in the evaluation alike. The loss falls towards 0 because the "
            "answer is in the input, and such a model cannot generate: at sampling time the "
            "next token does not exist yet. The command cannot tell a leak from a gain; it "
            "reports what the val loss did. A loss far below what the recipe reaches (about "
            "1.83 nats) is the sign to look for a leak first."
        ),
    ),
    Hack(
        "kv_shift",
        "KV shifting (each key and value mixed with the previous position's)",
        a="--kv_shift=False",
        b="--kv_shift=True",
        note=(
            "Xu et al. 2024 (arXiv 2411.19574): per key/value head, k_i' = a1 k_i + a2 k_(i-1) "
            "and v_i' = b1 v_i + b2 v_(i-1), learned from (1, 0), the plain model. Adds 4 "
            "parameters per key/value head and layer (48 here)."
        ),
    ),
    Hack(
        "smeared_keys",
        "smeared keys (keys alone, a1 + a2 = 1), against the plain model",
        a="--kv_shift=False",
        b="--kv_shift=True",
        patch="smeared_keys.patch",
        touches=("MultiHeadAttention.shift",),
        note=(
            "Olsson et al. 2022's smeared keys: each head's key k_i' = a k_i + (1 - a) "
            "k_(i-1), a learned per head (here directly, from 1; theirs through a sigmoid), "
            "the values left as they are. The patch changes only what --kv_shift=True does, "
            "so arm A (--kv_shift=False) is the plain model."
        ),
    ),
]


# What the runs of one commit showed, read after they ran: a row's verdict alone does not
# say where it surprises or what would test it further. Numbers in them are that commit's
# runs, so the page shows them only for that commit (another commit's runs get none).
FOUND_AT = "1bf917ef2166c82fa11a44bb537d98b5903ee95d"
FOUND = {
    "qk_norm_off_equal_time": (
        "What it measured: B took 369-430 iters in its 30 s and A 314-430, and B still "
        "ended worse on every seed (+0.014 to +0.091), but the interval includes 0. The "
        "clock let the machine's speed in: the same recipe's step ranged from 66 to 98 ms "
        "between runs on the quiet machine, so A's losses spread over 1.697-1.747, eight "
        "times the 0.0025 of the fixed 200 iters. Per step, the row above resolves "
        "QK-norm's effect; at equal time, 4 pairs here cannot, and about 9 would resolve "
        "+/-0.027."
    ),
    "sliding_window": (
        "The one row where a restriction helped, and the weakest claim of the page: with "
        "16 rows, about one claim at p < 0.05 is expected by chance even if no change did "
        "anything, and this row's p = 0.017 is the nearest to that line. Read it as a lead: "
        "most heads of the models in docs/heads.md look at the last few characters, which "
        "a window of 32 does not cut. What would test it: the same command with --pairs=12 "
        "(it keeps these 8 runs and trains 16 more), then the 15-minute recipe, whose "
        "context of 256 a window of 32 cuts far more."
    ),
    "one_head": (
        "One head of 128 spread its seeds the most of any row (1.824 to 1.851, sd 0.011 "
        "against A's 0.0025), so pairing bought nothing here (paired sd 0.0108, unpaired "
        "0.0106): the interval is wide because B is erratic, not because the arms agree."
    ),
    "no_causal_mask": (
        "What it measured: 0.042 nats on every seed, where the recipe reaches 1.83, with "
        "the most certain verdict of the page (p = 1.6e-09). The most confident "
        '"better" is a bug.'
    ),
    "kv_shift": (
        "At 200 iters of a 3-layer model KV shifting is not resolved from the plain model "
        "(4 pairs resolve +/-0.010). Its paper reports its gains on induction tasks "
        "and on far larger models trained far longer; a 15-minute run is where to look "
        "next, at equal time, as B's step (1.18x, interval 0.96 to 1.45) may cost it iters."
    ),
    "smeared_keys": (
        "Not resolved either, though these 4 pairs resolve +/-0.0024 nats, the narrowest "
        "interval of the page: at this size, smearing the keys neither helps nor hurts by "
        "more than about 0.002 nats. In Olsson et al. it lets a one-layer-deep model form "
        "induction heads; config/induction.py's task is where that would show."
    ),
}


# -----------------------------------------------------------------------------
# One row: the command in a clone


def command_words(hack, pairs=0):
    """compare.py's options for the row, as a list of argv words."""
    words = []
    if hack.a is not None:
        words.append(f"--a={hack.a}")
    if hack.b is not None:
        words.append(f"--b={hack.b}")
    words += hack.more
    if pairs:
        words.append(f"--pairs={pairs}")
    return words


def command_line(hack, pairs=0):
    """The row's command as a user types it in the project, the patch applied first."""
    words = []
    for word in command_words(hack, pairs):
        key, _, value = word.partition("=")
        if key in ("--a", "--b"):
            word = f'{key}="{value}"'
        words.append(word)
    line = " ".join(["python compare.py", *words])
    if hack.patch:
        line = f"git apply {PATCHES}/{hack.patch} && {line}"
    return line


def run_row(hack, cfg, sha):
    """The row's command in a fresh clone at sha, the patch applied: its report (the
    command's compare.json), output and wall seconds, or a one-line failure."""
    folder = os.path.join(os.path.abspath(cfg.work_dir), hack.name)
    repo = clone(os.path.join(folder, "repo"))
    subprocess.run(["git", "-C", repo, "checkout", "-q", "--detach", sha], check=True)
    if hack.patch:
        patch = os.path.join(ROOT, PATCHES, hack.patch)
        subprocess.run(["git", "-C", repo, "apply", patch], check=True)
    argv = [*command_words(hack, cfg.pairs), f"--data_root={os.path.join(ROOT, 'data')}"]
    output = os.path.join(folder, "output.txt")
    if os.path.exists(output):
        os.remove(output)
    try:
        report, text, wall = compare(repo, argv, os.path.join(folder, "cache"), output)
    except SystemExit as e:
        # comparing.compare stops with the command's last line
        return None, str(e.code), 0.0
    return report, text, wall


def first_wall(folder, report, wall):
    """The command's wall seconds when it trained every run of the row: this call's where it
    did (kept in timing.json), else the kept one; None where neither is known."""
    path = os.path.join(folder, "timing.json")
    trained = [p[arm]["trained_now"] for p in report["runs"] for arm in ("A", "B")]
    if all(trained):
        with open(path, "w") as f:
            json.dump({"wall_s": round(wall, 1)}, f)
        return round(wall, 1)
    try:
        with open(path) as f:
            return json.load(f)["wall_s"]
    except (OSError, ValueError, KeyError):
        return None


def row_result(hack, report, text="", pairs=0):
    """What the page shows of one row, from the command's compare.json (report) and output."""
    stats = report["statistics"]
    d = stats["difference"]
    runs = report["runs"]
    # the command's first line, where it says that it trains both arms written out
    first = text.splitlines()[:1]
    first_line = None
    if first and "differs between the arms" in first[0]:
        first_line = first[0]
    # where the better arm per step is the slower, or the worse the faster: the speed line
    speed = [line for line in text.splitlines() if line.startswith("speed: ")][:1]
    patch = None
    if hack.patch:
        patch = f"{PATCHES}/{hack.patch}"
    return dict(
        name=hack.name,
        title=hack.title,
        command=command_line(hack, pairs),
        patch=patch,
        touches=list(hack.touches),
        written_out=all("--fused=False" in report["arms"][arm]["argv"] for arm in ("A", "B")),
        first_line=first_line,
        held_equal=report["held_equal"],
        pairs=stats["pairs"],
        seeds=[p["A"]["seed"] for p in runs],
        loss=stats["loss"],
        mean=stats["mean"],
        difference={key: d[key] for key in ("mean", "sd", "low", "high", "p", "t")},
        verdict=stats["verdict"],
        speed=speed,
        step_ratio=stats["step_ratio"],
        ms_per_iter=stats["ms_per_iter"],
        params=stats["params"],
        busy_runs=stats["busy_runs"],
        other_cores=max(p[arm]["machine"]["other_cores"] or 0 for p in runs for arm in "AB"),
        runs_wall_s=round(sum(p[arm]["wall_s"] for p in runs for arm in ("A", "B")), 1),
        note=hack.note,
    )


# -----------------------------------------------------------------------------
# The page


def signed(value):
    return f"{value:+.4f}"


def interval_text(d):
    if d["low"] is None:
        return "-"
    return f"{signed(d['mean'])} ({signed(d['low'])} to {signed(d['high'])})"


def ratio_text(step):
    if not step:
        return "-"
    if step["low"] is None:
        return f"{step['ratio']:.2f}x"
    return f"{step['ratio']:.2f}x ({step['low']:.2f} to {step['high']:.2f})"


def params_text(params):
    if params["A"] == params["B"]:
        return f"{params['A']:,} both"
    return f"{params['A']:,} / {params['B']:,}"


def p_cell(d):
    if d["p"] is None:
        return "-"
    return compare_stats.p_text(d["p"])


def table(rows):
    lines = [
        "| row | B against A | verdict | B - A, nats (95% CI) | p | step B/A (95% CI) | "
        "parameters A / B |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        d = row["difference"]
        word = row["verdict"].split(":")[0].split(" by ")[0]
        lines.append(
            f"| [{row['name']}](#{row['name']}) | {row['title']} | {word} | "
            f"{interval_text(d)} | {p_cell(d)} | {ratio_text(row['step_ratio'])} | "
            f"{params_text(row['params'])} |"
        )
    return lines


def patch_text(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read().rstrip("\n")


def section(row):
    """One row's detail: the command, the edit, what the command said, the numbers."""
    lines = [f'<a id="{row["name"]}"></a>', f"### {row['title']}", "", "```sh", row["command"]]
    lines += ["```", ""]
    if row["patch"]:
        changed = ", ".join(f"`{name}`" for name in row["touches"])
        lines += [f"The edit, `{row['patch']}` (model.py's {changed} only):", "", "```diff"]
        lines += [patch_text(row["patch"]), "```", ""]
    if row["first_line"]:
        lines += [
            "The edit is inside a function only the written-out attention runs, so the "
            "command trained both arms with `--fused=False`; its first line:",
            "",
            f"> {row['first_line']}",
            "",
        ]
    a = ", ".join(f"{x:.4f}" for x in row["loss"]["A"])
    b = ", ".join(f"{x:.4f}" for x in row["loss"]["B"])
    seeds = f"seeds {row['seeds'][0]}-{row['seeds'][-1]}"
    said = [f"verdict: {row['verdict']}", *row["speed"]]
    lines += ["The verdict, as the command printed it:", "", "```", *said, "```", ""]
    step = row["ms_per_iter"]
    busy = ""
    if row["busy_runs"]:
        busy = (
            f" {row['busy_runs']} of {2 * row['pairs']} runs shared the machine with other "
            f"work (up to {row['other_cores']} of a core): their step times are not comparable."
        )
    lines.append(
        f"Whole-val loss, {seeds}: A {a} (mean {row['mean']['A']:.4f}); B {b} (mean "
        f"{row['mean']['B']:.4f}). B - A {interval_text(row['difference'])}, p = "
        f"{p_cell(row['difference'])}. Step time {step_text(step)}, B/A "
        f"{ratio_text(row['step_ratio'])}; parameters {params_text(row['params'])}; "
        f"attention path {row['held_equal']['attention']}.{busy}"
    )
    if row["note"]:
        lines += ["", row["note"]]
    if row.get("found"):
        lines += ["", row["found"]]
    lines.append("")
    return lines


def step_text(step):
    if step["A"] is None or step["B"] is None:
        return "not measured"
    return f"{step['A']:.1f} / {step['B']:.1f} ms per iter (A / B, medians)"


def page(result):
    """docs/hacks.md from hacks.json's data."""
    rows = result["rows"]
    if result["commit"] == FOUND_AT:
        rows = [dict(row, found=FOUND.get(row["name"], "")) for row in rows]
    first = rows[0]
    held = first["held_equal"]
    runs = sum(2 * row["pairs"] for row in rows)
    runs_wall = sum(row["runs_wall_s"] for row in rows)
    walls = [row["first_wall_s"] for row in rows]
    commands = ""
    if all(w is not None for w in walls):
        commands = f"; the {len(rows)} commands, {sum(walls) / 60:.0f} minutes from start to report"
    regenerate = f"python -m experiments.hacks_gallery --out_dir=docs --commit={result['commit']}"
    lines = [
        "# A gallery of hacks, measured",
        "",
        "Each row is one change to the model, the lectures' choices and this project's own, "
        "compared by [`compare.py`](benchmarks.md#did-a-hack-help-comparepy-measured-2026-12-02)"
        " as a user would run it: arm A is the CPU recipe (`config/shakespeare_cpu.py`: 3 "
        "layers, 4 heads of 32, context 64, rotary positions, QK-norm, ReLU^2, Muon, 200 "
        "iters), arm B the same with the one change; 4 pairs of runs, the two runs of a pair "
        "on the same seed, so the same batches. B - A is the whole-val loss's difference: "
        "below 0, B is better. A change that is a setting compares two settings "
        '(`--a="..." --b="..."`); one that is not is an edit to `model.py`, a small patch '
        "in `experiments/hacks/`, applied in a clone and compared against that clone's "
        "`HEAD`.",
        "",
        f"Measured on {result['date']}, at commit `{result['commit'][:10]}`, on {result['machine']}"
        f" ({held['threads']} threads per run, one run at a time), in dtype {held['dtype']}, "
        f"compile {held['compile']}, as the command held them equal in every row. The "
        f"{runs} runs took {runs_wall / 60:.0f} minutes of wall time{commands}. "
        "Regenerate the page (it reuses the kept runs of that commit, training nothing):",
        "",
        "```sh",
        regenerate,
        "```",
        "",
        "How far 4 pairs see: run to run, the recipe's loss varies by about 0.01 nats, and "
        "pairing removes most of that (docs/benchmarks.md: a paired difference's spread "
        "0.0033 against 0.0106 unpaired), but with 3 degrees of freedom an interval is "
        "about 1.6 spreads of one difference wide on each side. An effect smaller than the "
        "interval reads `no difference detected`, with the number of pairs that would "
        "resolve half that width: that is a limit of the measurement, not a finding that the "
        "change does nothing. Each verdict is what the command measured, not tuned; where "
        "one surprises, its note says what would test it further. With "
        f"{len(rows)} rows, {0.05 * len(rows):.1f} claims at p < 0.05 are expected by chance "
        "alone, where no change did anything.",
        "",
        *table(rows),
        "",
        "The step ratio is the geometric mean of the pairs' B/A ratios of the median step "
        "time, with its interval; a ratio from 4 pairs is worth only that interval (a quiet "
        "machine's steps still ranged from 60 to 84 ms, docs/benchmarks.md). Rows whose edit "
        "is inside `attention()` or `causal_mask()` train both arms written out "
        "(`--fused=False`): their step times are of that path.",
        "",
        "## The rows",
        "",
    ]
    for row in rows:
        lines += section(row)
    return "\n".join(lines).rstrip("\n") + "\n"


# -----------------------------------------------------------------------------
# The command


def chosen(names):
    if not names:
        return ROWS
    known = {hack.name: hack for hack in ROWS}
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in known]
    if unknown:
        sys.exit(f"no row {unknown[0]!r}; the rows are {', '.join(known)}")
    return [known[name] for name in wanted]


def main(cfg):
    hacks = chosen(cfg.rows)
    done = subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--verify", f"{cfg.commit}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"no commit {cfg.commit!r} in {ROOT}: pass --commit=REF")
    sha = done.stdout.strip()
    out = os.path.abspath(cfg.out_dir)
    os.makedirs(out, exist_ok=True)
    rows = []
    failed = []
    for hack in hacks:
        print(f"\n=== {hack.name}: {command_line(hack, cfg.pairs)}", flush=True)
        report, text, wall = run_row(hack, cfg, sha)
        if report is None:
            failed.append(f"{hack.name}: {text}")
            continue
        row = row_result(hack, report, text, cfg.pairs)
        folder = os.path.join(os.path.abspath(cfg.work_dir), hack.name)
        row["first_wall_s"] = first_wall(folder, report, wall)
        row["date"] = newest_run_date(os.path.join(folder, "cache"), report)
        rows.append(row)
    if failed:
        print("\nfailed rows:\n  " + "\n  ".join(failed))
    if not rows:
        sys.exit("no row finished: no page written")
    result = dict(
        commit=sha,
        machine=cpu_class(),
        date=max(row["date"] for row in rows),
        rows=rows,
        failed=failed,
    )
    with open(os.path.join(out, "hacks.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, "hacks.md"), "w") as f:
        f.write(page(result))
    minutes = sum(row["runs_wall_s"] for row in rows) / 60
    print(
        f"\nwrote {os.path.join(out, 'hacks.md')}: {len(rows)} rows, their runs "
        f"{minutes:.0f} minutes of wall time"
    )
    if failed:
        sys.exit(1)


def newest_run_date(cache, report):
    """The day the row's last run finished, from its record's time stamp."""
    times = []
    for pair in report["runs"]:
        for arm in ("A", "B"):
            path = os.path.join(cache, "runs", pair[arm]["key"], "record.json")
            times.append(os.path.getmtime(path))
    return time.strftime("%Y-%m-%d", time.localtime(max(times)))


if __name__ == "__main__":
    sys.exit(command(main, sys.argv[1:], __doc__, Settings))
