"""
When did each head take on its job? Every head's induction score and label over
a training run, drawn from the run's log, and the phase change in which
induction heads form.

    python train.py config/induction.py --snapshots=True --log_heads=True
    python -m experiments.head_timeline --out_dir=out-induction

train.py --log_heads=True adds, at every evaluation, each head's induction score
(the probe of heads.py: random tokens repeated), its label (heads.py's rule, on
the first windows of the val split) and the in-context learning score to
log.jsonl (support/timeline.py). This draws, on top, the run as a whole: the
best head's induction score, and the val loss and the in-context learning score
(late-position loss minus early-position loss) against the iter, with the
phase change shaded: from the last evaluation whose best induction score was
below RISE_FROM to the first at or above the label threshold. Below, one row
per layer: on the left each head's induction score, the threshold dashed; on
the right each head's label at each evaluation, one colour per label (every
"mixed: A+B" one colour). It writes <out_dir>/head_timeline.png (or --out) and
prints the phase change's numbers and the iter at which each head first passed
the threshold.
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses

import numpy as np

from support import cli
from support.head_measures import INDUCTION
from support.run_log import read_evaluations_or_fail


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-shakespeare-char-cpu"  # the run's folder, with log.jsonl
    out: str = ""  # the picture; "" = <out_dir>/head_timeline.png


RISE_FROM = 0.1  # where the phase change starts: the best induction score still below this


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


def read_records(out_dir):
    """The evaluations of out_dir/log.jsonl that logged the heads."""
    path = os.path.join(out_dir, "log.jsonl")
    records = read_evaluations_or_fail(
        out_dir, TimelineError, "point --out_dir at a training run's folder"
    )
    records = [r for r in records if "heads" in r]
    if not records:
        raise TimelineError(
            f"{path} logs no heads; train with --log_heads=True (and an --eval_interval "
            "that evaluates several times)"
        )
    return records


def read_timeline(out_dir):
    """(iters (E,), induction (E, n_layer, n_head), labels: E lists of n_layer lists of
    str) from the evaluations of out_dir/log.jsonl that logged the heads."""
    records = read_records(out_dir)
    iters = np.array([r["iter"] for r in records])
    induction = np.array([r["heads"]["induction"] for r in records])
    labels = [r["heads"]["label"] for r in records]
    return iters, induction, labels


def read_losses(out_dir):
    """(val_loss (E,), icl_score (E,)) of the same evaluations; NaN where a log from
    before the in-context learning score has none."""
    records = read_records(out_dir)
    val_loss = np.array([r["val_loss"] for r in records])
    icl = np.array([r.get("icl_score", np.nan) for r in records])
    return val_loss, icl


def phase_change(iters, induction):
    """(first, last) evaluation indices of the rise of the best head's induction score:
    the last evaluation below RISE_FROM before the first at or above the label
    threshold, and that first one. None if no head reaches the threshold, or if the
    first evaluation is already past RISE_FROM."""
    best = induction.max(axis=(1, 2))  # (E,)
    above = np.nonzero(best >= INDUCTION)[0]
    if not len(above):
        return None
    below = np.nonzero(best[: above[0]] < RISE_FROM)[0]
    if not len(below):
        return None
    return int(below[-1]), int(above[0])


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


def draw_run(iters, induction, losses, span, best_ax, loss_ax):
    """The top row: the best head's induction score on the left; the val loss and the
    in-context learning score on the right; the phase change shaded on both."""
    val_loss, icl = losses
    best_ax.plot(iters, induction.max(axis=(1, 2)), "o-", ms=3, color="C3")
    best_ax.axhline(INDUCTION, color="gray", ls="--", lw=1)
    best_ax.axhline(RISE_FROM, color="gray", ls=":", lw=1)
    best_ax.set_ylim(0, 1)
    best_ax.set_ylabel("best head's\ninduction score")
    best_ax.grid(alpha=0.3)
    loss_ax.plot(iters, val_loss, "o-", ms=3, color="black", label="val loss")
    if not np.isnan(icl).all():
        loss_ax.plot(iters, icl, "o-", ms=3, color="C0", label="in-context learning score")
    loss_ax.axhline(0, color="gray", lw=0.8)
    loss_ax.set_ylabel("nats")
    loss_ax.grid(alpha=0.3)
    loss_ax.set_xlim(iters[0], iters[-1])
    if span is not None:
        first, last = span
        for ax in (best_ax, loss_ax):
            ax.axvspan(iters[first], iters[last], color="C3", alpha=0.12, lw=0)
        best_ax.text(
            iters[last],
            0.95,
            f"  phase change: iters {iters[first]}-{iters[last]}",
            color="C3",
            fontsize=8,
            va="top",
        )
    loss_ax.legend(fontsize=7, loc="center right")
    best_ax.set_title(
        f"the best head's induction score ({RISE_FROM} dotted, the label's {INDUCTION} dashed)"
    )
    loss_ax.set_title("val loss, and the loss at a late position minus an early one")


def draw(iters, induction, labels, out, losses=None):
    """The picture; losses, (val_loss, icl_score) per evaluation, adds the top row."""
    import matplotlib

    matplotlib.use("Agg")  # write files; no display needed
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    E, n_layer, n_head = induction.shape
    top = int(losses is not None)  # rows above the layers'
    fig, axes = plt.subplots(
        top + n_layer,
        2,
        figsize=(12, 1.2 + 2.2 * (top + n_layer)),
        squeeze=False,
        gridspec_kw={"width_ratios": [1, 1.2]},
        constrained_layout=True,
    )
    if losses is not None:
        draw_run(iters, induction, losses, phase_change(iters, induction), *axes[0])
    names = kinds_of(labels)
    colours = [plt.get_cmap("tab20")(k % 20) for k in range(len(names))]
    # (n_layer, n_head, E): each head's kind of label at each evaluation
    kinds = np.array(
        [[[names.index(kind(labels[e][layer][h])) for e in range(E)] for h in range(n_head)]
         for layer in range(n_layer)]
    )  # fmt: skip
    for layer in range(n_layer):
        left, right = axes[top + layer]
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
    axes[top][0].set_title(f"induction score (the label's threshold {INDUCTION} dashed)")
    axes[top][1].set_title("label at each evaluation")
    fig.legend(
        handles=[Patch(color=colours[k], label=name) for k, name in enumerate(names)],
        loc="outside lower center",
        ncol=min(len(names), 8),
        fontsize=8,
    )
    fig.savefig(out, dpi=90)
    plt.close(fig)


def describe_phase_change(iters, induction, losses):
    """The phase change in one line: where the best induction score rose, and what the
    val loss and the in-context learning score did over the same evaluations."""
    span = phase_change(iters, induction)
    if span is None:
        return (
            f"no phase change: the best induction score never rose from < {RISE_FROM} "
            f"to >= {INDUCTION}"
        )
    first, last = span
    best = induction.max(axis=(1, 2))
    val_loss, icl = losses
    steps = iters[last] - iters[first]
    share = steps / max(iters[-1] - iters[0], 1)
    return (
        f"phase change between iters {iters[first]} and {iters[last]} ({steps} iters, "
        f"{share:.0%} of the run): best induction score {best[first]:.3f} -> {best[last]:.3f}, "
        f"icl_score {icl[first]:.3f} -> {icl[last]:.3f}, "
        f"val loss {val_loss[first]:.3f} -> {val_loss[last]:.3f}"
    )


def main(cfg):
    iters, induction, labels = read_timeline(cfg.out_dir)
    losses = read_losses(cfg.out_dir)
    out = cfg.out or os.path.join(cfg.out_dir, "head_timeline.png")
    draw(iters, induction, labels, out, losses)
    crossed = first_crossings(iters, induction)
    print(f"{len(iters)} evaluations, iters {iters[0]} to {iters[-1]}; wrote {out}")
    print(describe_phase_change(iters, induction, losses))
    if not crossed:
        print(f"no head passed the induction threshold {INDUCTION}")
    for (layer, head), it in sorted(crossed.items(), key=lambda kv: kv[1]):
        print(f"L{layer} H{head}: induction score >= {INDUCTION} from iter {it}")


def run(argv):
    """The command: main() with --help, and bad input as one line (support/cli.py)."""
    return cli.run(main, argv, __doc__, Settings, (TimelineError,))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
