"""
compare.py under the null: the same code against itself, honest?

    python -m experiments.compare_null [--comparisons=20] [--out_dir=DIR]

Two arms of identical code and settings with identical seeds give identical runs, which
proves nothing. Here arm B's seeds are shifted (--seed_offset), so that the runs of a "pair"
differ by noise alone, as two runs of the same recipe do. Each of --comparisons comparisons
has its own seeds (no run is shared between two of them) and --pairs pairs of a short version
of the CPU recipe (config/shakespeare_cpu.py cut to --iters iters, a few seconds a run). A
comparison that claims a difference (p < 0.05) is a false positive: the goal is at most 5% of
them. Also the width of the intervals, which is what the command resolves at that size.

It runs the command in a clone of this repository at HEAD, as a new user would, with the
dataset of data/. Writes compare_null.json and compare_null.md into --out_dir (default
out-experiments/compare_null/); docs/benchmarks.md quotes them.
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses
import json
import statistics
import time

from experiments import ROOT, SCRATCH
from experiments.comparing import clone, command, compare, cpu_class
from support import compare_stats


@dataclasses.dataclass
class Settings:
    comparisons: int = 20
    pairs: int = 4
    iters: int = 40  # the recipe's 200 iters cut to this: a few seconds a run
    seed: int = 10_000  # comparison k's arm A trains seeds seed + 1000 k, + 1, ...
    offset: int = 500  # arm B's seeds are A's shifted by this
    out_dir: str = os.path.join(SCRATCH, "compare_null")


def binomial_interval(k, n, level=0.95):
    """The exact (Clopper-Pearson) interval of a rate seen k times in n: the beta
    distribution's quantiles, found by bisection on compare_stats.betainc."""

    def quantile(q, a, b):
        low, high = 0.0, 1.0
        for _ in range(100):
            mid = (low + high) / 2
            if compare_stats.betainc(a, b, mid) < q:
                low = mid
            else:
                high = mid
        return (low + high) / 2

    tail = (1 - level) / 2
    low = 0.0 if k == 0 else quantile(tail, k, n - k + 1)
    high = 1.0 if k == n else quantile(1 - tail, k + 1, n - k)
    return low, high


def main(cfg):
    out = os.path.abspath(cfg.out_dir)
    os.makedirs(out, exist_ok=True)
    repo = clone(os.path.join(out, "repo"))
    recipe = [
        f"--max_iters={cfg.iters}",
        f"--lr_decay_iters={cfg.iters}",
        f"--data_root={os.path.join(ROOT, 'data')}",
        f"--pairs={cfg.pairs}",
        f"--seed_offset={cfg.offset}",
        "--evals=0",  # no curves: the recipe's one evaluation, at the end
        "--a=",
        "--b=",
    ]
    rows = []
    start = time.perf_counter()
    for k in range(cfg.comparisons):
        seed = cfg.seed + 1000 * k
        report, _, wall = compare(
            repo, recipe + [f"--seed={seed}"], os.path.join(out, "cache"), os.path.join(out, "log")
        )
        d = report["statistics"]["difference"]
        rows.append(
            dict(
                seed=seed,
                mean=d["mean"],
                sd=d["sd"],
                low=d["low"],
                high=d["high"],
                p=d["p"],
                claimed=d["p"] < compare_stats.ALPHA,
                verdict=report["statistics"]["verdict"],
                wall_s=round(wall, 1),
                run_s=[p[a]["wall_s"] for p in report["runs"] for a in ("A", "B")],
            )
        )
    claims = sum(row["claimed"] for row in rows)
    strict = sum(row["p"] < 0.01 for row in rows)
    halves = [(row["high"] - row["low"]) / 2 for row in rows]
    runs = [s for row in rows for s in row["run_s"]]
    result = dict(
        settings=dataclasses.asdict(cfg),
        machine=cpu_class(),
        date=time.strftime("%Y-%m-%d"),
        comparisons=rows,
        claims=claims,
        claims_p01=strict,
        claim_rate_interval=binomial_interval(claims, len(rows)),
        half_width=dict(median=statistics.median(halves), low=min(halves), high=max(halves)),
        run_seconds_median=statistics.median(runs),
        wall_s=round(time.perf_counter() - start, 1),
    )
    with open(os.path.join(out, "compare_null.json"), "w") as f:
        json.dump(result, f, indent=1)
    table = markdown(result)
    with open(os.path.join(out, "compare_null.md"), "w") as f:
        f.write(table + "\n")
    print(table)


def markdown(result):
    lines = [
        "| comparison | seeds (A; B) | B - A | 95% CI | p | claimed a difference |",
        "|---|---|---|---|---|---|",
    ]
    cfg = result["settings"]
    for k, row in enumerate(result["comparisons"]):
        seeds = f"{row['seed']}-{row['seed'] + cfg['pairs'] - 1}; +{cfg['offset']}"
        lines.append(
            f"| {k + 1} | {seeds} | {row['mean']:+.4f} | {row['low']:+.4f} to "
            f"{row['high']:+.4f} | {compare_stats.p_text(row['p'])} | "
            f"{'yes' if row['claimed'] else 'no'} |"
        )
    low, high = result["claim_rate_interval"]
    half = result["half_width"]
    n = len(result["comparisons"])
    lines += [
        "",
        f"Claims of a difference at p < 0.05: {result['claims']} of {n} "
        f"({result['claims'] / n:.0%}; exact 95% interval {low:.0%} to {high:.0%}); at p < 0.01: "
        f"{result['claims_p01']} of {n}. The intervals' half-widths: median "
        f"{half['median']:.4f} nats (from {half['low']:.4f} to {half['high']:.4f}). "
        f"A run: {result['run_seconds_median']:.1f} s (median, wall, start-up included); "
        f"all: {result['wall_s'] / 60:.1f} min. {result['machine']}, {result['date']}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(command(main, sys.argv[1:], __doc__, Settings))
