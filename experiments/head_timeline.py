"""
When did each head take on its job? Every head's induction score and label over
a training run, drawn from the run's log.

    python train.py config/shakespeare_cpu.py --eval_interval=20 --log_heads=True
    python -m experiments.head_timeline --out_dir=out-shakespeare-char-cpu

train.py --log_heads=True adds, at every evaluation, each head's induction score
(the probe of heads.py: random tokens repeated) and its label (heads.py's rule,
on the first windows of the val split) to log.jsonl (support/timeline.py). This
draws one row per layer: on the left each head's induction score against the
iter, the label threshold dashed; on the right each head's label at each
evaluation, one colour per label (every "mixed: A+B" one colour). It writes
<out_dir>/head_timeline.png (or --out) and prints the iter at which each head
first passed the threshold.
"""

import json
import os
import sys

import numpy as np

from support.configurator import ConfigError, describe, parse_args
from support.head_measures import INDUCTION

DEFAULTS = dict(
    out_dir="out-shakespeare-char-cpu",  # the run's folder, with log.jsonl
    out="",  # the picture; "" = <out_dir>/head_timeline.png
)


class TimelineError(Exception):
    """The log cannot be drawn; the message is one line saying what to do."""


def kind(label):
    """A label as the picture colours it: every 'mixed: A+B' is one colour, 'mixed'."""
    return label.split(":")[0]


def kinds_of(labels):
    """The kinds of label in the log, in the order they first appear."""
    seen = {}
    for evaluation in labels:
        for row in evaluation:
            for label in row:
                seen.setdefault(kind(label), len(seen))
    return list(seen)


def read_timeline(out_dir):
    """(iters (E,), induction (E, n_layer, n_head), labels: E lists of n_layer lists of
    str) from the evaluations of out_dir/log.jsonl that logged the heads."""
    path = os.path.join(out_dir, "log.jsonl")
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise TimelineError(
            f"cannot read {path} ({type(e).__name__}); point --out_dir at a training run's folder"
        ) from None
    records = [r for r in records if "heads" in r]
    if not records:
        raise TimelineError(
            f"{path} logs no heads; train with --log_heads=True (and an --eval_interval "
            "that evaluates several times)"
        )
    iters = np.array([r["iter"] for r in records])
    induction = np.array([r["heads"]["induction"] for r in records])
    labels = [r["heads"]["label"] for r in records]
    return iters, induction, labels


def first_crossings(iters, induction):
    """{(layer, head): the first iter whose induction score passed the threshold}."""
    crossed = {}
    _, n_layer, n_head = induction.shape
    for layer in range(n_layer):
        for head in range(n_head):
            above = np.nonzero(induction[:, layer, head] >= INDUCTION)[0]
            if len(above):
                crossed[(layer, head)] = int(iters[above[0]])
    return crossed


def draw(iters, induction, labels, out):
    import matplotlib

    matplotlib.use("Agg")  # write files; no display needed
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    E, n_layer, n_head = induction.shape
    fig, axes = plt.subplots(
        n_layer,
        2,
        figsize=(12, 1.2 + 2.2 * n_layer),
        squeeze=False,
        gridspec_kw={"width_ratios": [1, 1.2]},
        constrained_layout=True,
    )
    names = kinds_of(labels)
    colours = [plt.get_cmap("tab20")(k % 20) for k in range(len(names))]
    # (n_layer, n_head, E): each head's kind of label at each evaluation
    kinds = np.array(
        [[[names.index(kind(labels[e][layer][h])) for e in range(E)] for h in range(n_head)]
         for layer in range(n_layer)]
    )  # fmt: skip
    for layer in range(n_layer):
        left, right = axes[layer]
        for h in range(n_head):
            left.plot(iters, induction[:, layer, h], "o-", ms=3, label=f"H{h}")
        left.axhline(INDUCTION, color="gray", ls="--", lw=1)
        left.set_ylim(0, 1)
        left.set_ylabel(f"layer {layer}\ninduction score")
        left.grid(alpha=0.3)
        left.legend(fontsize=7, ncol=min(n_head, 6), loc="upper left")
        right.imshow(
            kinds[layer],
            aspect="auto",
            interpolation="nearest",
            cmap=ListedColormap(colours),
            vmin=-0.5,
            vmax=len(names) - 0.5,
        )
        right.set_yticks(range(n_head), [f"H{h}" for h in range(n_head)])
        ticks = np.unique(np.linspace(0, E - 1, min(E, 10)).round().astype(int))
        right.set_xticks(ticks, [str(iters[t]) for t in ticks])
    axes[-1][0].set_xlabel("iter")
    axes[-1][1].set_xlabel("iter (one column per evaluation)")
    axes[0][0].set_title(f"induction score (the label's threshold {INDUCTION} dashed)")
    axes[0][1].set_title("label at each evaluation")
    fig.legend(
        handles=[Patch(color=colours[k], label=name) for k, name in enumerate(names)],
        loc="outside lower center",
        ncol=min(len(names), 8),
        fontsize=8,
    )
    fig.savefig(out, dpi=90)
    plt.close(fig)


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\n\noptions (defaults):\n" + describe(DEFAULTS))
        return
    cfg = parse_args(DEFAULTS, argv, allow_files=False)
    iters, induction, labels = read_timeline(cfg["out_dir"])
    out = cfg["out"] or os.path.join(cfg["out_dir"], "head_timeline.png")
    draw(iters, induction, labels, out)
    crossed = first_crossings(iters, induction)
    print(f"{len(iters)} evaluations, iters {iters[0]} to {iters[-1]}; wrote {out}")
    if not crossed:
        print(f"no head passed the induction threshold {INDUCTION}")
    for (layer, head), it in sorted(crossed.items(), key=lambda kv: kv[1]):
        print(f"L{layer} H{head}: induction score >= {INDUCTION} from iter {it}")


def run(argv):
    """main() with every expected failure turned into one line on stderr (exit code 2)."""
    try:
        main(argv)
        return 0
    except (ConfigError, TimelineError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
