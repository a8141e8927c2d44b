"""
What pairing buys compare.py: the spread of paired differences against unpaired ones.

    python -m experiments.compare_pairing [--pairs=8] [--a=...] [--b=...] [--out_dir=DIR]

Two arms of the CPU recipe (config/shakespeare_cpu.py, the command's default) that differ by
a small change (--a and --b: QK-norm's learned gain off and on by default), --pairs pairs.
Within a pair both runs share the seed: the same batches and the same initialisation. The
standard deviation of the paired differences B_i - A_i is set against that of unpaired ones,
B_j - A_i for i != j (runs that shared nothing), and against sqrt(var A + var B): the ratio
squared is how many more pairs an unpaired comparison would need for the same interval.

The first 4 pairs are one run of the command as a user types it (timed: the goal is at most
6 minutes on 2 cores), the rest a second run with --pairs, which trains only the new pairs.
It runs in a clone of this repository at HEAD, with the dataset of data/. Writes
compare_pairing.json into --out_dir (default out-experiments/compare_pairing/).
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses
import json
import math
import time

from experiments import ROOT, SCRATCH
from experiments.comparing import clone, command, compare, cpu_class
from support import compare_stats


@dataclasses.dataclass
class Settings:
    pairs: int = 8
    a: str = "--qk_gain=False"
    b: str = "--qk_gain=True"
    out_dir: str = os.path.join(SCRATCH, "compare_pairing")


def spreads(loss_a, loss_b):
    """The paired and unpaired standard deviations of B - A."""
    paired = compare_stats.sample_sd([b - a for a, b in zip(loss_a, loss_b)])
    across = compare_stats.unpaired_sd(loss_a, loss_b)
    independent = math.sqrt(
        compare_stats.sample_sd(loss_a) ** 2 + compare_stats.sample_sd(loss_b) ** 2
    )
    return dict(
        paired=paired,
        unpaired=across,
        independent=independent,
        ratio=across / paired,
        pairs_factor=(across / paired) ** 2,
    )


def main(cfg):
    out = os.path.abspath(cfg.out_dir)
    os.makedirs(out, exist_ok=True)
    repo = clone(os.path.join(out, "repo"))
    argv = [f"--a={cfg.a}", f"--b={cfg.b}", f"--data_root={os.path.join(ROOT, 'data')}"]
    cache = os.path.join(out, "cache")
    log = os.path.join(out, "log")
    first, text, first_wall = compare(repo, argv + [f"--pairs={min(4, cfg.pairs)}"], cache, log)
    report, _, _ = compare(repo, argv + [f"--pairs={cfg.pairs}"], cache, log)
    stats = report["statistics"]
    result = dict(
        settings=dataclasses.asdict(cfg),
        machine=cpu_class(),
        date=time.strftime("%Y-%m-%d"),
        first_four=dict(
            wall_s=round(first_wall, 1),
            trained=sum(p[a]["trained_now"] for p in first["runs"] for a in ("A", "B")),
            output=text,
        ),
        loss=stats["loss"],
        spread=spreads(stats["loss"]["A"], stats["loss"]["B"]),
        verdict=stats["verdict"],
        ms_per_iter=stats["ms_per_iter"],
    )
    with open(os.path.join(out, "compare_pairing.json"), "w") as f:
        json.dump(result, f, indent=1)
    s = result["spread"]
    print(
        f"\n{cfg.pairs} pairs: sd of paired differences {s['paired']:.4f}, of unpaired ones "
        f"(B_j - A_i, i != j) {s['unpaired']:.4f}, sqrt(var A + var B) {s['independent']:.4f}: "
        f"pairing divides the spread by {s['ratio']:.2f} (an unpaired comparison would need "
        f"{s['pairs_factor']:.1f}x the pairs). The first {min(4, cfg.pairs)} pairs: "
        f"{first_wall:.0f} s wall. {result['machine']}"
    )


if __name__ == "__main__":
    sys.exit(command(main, sys.argv[1:], __doc__, Settings))
