"""
Plot train and val loss against training time from a run's log.jsonl.

    python -m experiments.plot_loss --out_dir=out-shakespeare-char-cpu \\
        --png=docs/loss_cpu.png --target=1.88
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses

import matplotlib

matplotlib.use("Agg")  # write files; no display needed
import matplotlib.pyplot as plt

from support import cli
from support.run_log import read_evaluations_or_fail


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-shakespeare-char-cpu"  # the training run's folder, with log.jsonl
    png: str = "loss.png"  # the picture to write
    target: float | None = None  # a val loss to draw as a line
    title: str | None = None


class PlotError(Exception):
    """A log that cannot be drawn; one line saying what to do."""


def read_log(out_dir):
    rows = read_evaluations_or_fail(out_dir, PlotError, "train with train.py to make one")
    if not rows:
        raise PlotError(f"{out_dir}/log.jsonl holds no evaluations yet")
    return rows


def plot(rows, out, target=None, title=None):
    seconds = [r["elapsed_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), constrained_layout=True)
    ax.plot(seconds, [r["train_loss"] for r in rows], "o-", ms=3, label="train loss")
    ax.plot(seconds, [r["val_loss"] for r in rows], "o-", ms=3, label="val loss")
    last = rows[-1]
    if "val_loss_full" in last:
        ax.plot(
            [last["elapsed_s"]],
            [last["val_loss_full"]],
            "k*",
            ms=10,
            label=f"whole val split: {last['val_loss_full']:.4f}",
        )
    if target is not None:
        ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target}")
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_ylim(top=min(4.5, max(r["val_loss"] for r in rows) + 0.1))
    ax.set_title(title or "loss against training time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(out, dpi=110)


def main(cfg):
    plot(read_log(cfg.out_dir), cfg.png, cfg.target, cfg.title)
    print(f"wrote {cfg.png}")


if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], __doc__, Settings, (PlotError,)))
