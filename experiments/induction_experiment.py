"""
Induction heads forming through train.py, and the circuit they belong to.

    python -m experiments.induction_experiment                  # about 4 minutes on two CPU cores
    python -m experiments.induction_experiment --out_dir=docs   # the figures of docs/heads.md

1. Trains config/induction.py (lines of a random string written again and
   again, data/induction.py; a 2-layer, 4-head model) with train.py
   --snapshots=True --log_heads=True: the run logs every head's induction score
   and the in-context learning score at every evaluation.
2. Draws the timeline (experiments/head_timeline.py) to
   induction_phase_change.png and prints the phase change's numbers.
3. Reads the Q-, K- and V-composition scores (support/composition.py) of every
   snapshot, from the weights: how the layer-0 heads' outputs compose into the
   layer-1 heads' queries, keys and values before, during and after the phase
   change (induction_composition.png).
4. Knocks the previous-token heads of the final model out on the induction
   probe, whole (head_measures.ablated) and path by path
   (head_measures.path_ablated: only into the layer-1 queries, keys or values;
   cut_from_mlp: only into layer 0's MLP).
5. Runs heads.py on the final checkpoint (induction_heads.png).

Everything measured goes to induction.json. The pictures and the JSON go into --out_dir
(default out-experiments/induction_experiment/; docs/ only when given --out_dir=docs,
whose figures docs/heads.md discusses); the run itself into out-induction/.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import contextlib
import dataclasses
import json
import shutil

import numpy as np
import torch

import heads
import train
from experiments import SCRATCH, head_timeline
from support import cli, head_measures, timeline
from support.composition import composition_scores
from support.loading import load_model
from support.run_log import read_evaluations

OUT = os.path.join(ROOT, "out-induction")
CONFIG = os.path.join(ROOT, "config", "induction.py")
SEED = timeline.SEED  # the induction probe's random tokens
# the layer-0 heads knocked out: those that put at least a quarter of their weight on the
# previous token on the probe (a uniform head over 64 keys puts 1/64 there)
PREVIOUS = 0.25


def composition_over_training(out_dir):
    """{iter: composition_scores} of every snapshot of the run."""
    found = {}
    for iter_num, path in timeline.list_snapshots(out_dir).items():
        model, _, _ = load_model(path, out_dir)
        found[iter_num] = {k: v.numpy() for k, v in composition_scores(model).items()}
    return found


def draw_composition(over_training, span, path):
    """Each layer-0 head's Q- and K-composition into the layer-1 heads (their mean),
    against the iter, with the phase change shaded."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    iters = sorted(over_training)
    n_head = over_training[iters[0]]["k"].shape[1]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True, constrained_layout=True)
    for ax, name in zip(axes, ("q", "k", "v")):
        for head in range(n_head):
            into = [np.nanmean(over_training[i][name][0, head, 1]) for i in iters]
            ax.plot(iters, into, "o-", ms=3, label=f"from L0H{head}")
        if span is not None:
            ax.axvspan(*span, color="C3", alpha=0.12, lw=0)
        ax.set_title(f"{name.upper()}-composition into layer 1 (mean over its heads)", fontsize=9)
        ax.set_xlabel("iter (snapshots)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("composition score")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        "How much each layer-0 head's output lands where the layer-1 heads read "
        "(phase change shaded)",
        fontsize=10,
    )
    fig.savefig(path, dpi=90)
    plt.close(fig)


@contextlib.contextmanager
def cut_from_mlp(model, writers):
    """Inside, layer 0's MLP reads the residual stream less the writers' (layer-0 heads)
    outputs: their path through that MLP is cut, every other path kept."""
    hs = model.config.n_embd // model.config.n_head
    keep = torch.zeros(model.config.n_embd)
    for _, head in writers:
        keep[head * hs : (head + 1) * hs] = 1
    block = model.transformer.h[0]
    seen = {}

    def writers_output(module, args):
        seen["out"] = (args[0] * keep) @ module.weight.T  # (B, T, C) the writers' part

    def mlp_input(module, args):
        return (args[0] - seen["out"],)  # what ln_2, and so the MLP, reads

    handles = [
        block.attn.c_proj.register_forward_pre_hook(writers_output),
        block.ln_2.register_forward_pre_hook(mlp_input),
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def knockout_table(model, previous_heads):
    """The best layer-1 induction score and the probe's two losses (first copy, repeated
    copy) with nothing removed, the previous-token heads removed whole, their direct
    path into the layer-1 queries, keys or values alone cut, and their path through
    layer 0's MLP alone cut."""
    cases = {"nothing removed": None, "removed whole": "whole"}
    for paths in (("q",), ("k",), ("v",), ("q", "k", "v")):
        cases[f"cut from layer 1's {'+'.join(paths)} only"] = paths
    cases["cut from layer 0's MLP only"] = "mlp"
    table = {}
    for name, paths in cases.items():
        if paths is None:
            context = contextlib.nullcontext()
        elif paths == "whole":
            context = head_measures.ablated(model, previous_heads)
        elif paths == "mlp":
            context = cut_from_mlp(model, previous_heads)
        else:
            context = head_measures.path_ablated(model, previous_heads, 1, paths)
        with context:
            induction = head_measures.induction_scores(model, SEED)["induction"]
            first, repeated = head_measures.copy_losses(model, SEED)
        table[name] = {
            "layer_1_induction": induction[1].round(4).tolist(),
            "first_copy_loss": round(first, 4),
            "repeated_copy_loss": round(repeated, 4),
        }
    return table


def main(cfg):
    out = cfg.out_dir
    cli.output_folder(out)
    # the model is tiny: a second thread mostly waits on the first where other work shares the cores
    torch.set_num_threads(1)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)  # a fresh run: the log, the snapshots and the report
    train.main([CONFIG, f"--out_dir={OUT}", "--snapshots=True", "--log_heads=True"])

    iters, induction, labels = head_timeline.read_timeline(OUT)
    losses = head_timeline.read_losses(OUT)
    head_timeline.draw(
        iters, induction, labels, os.path.join(out, "induction_phase_change.png"), losses
    )
    print(head_timeline.describe_phase_change(iters, induction, losses))
    span = head_timeline.phase_change(iters, induction)
    span_iters = None if span is None else (int(iters[span[0]]), int(iters[span[1]]))

    over_training = composition_over_training(OUT)
    draw_composition(over_training, span_iters, os.path.join(out, "induction_composition.png"))

    model, _, _ = load_model(OUT, OUT)
    model.eval()
    previous = head_measures.induction_scores(model, SEED)["previous"][0]  # (n_head,) of layer 0
    previous_heads = [(0, int(h)) for h in np.nonzero(previous >= PREVIOUS)[0]]
    knockouts = knockout_table(model, previous_heads) if previous_heads else {}
    for name, row in knockouts.items():
        print(f"previous-token heads {previous_heads} {name}: {row}")

    if heads.run([f"--out_dir={OUT}", f"--seed={SEED}"]):
        sys.exit(1)
    shutil.copy(os.path.join(OUT, "heads", "heads.png"), os.path.join(out, "induction_heads.png"))
    log = read_evaluations(OUT)
    results = {
        "phase_change": span_iters,
        "log": [
            {k: r[k] for k in ("iter", "val_loss", "icl_score")}
            | {"best_induction": float(np.max(r["heads"]["induction"]))}
            for r in log
        ],
        "previous_token_scores_layer_0": previous.round(4).tolist(),
        "previous_token_heads": previous_heads,
        "knockouts": knockouts,
        "composition": {
            str(i): {k: v[0, :, 1].astype(float).round(4).tolist() for k, v in comp.items()}
            for i, comp in over_training.items()
        },
    }
    with open(os.path.join(out, "induction.json"), "w") as f:
        json.dump(results, f)  # one line: 81 snapshots of scores would be 7000 indented ones


@dataclasses.dataclass
class Settings:
    # the experiment is fixed, as docs/heads.md reports it; only where its figures go is not
    out_dir: str = os.path.join(SCRATCH, "induction_experiment")  # docs: the shipped figures


if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], __doc__, Settings))
