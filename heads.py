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

It writes <folder>/heads/heads.json, heads.md (printed too) and heads.png, a
picture of every head's label and importance. docs/heads.md shows it on two
models. Options are --key=value; `python heads.py --help` lists them.
"""

import contextlib
import json
import os
import sys

import hardware

hardware.check_bf16()  # before torch loads: whether bfloat16 runs here, and its fix (hardware.py)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import attention_maps  # noqa: E402
from attention_maps import CLASSES  # noqa: E402
from checkpoint import CheckpointError, checkpoint_path  # noqa: E402
from configurator import ConfigError, describe, parse_args  # noqa: E402
from data.prepare import DataError, ensure_dataset, load_meta, load_tokens  # noqa: E402
from sample import SampleError, load_model, pick_device, pick_dtype  # noqa: E402
from tokenizer import TokenizerError  # noqa: E402

DEFAULTS = dict(
    out_dir="out-shakespeare-char",  # the checkpoint's folder; the results go to <out_dir>/heads
    init_from="",  # "" = out_dir's checkpoint; or a checkpoint folder, or a Hugging Face GPT-2 folder
    dataset="",  # "" = the one the checkpoint was trained on; else a prepared dataset's name
    data_root=None,  # the folder of dataset folders; None: the checkpoint's, else data/ in this repo
    max_windows=0,  # 0 = every window of the val split; N: N windows spread evenly over it
    batch_size=0,  # windows per forward; 0: as many as hold BATCH_TOKENS tokens
    prune_below=0.01,  # nats: heads whose ablation costs less are pruning candidates
    seed=1337,  # the induction probe's random tokens
    device="auto",  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    dtype="auto",  # auto (bfloat16 on a GPU that has it, else float32), float32, bfloat16, float16
)
INDUCTION = 0.4  # a head with an induction score >= 0.4 is labelled induction (as for previous-token heads)
PROBE_SEQUENCES = 8
BATCH_TOKENS = 8192


class HeadsError(Exception):
    """A problem with the user's input; the message is one line saying what to do."""


# -----------------------------------------------------------------------------
# The val split, in the windows of the val loss of record


def val_tokens(cfg, source, tok):
    """The val split's token ids (a uint16 memmap) and the dataset folder."""
    name, root = cfg["dataset"], cfg["data_root"]
    path = checkpoint_path(source) if os.path.isdir(source) else source
    if os.path.isfile(path):  # a checkpoint of this project says what it read (mmap: no weights are read)
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        name = name or ckpt.get("dataset", "")
        root = root or ckpt.get("config", {}).get("data_root")
    if not name:
        raise HeadsError(f"{source} does not say which dataset it was trained on; pass --dataset=NAME "
                         "(a prepared folder under data/ or --data_root)")
    folder = ensure_dataset(name, root)
    if load_meta(folder)["tokenizer"] != tok.describe():
        raise HeadsError(f"the dataset in {folder} was encoded with another tokenizer than the model's; "
                         "pass the --dataset it was trained on")
    return load_tokens(folder, "val"), folder


def windows(n_tokens, block_size, max_windows=0):
    """(start, length) of the windows the val loss of record reads: every token
    that has a next one, in non-overlapping block_size windows, the last one
    shorter. max_windows > 0 keeps that many, spread evenly over the split."""
    n = n_tokens - 1
    spans = [(s, min(block_size, n - s)) for s in range(0, n, block_size)]
    if 0 < max_windows < len(spans):
        keep = np.unique(np.linspace(0, len(spans) - 1, max_windows).round().astype(int))
        spans = [spans[k] for k in keep]
    return spans


def batches(data, spans, batch_size, device):
    """x, y (B, T) batches of equal-length windows, in order."""
    by_length = {}
    for start, length in spans:
        by_length.setdefault(length, []).append(start)
    for length, starts in by_length.items():
        for k in range(0, len(starts), batch_size):
            rows = np.array(starts[k:k + batch_size])[:, None] + np.arange(length + 1)  # (B, T + 1)
            chunk = torch.from_numpy(data[rows].astype(np.int64)).to(device)
            yield chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def val_loss(model, data, spans, batch_size):
    """Mean loss per token over the windows: with every window, train.py's full_val_loss."""
    device = model.lm_head.weight.device
    total, count = 0.0, 0
    for x, y in batches(data, spans, batch_size, device):
        total += model(x, y)[1].item() * y.numel()
        count += y.numel()
    return total / count


# -----------------------------------------------------------------------------
# 1. Patterns over real text


@torch.no_grad()
def patterns(model, tok, data, spans, batch_size):
    """attention_maps.describe() of every head, over the windows: a list of
    (n_layer) lists of (n_head) dicts."""
    device = model.lm_head.weight.device
    sums = [None] * model.config.n_layer
    for x, _ in batches(data, spans, batch_size, device):
        _, _, maps = model(x, return_attention=True)
        for b, ids in enumerate(x.tolist()):
            tokens = tok.token_strings(ids)
            for layer, m in enumerate(maps):
                sums[layer] = attention_maps.add_sums(
                    sums[layer], attention_maps.pattern_sums(m[b].float().cpu().numpy(), tokens))
    return [[attention_maps.describe(s, h) for h in range(model.config.n_head)] for s in sums]


# -----------------------------------------------------------------------------
# 2. The induction probe


def probe_tokens(config, seed, n_seq=PROBE_SEQUENCES):
    """(n_seq, 2L) token ids x || x, each x L distinct random tokens, and L."""
    L = min(32, config.block_size // 2, config.vocab_size - 1)
    if L < 2:
        raise HeadsError(f"the induction probe needs block_size >= 4 and vocab_size >= 3 (this model has "
                         f"{config.block_size} and {config.vocab_size})")
    gen = torch.Generator().manual_seed(seed)
    x = torch.stack([torch.randperm(config.vocab_size, generator=gen)[:L] for _ in range(n_seq)])  # (n_seq, L)
    return torch.cat([x, x], dim=1), L


def probe_scores(maps, L):
    """Scores (n_layer, n_head) of attention maps (B, n_head, 2L, 2L) per layer on
    x || x, for each position i of the second copy, averaged over i and the batch:
      induction  weight on i - L + 1, the token after the earlier occurrence of i's token
      duplicate  weight on i - L, that earlier occurrence
      previous   weight on i - 1
    Returns a dict of those three numpy arrays."""
    i = torch.arange(L, 2 * L)
    keys = {"induction": i - L + 1, "duplicate": i - L, "previous": i - 1}
    return {name: torch.stack([torch.as_tensor(m)[:, :, i, k].double().mean(dim=(0, 2)) for m in maps]).numpy()
            for name, k in keys.items()}


@torch.no_grad()
def induction_scores(model, seed):
    """probe_scores of the model's attention on probe_tokens."""
    idx, L = probe_tokens(model.config, seed)
    _, _, maps = model(idx.to(model.lm_head.weight.device), return_attention=True)
    return probe_scores([m.cpu() for m in maps], L)


# -----------------------------------------------------------------------------
# 3. Importance by ablation


@contextlib.contextmanager
def ablated(model, heads):
    """Inside, the given (layer, head) pairs add nothing: their slice of the
    attention output is zeroed on its way into c_proj (c_proj's bias stays)."""
    hs = model.config.n_embd // model.config.n_head
    keep = {}
    for layer, head in heads:
        w = model.lm_head.weight
        mask = keep.setdefault(layer, torch.ones(model.config.n_embd, device=w.device, dtype=w.dtype))
        mask[head * hs:(head + 1) * hs] = 0

    def hook(mask):
        return lambda module, args: (args[0] * mask,)

    handles = [model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook(mask))
               for layer, mask in keep.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def ablation(model, data, spans, batch_size, prune_below):
    """The val loss with nothing removed, with each head, each layer's
    attention, and every head cheaper than prune_below removed."""
    n_layer, n_head = model.config.n_layer, model.config.n_head
    every = [(layer, head) for layer in range(n_layer) for head in range(n_head)]
    runs = [[]] + [[lh] for lh in every] + [[(layer, h) for h in range(n_head)] for layer in range(n_layer)]
    losses = []
    for removed in tqdm(runs, desc="ablation", file=sys.stderr, leave=False):
        with ablated(model, removed):
            losses.append(val_loss(model, data, spans, batch_size))
    base = losses[0]
    head_nats = np.array(losses[1:1 + len(every)]).reshape(n_layer, n_head) - base
    pruned = [lh for lh in every if head_nats[lh] < prune_below]
    with ablated(model, pruned):
        pruned_loss = val_loss(model, data, spans, batch_size) if pruned else base
    return {"baseline_loss": base, "head_nats": head_nats,
            "layer_nats": np.array(losses[1 + len(every):]) - base,
            "pruned": pruned, "pruned_loss": pruned_loss}


# -----------------------------------------------------------------------------
# The report


def report(cfg, model, tok, data, folder, source):
    """Every measurement of every head, as the dict heads.json holds."""
    c = model.config
    spans = windows(len(data), c.block_size, cfg["max_windows"])
    if not spans:
        raise HeadsError("the val split has fewer than 2 tokens; prepare the dataset again")
    pats = patterns(model, tok, data, spans, cfg["batch_size"])
    probe = induction_scores(model, cfg["seed"])
    abl = ablation(model, data, spans, cfg["batch_size"], cfg["prune_below"])
    order = np.argsort(-abl["head_nats"], axis=None, kind="stable")  # most important first
    rank = np.empty(order.size, dtype=int)
    rank[order] = np.arange(1, order.size + 1)
    heads = []
    for layer in range(c.n_layer):
        for h in range(c.n_head):
            p = pats[layer][h]
            scores = {name: round(float(v[layer, h]), 4) for name, v in probe.items()}
            heads.append({
                "layer": layer, "head": h,
                "label": "induction" if scores["induction"] >= INDUCTION else p["label"],
                "pattern": p["label"], "scores": p["scores"], "lift": p["lift"],
                "concentration": p["concentration"], "entropy": p["entropy"],
                "self_weight": p["self_weight"], "previous_weight": p["previous_weight"],
                **scores,
                "ablation_nats": round(float(abl["head_nats"][layer, h]), 5),
                "rank": int(rank[layer * c.n_head + h]),
                "prune": (layer, h) in abl["pruned"],
            })
    return {
        "checkpoint": source, "dataset": folder, "windows": len(spans),
        "tokens": sum(length for _, length in spans), "seed": cfg["seed"],
        "dtype": str(model.lm_head.weight.dtype).removeprefix("torch."),
        "baseline_loss": round(abl["baseline_loss"], 5),
        "layer_ablation_nats": [round(float(v), 5) for v in abl["layer_nats"]],
        "prune_below": cfg["prune_below"],
        "pruned_loss": round(abl["pruned_loss"], 5),
        "pruned_nats": round(abl["pruned_loss"] - abl["baseline_loss"], 5),
        "induction_probe": {"length": probe_tokens(c, 0)[1], "sequences": PROBE_SEQUENCES, "threshold": INDUCTION},
        "rule": attention_maps.LABEL_RULE,
        "heads": heads,
    }


def markdown(rep):
    """The report as a markdown table and a few lines of totals."""
    cols = ["layer", "head", "label", "concentration", *CLASSES, "induction", "ablation (nats)", "rank"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for h in rep["heads"]:
        cells = [h["layer"], h["head"], h["label"] + (" (prune)" if h["prune"] else ""), h["concentration"],
                 *(f"{h['scores'][c]:.2f}" for c in CLASSES), f"{h['induction']:.2f}",
                 f"{h['ablation_nats']:+.4f}", h["rank"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    n_pruned = sum(h["prune"] for h in rep["heads"])
    layers = ", ".join(f"layer {i} {v:+.3f}" for i, v in enumerate(rep["layer_ablation_nats"]))
    lines += [
        "",
        f"Val loss of record {rep['baseline_loss']:.4f} ({rep['tokens']:,} tokens in {rep['windows']} "
        f"windows, {rep['dtype']}). Class columns: share of each head's attention; ablation: the rise "
        "of that loss with the head's output zeroed.",
        f"Whole layer's attention removed: {layers} nats.",
        f"Pruning the {n_pruned} heads whose ablation costs < {rep['prune_below']} nats, all at once: "
        f"loss {rep['pruned_loss']:.4f} ({rep['pruned_nats']:+.4f} nats).",
    ]
    return "\n".join(lines)


def save_picture(rep, path, n_layer, n_head):
    """One cell per head, coloured by its ablation cost, named by its label."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    nats = np.array([h["ablation_nats"] for h in rep["heads"]]).reshape(n_layer, n_head)
    top = max(float(nats.max()), 1e-6)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 * n_head + 2.2), 0.9 * n_layer + 1.5), layout="constrained")
    # a square-root colour scale, so that the cheap heads differ from each other too
    im = ax.imshow(np.clip(nats, 0, None), cmap="Oranges", norm=PowerNorm(0.5, vmin=0, vmax=top), aspect="auto")
    for h in rep["heads"]:
        lines = [h["label"].replace("mixed: ", "mixed:\n"), f"{h['ablation_nats']:+.3f}"]
        if h["induction"] >= 0.1:
            lines.append(f"induction {h['induction']:.2f}")
        if h["prune"]:
            lines.append("(prune)")
        colour = "white" if h["ablation_nats"] > 0.5 * top else "black"
        ax.text(h["head"], h["layer"], "\n".join(lines), ha="center", va="center", fontsize=8.5, color=colour)
    ax.set_xticks(range(n_head), [str(h) for h in range(n_head)])
    ax.set_yticks(range(n_layer), [str(layer) for layer in range(n_layer)])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"Each head's label, and what removing it adds to the val loss\n"
                 f"(baseline {rep['baseline_loss']:.3f} nats; heads.md has the table)", fontsize=9)
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


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\n\noptions (defaults):\n" + describe(DEFAULTS))
        return
    cfg = parse_args(DEFAULTS, argv, allow_files=False)
    if cfg["max_windows"] < 0 or cfg["batch_size"] < 0:
        raise HeadsError("--max_windows and --batch_size must be >= 0 (0: all windows, an automatic batch)")
    if cfg["data_root"] is not None:
        cfg["data_root"] = str(cfg["data_root"])
    device = pick_device(cfg["device"])
    dtype = pick_dtype(cfg["dtype"], device)
    model, tok, folder = load_model(cfg)
    source = cfg["init_from"] or cfg["out_dir"]
    data, dataset = val_tokens(cfg, source, tok)
    model.to(device=device, dtype=dtype).eval()
    cfg["batch_size"] = cfg["batch_size"] or max(1, BATCH_TOKENS // model.config.block_size)
    rep = report(cfg, model, tok, data, dataset, source)
    out = os.path.join(folder, "heads")
    try:
        table = write(rep, out, model.config.n_layer, model.config.n_head)
    except OSError as e:
        raise HeadsError(f"cannot write into {out} ({e.strerror or e}); pass an --out_dir you can write to") from None
    print(table)
    print(f"wrote {os.path.join(out, 'heads.json')}, heads.md and heads.png")


def run(argv):
    """main() with every expected failure turned into one line on stderr."""
    try:
        main(argv)
        return 0
    except (ConfigError, CheckpointError, TokenizerError, DataError, SampleError, HeadsError) as e:
        print(f"error: {e}", file=sys.stderr)
    except torch.OutOfMemoryError:
        print("error: out of GPU memory; try --device=cpu or a smaller --batch_size", file=sys.stderr)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
