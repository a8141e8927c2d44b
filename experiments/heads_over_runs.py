"""
What heads.py found in several runs of one recipe, side by side: how far each cost and
label moves from seed to seed.

    python train.py config/shakespeare.py                                  # seed 1337
    python train.py config/shakespeare.py --seed=2 --out_dir=out-seed2     # and 3, ...
    python heads.py && python heads.py --out_dir=out-seed2 && ...
    python -m experiments.heads_over_runs out-shakespeare-char out-seed2 out-seed3

Heads carry no name from run to run: head 1 of layer 0 in one run has nothing to do
with head 1 of layer 0 in another, since any order of a layer's heads is the same model.
So each layer's heads are put in order of their ablation cost, and the runs are set
side by side by that rank: the most costly head of layer 0 in each run, then the
second, and so on. It prints a markdown table (and writes it to --md, if given).
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import json

from support.configurator import BAD_INPUT, error

USAGE = "usage: python -m experiments.heads_over_runs RUN_DIR RUN_DIR ... [--md=FILE]"


def read_reports(folders):
    """heads.py's heads.json of each folder, and the run's log of record."""
    reports = []
    for folder in folders:
        path = os.path.join(folder, "heads", "heads.json")
        if not os.path.exists(path):
            raise ValueError(f"{path} does not exist; run python heads.py --out_dir={folder}")
        with open(path, encoding="utf-8") as f:
            reports.append(json.load(f))
    shapes = {
        (max(h["layer"] for h in r["heads"]), max(h["head"] for h in r["heads"])) for r in reports
    }
    if len(shapes) > 1:
        raise ValueError("the runs' models differ in shape; compare runs of one recipe")
    return reports


def iters_of(folder):
    """The iters a run trained, from its log.jsonl (None where it has none)."""
    path = os.path.join(folder, "log.jsonl")
    if not os.path.exists(path):
        return None
    iters = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            iters = record.get("iter", iters)
    return iters


def by_rank(report):
    """{layer: that layer's heads, most costly first}."""
    layers = {}
    for h in report["heads"]:
        layers.setdefault(h["layer"], []).append(h)
    return {
        layer: sorted(heads, key=lambda h: -h["ablation_nats"]) for layer, heads in layers.items()
    }


def spread(values, fmt):
    """'lo to hi' of the values, or the one value where they agree to the format."""
    lo = fmt.format(min(values))
    hi = fmt.format(max(values))
    if lo == hi:
        return lo
    return f"{lo} to {hi}"


def labels_of(heads):
    """The labels the runs gave, each with how many runs gave it."""
    counts = {}
    for h in heads:
        counts[h["label"]] = counts.get(h["label"], 0) + 1
    return ", ".join(f"{label} ({n})" if len(heads) > 1 else label for label, n in counts.items())


def table(folders, reports):
    """The markdown: the runs, then each layer's heads by rank across them."""
    n = len(reports)
    ranked = [by_rank(r) for r in reports]
    losses = spread([r["baseline_loss"] for r in reports], "{:.4f}")
    iters = ", ".join(str(iters_of(f)) for f in folders)
    names = ", ".join(os.path.basename(os.path.normpath(f)) for f in folders)
    columns = [
        "layer",
        "rank in its layer",
        "labels (runs)",
        "ablation (nats)",
        "score std",
        "entropy / max",
        "diagonal",
        "delimiter",
        "previous weight",
    ]
    lines = [
        f"Over {n} runs: val loss of record {losses}; iters {iters} ({names}).",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for layer in sorted(ranked[0]):
        for rank in range(len(ranked[0][layer])):
            heads = [r[layer][rank] for r in ranked]
            lines.append(
                "| "
                + " | ".join(
                    [
                        str(layer),
                        str(rank + 1),
                        labels_of(heads),
                        spread([h["ablation_nats"] for h in heads], "{:+.3f}"),
                        spread([h["score_std"] for h in heads], "{:.2f}"),
                        spread([h["entropy_ratio"] for h in heads], "{:.2f}"),
                        spread([h["scores"]["diagonal"] for h in heads], "{:.2f}"),
                        spread([h["scores"]["delimiter"] for h in heads], "{:.2f}"),
                        spread([h["previous_weight"] for h in heads], "{:.2f}"),
                    ]
                )
                + " |"
            )
    layer_costs = []
    for layer in sorted(ranked[0]):
        costs = [r["layer_ablation_nats"][layer] for r in reports]
        layer_costs.append(f"layer {layer} {spread(costs, '{:+.2f}')}")
    lines += ["", "A whole layer's attention removed: " + ", ".join(layer_costs) + " nats."]
    return "\n".join(lines)


def main(argv):
    md = None
    folders = []
    for arg in argv:
        if arg.startswith("--md="):
            md = arg.removeprefix("--md=")
        elif arg in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        elif arg.startswith("--"):
            error(f"unknown option {arg}; {USAGE}")
            return BAD_INPUT
        else:
            folders.append(arg)
    if len(folders) < 2:
        error(f"name at least two run folders; {USAGE}")
        return BAD_INPUT
    try:
        reports = read_reports(folders)
    except ValueError as e:
        error(e)
        return BAD_INPUT
    text = table(folders, reports)
    print(text)
    if md:
        with open(md, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
