"""
What each attention head does, and whether it matters.

    python heads.py --out_dir=out-shakespeare-char-cpu
    python heads.py --out_dir=out --max_windows=200      # a big model on a CPU

For the checkpoint in --out_dir (or --init_from), three measurements per head:

  pattern     over the windows of its dataset's val split: the share of the
              head's attention on each class of keys (diagonal, first token,
              delimiters, the query's own block, earlier text), the lift of each over
              even attention, the concentration, and a label
              (attention_maps.LABEL_RULE says how it is chosen)
  induction   on x || x, L random distinct tokens repeated (Olsson et al. 2022):
              the mean weight of each position of the second copy on the token
              that followed its earlier occurrence; also on the occurrence itself
              (duplicate) and on the token before (previous). >= 0.4: induction
  ablation    how much the val loss of record rises (in nats) when the head's
              output is zeroed before c_proj, all other heads intact; also each
              whole layer, and all heads that cost less than --prune_below at once

and the circuit the heads make: the Q-, K- and V-composition scores between every
head and every head of a later layer, from the weights (support/composition.py),
and on the induction probe each head knocked out in turn: the loss on the repeated
half and the best induction score of a later head without it.

It writes <folder>/heads/heads.json, heads.md (printed too) and heads.png, a
picture of every head's label and importance (--heads_dir DIR: into DIR instead,
for a checkpoint in a folder that cannot be written). docs/heads.md shows it on two
models. Options are --key=value; `python heads.py --help` lists them.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import json
import os
import sys

import numpy as np

from support import attention_maps, cli
from support.attention_maps import CLASSES
from support.composition import as_lists, composition_scores, strongest
from support.device import inference_dtype, pick_device
from support.head_measures import (
    BATCH_TOKENS,
    INDUCTION,
    PROBE_SEQUENCES,
    HeadsError,
    ablation,
    induction_scores,
    knockouts,
    patterns,
    probe_tokens,
    val_tokens,
    windows,
)
from support.loading import load_model


@dataclasses.dataclass
class Settings:
    # the checkpoint's folder; the results go to <out_dir>/heads
    out_dir: str = "out-shakespeare-char"
    # "" = out_dir's checkpoint; or a checkpoint folder, or a Hugging Face GPT-2 folder
    init_from: str = ""
    # where the results go; None: heads/ in the checkpoint's folder (out_dir for GPT-2)
    heads_dir: str | None = None
    dataset: str = ""  # "" = the one the checkpoint was trained on; else a prepared dataset's name
    # the folder of dataset folders; None: the checkpoint's, else data/ in this repo
    data_root: str | None = None
    max_windows: int = 0  # 0 = every window of the val split; N: N windows spread evenly over it
    batch_size: int = 0  # windows per forward; 0: as many as hold BATCH_TOKENS tokens
    prune_below: float = 0.01  # nats: heads whose ablation costs less are pruning candidates
    seed: int = 1337  # the induction probe's random tokens
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    # auto (bfloat16 on a GPU that has it, else float32), float32, bfloat16, float16
    dtype: str = "auto"


# -----------------------------------------------------------------------------
# The val split, in the windows of the val loss of record


# -----------------------------------------------------------------------------
# 1. Patterns over real text


# -----------------------------------------------------------------------------
# 2. The induction probe


# -----------------------------------------------------------------------------
# 3. Importance by ablation


# -----------------------------------------------------------------------------
# The report


def report(cfg, model, tok, data, folder, source):
    """Every measurement of every head, as the dict heads.json holds."""
    c = model.config
    spans = windows(len(data), c.block_size, cfg.max_windows)
    if not spans:
        raise HeadsError("the val split has fewer than 2 tokens; prepare the dataset again")
    pats = patterns(model, tok, data, spans, cfg.batch_size)
    probe = induction_scores(model, cfg.seed)
    abl = ablation(model, data, spans, cfg.batch_size, cfg.prune_below)
    comp = composition_scores(model)
    knock = knockouts(model, cfg.seed)
    order = np.argsort(-abl["head_nats"], axis=None, kind="stable")  # most important first
    rank = np.empty(order.size, dtype=int)
    rank[order] = np.arange(1, order.size + 1)
    heads = []
    for layer in range(c.n_layer):
        for h in range(c.n_head):
            p = pats[layer][h]
            scores = {name: round(float(v[layer, h]), 4) for name, v in probe.items()}
            heads.append(
                {
                    "layer": layer,
                    "head": h,
                    "label": "induction" if scores["induction"] >= INDUCTION else p["label"],
                    "pattern": p["label"],
                    "scores": p["scores"],
                    "lift": p["lift"],
                    "concentration": p["concentration"],
                    "entropy": p["entropy"],
                    "entropy_ratio": p["entropy_ratio"],
                    "score_std": p["score_std"],
                    "self_weight": p["self_weight"],
                    "previous_weight": p["previous_weight"],
                    **scores,
                    "ablation_nats": round(float(abl["head_nats"][layer, h]), 5),
                    "rank": int(rank[layer * c.n_head + h]),
                    "prune": (layer, h) in abl["pruned"],
                    "composition_from": {k: strongest(v, layer, h) for k, v in comp.items()},
                    "knockout_copy_loss": round(float(knock["copy_loss"][layer, h]), 4),
                    "knockout_later_induction": knock["induction"][layer, h, layer + 1 :]
                    .round(4)
                    .tolist(),
                }
            )
    return {
        "checkpoint": source,
        "dataset": folder,
        "windows": len(spans),
        "tokens": sum(length for _, length in spans),
        "seed": cfg.seed,
        "dtype": str(model.lm_head.weight.dtype).removeprefix("torch."),
        "baseline_loss": round(abl["baseline_loss"], 5),
        "layer_ablation_nats": [round(float(v), 5) for v in abl["layer_nats"]],
        "prune_below": cfg.prune_below,
        "pruned_loss": round(abl["pruned_loss"], 5),
        "pruned_nats": round(abl["pruned_loss"] - abl["baseline_loss"], 5),
        "induction_probe": {
            "length": probe_tokens(c, 0)[1],
            "sequences": PROBE_SEQUENCES,
            "threshold": INDUCTION,
        },
        "rule": attention_maps.LABEL_RULE,
        "score_bound": score_bound(model),
        "composition": {k: as_lists(v) for k, v in comp.items()},
        "copy_loss": {
            k: round(float(knock["baseline"][k]), 4) for k in ("first_copy_loss", "copy_loss")
        },
        "heads": heads,
    }


def score_bound(model):
    """The largest scaled score q k^T / sqrt(hs) each layer's heads can reach, where
    queries and keys are RMS-normed (QK-norm): |q| = |k| = sqrt(hs), so sqrt(hs), times
    the largest query gain and the largest key gain where the norms learn one (rotary
    turns pairs of dimensions, which keeps the lengths). None without QK-norm: the
    scores are then bounded only by the weights and the residual stream."""
    c = model.config
    if not c.qk_norm:
        return None
    hs = c.n_embd // c.n_head
    bounds = []
    for block in model.transformer.h:
        bound = hs**0.5
        for norm in (block.attn.q_norm, block.attn.k_norm):
            if norm.weight is not None:
                bound *= float(norm.weight.detach().abs().max())
        bounds.append(round(bound, 3))
    return bounds


def markdown(rep):
    """The report as a markdown table and a few lines of totals."""
    cols = [
        "layer",
        "head",
        "label",
        "concentration",
        "score std",
        "entropy",
        *CLASSES,
        "induction",
        "ablation (nats)",
        "rank",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for h in rep["heads"]:
        cells = [
            h["layer"],
            h["head"],
            h["label"] + (" (prune)" if h["prune"] else ""),
            h["concentration"],
            f"{h['score_std']:.2f}",
            f"{h['entropy']:.2f} ({h['entropy_ratio']:.2f})",
            *(f"{h['scores'][c]:.2f}" for c in CLASSES),
            f"{h['induction']:.2f}",
            f"{h['ablation_nats']:+.4f}",
            h["rank"],
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    n_pruned = sum(h["prune"] for h in rep["heads"])
    pruned = f"{n_pruned} heads"
    if n_pruned == 1:
        pruned = "1 head"
    layers = ", ".join(f"layer {i} {v:+.3f}" for i, v in enumerate(rep["layer_ablation_nats"]))
    lines += [
        "",
        f"Val loss of record {rep['baseline_loss']:.4f} "
        f"({rep['tokens']:,} tokens in {rep['windows']} windows, {rep['dtype']}). "
        "Score std: the mean standard deviation of a query's scaled scores "
        "q k^T / sqrt(d) over the keys it sees; entropy: of its weights, in nats (and over "
        "its maximum, log of the keys seen: 1 is even attention). "
        "Class columns: share of each head's attention; "
        "ablation: the rise of that loss with the head's output zeroed.",
        *bound_line(rep["score_bound"]),
        f"Whole layer's attention removed: {layers} nats.",
        f"Pruning the {pruned} whose ablation costs < {rep['prune_below']} nats, "
        f"all at once: loss {rep['pruned_loss']:.4f} ({rep['pruned_nats']:+.4f} nats).",
        "",
        *circuit_markdown(rep),
    ]
    return "\n".join(lines)


def bound_line(bounds):
    """The QK-norm bound on a score, per layer, as a line of the report (none without it)."""
    if bounds is None:
        return []
    layers = ", ".join(f"layer {i} {b:.1f}" for i, b in enumerate(bounds))
    return [f"QK-norm bounds each scaled score, |q k^T / sqrt(d)| <= {layers}."]


def circuit_markdown(rep):
    """The circuit: each later head's strongest Q-, K- and V-composition source, and
    each head knocked out on the induction probe."""
    cols = [
        "layer",
        "head",
        "label",
        "Q from",
        "K from",
        "V from",
        "copy loss without",
        "later induction without",
    ]
    lines = [
        "Composition (Elhage et al. 2021, from the weights): the earlier head whose output "
        "composes most into each head's query, key and value. Knock-out on the induction "
        f"probe: the loss on its repeated half ({rep['copy_loss']['copy_loss']:.3f} nats; "
        f"{rep['copy_loss']['first_copy_loss']:.3f} on the first half) and the best "
        "induction score of a later head, with the head removed.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for h in rep["heads"]:
        sources = []
        for name in ("q", "k", "v"):
            found = h["composition_from"][name]
            sources.append("-" if found is None else f"L{found[0][0]}H{found[0][1]} {found[1]:.2f}")
        later = h["knockout_later_induction"]
        best = f"{max(max(row) for row in later):.2f}" if later else "-"
        cells = [
            h["layer"],
            h["head"],
            h["label"],
            *sources,
            f"{h['knockout_copy_loss']:.3f}",
            best,
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def save_picture(rep, path, n_layer, n_head):
    """One cell per head, coloured by its ablation cost, named by its label."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    nats = np.array([h["ablation_nats"] for h in rep["heads"]]).reshape(n_layer, n_head)
    top = max(float(nats.max()), 1e-6)
    fig, ax = plt.subplots(
        figsize=(max(6.0, 1.5 * n_head + 2.2), 0.9 * n_layer + 1.5), layout="constrained"
    )
    # a square-root colour scale, so that the cheap heads differ from each other too
    im = ax.imshow(
        np.clip(nats, 0, None), cmap="Oranges", norm=PowerNorm(0.5, vmin=0, vmax=top), aspect="auto"
    )
    for h in rep["heads"]:
        lines = [h["label"].replace("mixed: ", "mixed:\n"), f"{h['ablation_nats']:+.3f}"]
        if h["induction"] >= 0.1:
            lines.append(f"induction {h['induction']:.2f}")
        if h["prune"]:
            lines.append("(prune)")
        colour = "white" if h["ablation_nats"] > 0.5 * top else "black"
        ax.text(
            h["head"],
            h["layer"],
            "\n".join(lines),
            ha="center",
            va="center",
            fontsize=8.5,
            color=colour,
        )
    ax.set_xticks(range(n_head), [str(h) for h in range(n_head)])
    ax.set_yticks(range(n_layer), [str(layer) for layer in range(n_layer)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(
        f"Each head's label, and what removing it adds to the val loss\n"
        f"(baseline {rep['baseline_loss']:.3f} nats; heads.md has the table)",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, label="ablation cost, nats")
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(rep, folder, n_layer, n_head):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "heads.json"), "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1)
    table = markdown(rep)
    with open(os.path.join(folder, "heads.md"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    save_picture(rep, os.path.join(folder, "heads.png"), n_layer, n_head)
    return table


def main(cfg):
    if cfg.max_windows < 0 or cfg.batch_size < 0:
        raise HeadsError(
            "--max_windows and --batch_size must be >= 0 (0: all windows, an automatic batch)"
        )
    if cfg.data_root is not None:
        cfg.data_root = str(cfg.data_root)
    device = pick_device(cfg.device)
    dtype = inference_dtype(cfg.dtype, device)
    source = cfg.init_from or cfg.out_dir
    model, tok, folder = load_model(cfg.init_from, cfg.out_dir)
    data, dataset = val_tokens(source, tok, cfg.dataset, cfg.data_root)
    model.to(device=device, dtype=dtype).eval()
    cfg.batch_size = cfg.batch_size or max(1, BATCH_TOKENS // model.config.block_size)
    out = cfg.heads_dir or os.path.join(folder, "heads")
    cli.output_folder(out, "--heads_dir")  # found now, not after the measurements
    rep = report(cfg, model, tok, data, dataset, source)
    try:
        with cli.replacing_files(out) as folder:
            table = write(rep, folder, model.config.n_layer, model.config.n_head)
    except OSError as e:
        raise cli.Failed(
            f"cannot write into {out} ({e.strerror or e}); pass --heads_dir=DIR"
        ) from None
    print(table)
    print(f"wrote {os.path.join(out, 'heads.json')}, heads.md and heads.png")


# what to try when the GPU runs out of memory
OUT_OF_MEMORY = "try --device=cpu or a smaller --batch_size"


def run(argv):
    """The command: what `python heads.py ...` exits with (cli.py)."""
    return cli.run(main, argv, __doc__, Settings, (HeadsError,), OUT_OF_MEMORY)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
