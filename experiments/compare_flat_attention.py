"""
A large known effect, found: attention flattened inside attention() against the stock one.

    python -m experiments.compare_flat_attention [--out_dir=DIR]

In a clone of this repository at HEAD, model.py's attention() multiplies its scores by 0:
each query then weighs every visible key alike, a running mean of the values. Then one
default run of the command, as a user types it after the edit (`python compare.py`: the
CPU recipe, 4 pairs, the clone's HEAD against its working tree). The edit is inside
attention(), so the command must train both arms with --fused=False (the fused kernel would
never run it); the goal is the right sign (B worse) at p < 0.01. Writes the command's whole
output (compare_flat_attention.txt) and compare_flat_attention.json into --out_dir (default
out-experiments/compare_flat_attention/).
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses
import json
import time

from experiments import ROOT, SCRATCH
from experiments.comparing import clone, command, compare, cpu_class, edit

STOCK = "    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., Tq, Tk)\n"
FLAT = "    scores = q @ k.transpose(-2, -1) / math.sqrt(d) * 0  # (..., Tq, Tk)\n"


@dataclasses.dataclass
class Settings:
    out_dir: str = os.path.join(SCRATCH, "compare_flat_attention")


def main(cfg):
    out = os.path.abspath(cfg.out_dir)
    os.makedirs(out, exist_ok=True)
    repo = clone(os.path.join(out, "repo"))
    edit(os.path.join(repo, "model.py"), STOCK, FLAT)
    cache = os.path.join(out, "cache")
    report, text, wall = compare(repo, [f"--data_root={os.path.join(ROOT, 'data')}"], cache)
    d = report["statistics"]["difference"]
    result = dict(
        machine=cpu_class(),
        date=time.strftime("%Y-%m-%d"),
        wall_s=round(wall, 1),
        written_out=all("--fused=False" in report["arms"][a]["argv"] for a in ("A", "B")),
        right_sign=d["mean"] > 0,
        p=d["p"],
        found=d["mean"] > 0 and d["p"] < 0.01,
        verdict=report["statistics"]["verdict"],
        output=text,
    )
    with open(os.path.join(out, "compare_flat_attention.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "compare_flat_attention.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(
        f"\nflattened attention: {'found' if result['found'] else 'not found'} (B worse: "
        f"{result['right_sign']}, p = {d['p']:.2g}, both arms written out: "
        f"{result['written_out']}); {wall:.0f} s wall. {result['machine']}"
    )


if __name__ == "__main__":
    sys.exit(command(main, sys.argv[1:], __doc__, Settings))
