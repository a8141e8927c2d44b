"""
Plot train and val loss against training time from a run's log.jsonl.

    python -m experiments.plot_loss out-shakespeare-char-cpu/log.jsonl docs/loss_cpu.png \\
        --target=1.88
"""

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")  # write files; no display needed
import matplotlib.pyplot as plt

from support.run_log import read_evaluations


def read_log(path):
    try:
        rows = read_evaluations(os.path.dirname(path))
    except (OSError, ValueError) as e:
        sys.exit(f"error: cannot read {path} ({type(e).__name__}); train with train.py to make one")
    if not rows:
        sys.exit(f"error: {path} holds no evaluations yet")
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("out")
    parser.add_argument("--target", type=float, default=None)
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    plot(read_log(args.log), args.out, args.target, args.title)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
