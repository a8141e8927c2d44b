"""
Induction heads forming in a 2-layer model, on a CPU in a few minutes.

    python -m experiments.induction_experiment

The data is the classic setting for induction heads: sequences that repeat.
Each 64-letter sequence is a random string x of 4 to 32 letters (out of 52)
written again and again, so everything after the first copy can be predicted
by finding the letter's earlier occurrence and copying what came next. A
2-layer, 2-head model (rotary positions, AdamW) is trained on fresh sequences
for 2000 steps; every 25 steps the val loss and the induction probe of heads.py
are recorded. Then heads.py reports on the final checkpoint like on any other.

Writes out-induction/ (the dataset, ckpt.pt, curve.json, heads/) and
docs/induction_curve.png, docs/induction_heads.png. docs/heads.md discusses them.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import json
import os
import shutil
import string
import sys

import numpy as np
import torch

from data.dataset import load_tokens
from data.text import prepare_text
from data.tokenizer import build_tokenizer
from model import GPT, GPTConfig
from support import head_measures as heads
from support.checkpoint import checkpoint_path, save_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

OUT = os.path.join(ROOT, "out-induction")
DOCS = os.path.join(ROOT, "docs")
LETTERS = "".join(sorted(string.ascii_letters))  # the char tokenizer's order: id i is LETTERS[i]
BLOCK = 64  # sequence length
SHORTEST = 4  # the shortest repeated string
LONGEST = 32  # the longest repeated string
STEPS = 2000
BATCH = 32
LR = 2e-3
EVERY = 25  # steps between measurements
SEED = 1337
VAL_SEQUENCES = 200


def sequences(n, gen):
    """(n, BLOCK + 1) token ids: each row a random string of SHORTEST..LONGEST letters, repeated."""
    lengths = torch.randint(SHORTEST, LONGEST + 1, (n, 1), generator=gen)
    letters = torch.randint(0, len(LETTERS), (n, BLOCK + 1), generator=gen)
    return torch.gather(letters, 1, torch.arange(BLOCK + 1) % lengths)


def make_dataset(gen):
    """A char dataset of such sequences, so that heads.py can read its val split.
    Equal halves, so that the val split is exactly VAL_SEQUENCES whole sequences."""
    rows = sequences(2 * VAL_SEQUENCES, gen)[:, :BLOCK]
    text = "".join(LETTERS[i] for i in rows.flatten().tolist())
    prepare_text(text, os.path.join(OUT, "data", "induction"), "char", val_fraction=0.5)
    return build_tokenizer("char", text)


def lr_at(step):
    """Linear warmup over 50 steps, then cosine decay to LR / 20."""
    if step < 50:
        return LR * (step + 1) / 51
    return LR / 20 + 0.5 * (1 + np.cos(np.pi * (step - 50) / (STEPS - 50))) * (LR - LR / 20)


def train(model, val, gen):
    """Train, recording the val loss and the probe scores every EVERY steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.0)
    spans = heads.windows(len(val), BLOCK)
    curve = []
    for step in range(STEPS + 1):
        if step % EVERY == 0:
            model.eval()
            probe = heads.induction_scores(model, SEED)
            curve.append(
                {
                    "step": step,
                    "val_loss": heads.val_loss(model, val, spans, 64),
                    **{k: v.round(4).tolist() for k, v in probe.items()},
                }
            )
            model.train()
            print(
                f"step {step}: val loss {curve[-1]['val_loss']:.3f}, "
                f"induction (layer 1) {probe['induction'][1].round(2)}, "
                f"previous (layer 0) {probe['previous'][0].round(2)}"
            )
        if step == STEPS:
            return curve
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        batch = sequences(BATCH, gen)
        _, loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def jump(curve):
    """The first recorded step at which a layer-1 head reaches the induction threshold."""
    return next((c["step"] for c in curve if max(c["induction"][1]) >= heads.INDUCTION), None)


def plot(curve, path):
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    steps = [c["step"] for c in curve]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.2), sharex=True, layout="constrained")
    top.plot(steps, [c["val_loss"] for c in curve], color="black")
    top.axhline(np.log(len(LETTERS)), color="grey", ls=":", lw=1)
    top.text(
        steps[-1],
        np.log(len(LETTERS)),
        "ln 52: guessing ",
        ha="right",
        va="top",
        fontsize=8,
        color="grey",
    )
    top.set_ylabel("val loss (nats)")
    n_head = len(curve[0]["induction"][1])
    # (the score, the layer whose heads it is drawn for, the colour, its name)
    scores = [
        ("induction", 1, "C3", "induction score"),
        ("previous", 0, "C0", "previous-token score"),
    ]
    for h in range(n_head):
        for score, layer, colour, name in scores:
            bottom.plot(
                steps,
                [c[score][layer][h] for c in curve],
                color=colour,
                alpha=1 - 0.4 * h,
                label=f"layer {layer} head {h}: {name}",
            )
    bottom.axhline(heads.INDUCTION, color="grey", ls=":", lw=1)
    at = jump(curve)
    if at is not None:
        for ax in (top, bottom):
            ax.axvline(at, color="C3", ls="--", lw=1)
        bottom.text(
            at,
            0.95,
            f" step {at}: induction >= {heads.INDUCTION}",
            color="C3",
            fontsize=8,
            va="top",
        )
    bottom.set_ylim(0, 1)
    bottom.set_xlabel("training step (32 sequences of 64 letters each)")
    bottom.set_ylabel("probe score")
    bottom.legend(fontsize=7.5, loc="center right")
    fig.suptitle(
        "A 2-layer model on repeating sequences: the loss drops when induction heads form",
        fontsize=10,
    )
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    # the model is tiny: a second thread only waits on the first, and where other
    # processes share the cores, spinning threads make each step many times slower
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)  # a fresh run each time: the dataset, the checkpoint and the report
    tok = make_dataset(gen)
    val = load_tokens(os.path.join(OUT, "data", "induction"), "val")
    config = GPTConfig(
        block_size=BLOCK,
        vocab_size=tok.vocab_size,
        n_layer=2,
        n_head=2,
        n_embd=64,
        bias=False,
        rope=True,
    )
    model = GPT(config)
    curve = train(model, val, gen)
    with open(os.path.join(OUT, "curve.json"), "w") as f:
        json.dump(curve, f)
    save_checkpoint(
        {
            "model": model.state_dict(),
            "model_args": dataclasses.asdict(config),
            "iter_num": STEPS,
            "best_val_loss": curve[-1]["val_loss"],
            "tokenizer": tok.describe(),
            "dataset": "induction",
            "config": {
                "data_root": os.path.join(OUT, "data"),
                "learning_rate": LR,
                "batch_size": BATCH,
            },
        },
        checkpoint_path(OUT),
    )
    plot(curve, os.path.join(DOCS, "induction_curve.png"))
    print(f"induction score >= {heads.INDUCTION} first at step {jump(curve)}")
    if heads.run([f"--out_dir={OUT}", f"--seed={SEED}"]):
        sys.exit(1)
    shutil.copy(os.path.join(OUT, "heads", "heads.png"), os.path.join(DOCS, "induction_heads.png"))


if __name__ == "__main__":
    main()
