"""
The measurements behind heads.py, for every command that looks at heads.

What a head attends to over real text (patterns, in the classes of
attention_maps), whether it is an induction head (the repeated-random-tokens
probe of Olsson et al. 2022), and what the val loss loses without it (ablation:
its slice of the attention output zeroed before W_O). heads.py reports them;
the explorer and the experiments use the same definitions from here.
"""

import contextlib
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from data.dataset import ensure_dataset, load_meta, load_tokens
from support import attention_maps
from support.checkpoint import checkpoint_path

INDUCTION = (
    0.4  # a head with an induction score >= 0.4 is labelled induction (as for previous-token heads)
)


PROBE_SEQUENCES = 8


BATCH_TOKENS = 8192


class HeadsError(ValueError):
    """A problem with the user's input; the message is one line saying what to do. A
    ValueError, as train.py's bad settings are: --log_heads on a model the probe cannot
    read stops the run before it starts."""


def val_tokens(source, tok, name="", root=None):
    """The val split's token ids (a uint16 memmap) and the dataset folder: of the
    dataset name under root, or, name "", of the one source's checkpoint was trained on."""
    path = checkpoint_path(source) if os.path.isdir(source) else source
    # a checkpoint of this project says what it read (mmap: no weights are read)
    if os.path.isfile(path):
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        recorded = ckpt.get("config")
        # a damaged record (not the dict and string train.py writes) counts as none
        if not isinstance(recorded, dict):
            recorded = {}
        if not name and isinstance(ckpt.get("dataset"), str):
            name = ckpt["dataset"]
        if not root and isinstance(recorded.get("data_root"), str):
            root = recorded["data_root"]
            # a relative root is relative to where training ran; from another folder the
            # dataset would be looked for, or tiny Shakespeare prepared, in the wrong place
            if root and not os.path.isabs(root) and not os.path.isdir(root):
                raise HeadsError(
                    f"{source} was trained on a dataset in --data_root={root}, which is no "
                    f"folder from here ({os.getcwd()}); pass --data_root=FOLDER, the folder "
                    "that holds it"
                )
    if not name:
        raise HeadsError(
            f"{source} does not say which dataset it was trained on; pass --dataset=NAME "
            "(a prepared folder under data/ or --data_root)"
        )
    folder = ensure_dataset(name, root)
    if load_meta(folder)["tokenizer"] != tok.describe():
        raise HeadsError(
            f"the dataset in {folder} was encoded with another tokenizer than the model's; "
            "pass the --dataset it was trained on"
        )
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
            first = np.array(starts[k : k + batch_size])
            rows = first[:, None] + np.arange(length + 1)  # (B, T + 1)
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


@torch.no_grad()
def patterns(model, tok, data, spans, batch_size):
    """attention_maps.describe() of every head, over the windows: a list of
    (n_layer) lists of (n_head) dicts."""
    device = model.lm_head.weight.device
    sums = [None] * model.config.n_layer
    for x, _ in batches(data, spans, batch_size, device):
        _, maps = model.attention_maps(x)
        for b, ids in enumerate(x.tolist()):
            tokens = tok.token_strings(ids)
            for layer, m in enumerate(maps):
                sums[layer] = attention_maps.add_sums(
                    sums[layer], attention_maps.pattern_sums(m[b].float().cpu().numpy(), tokens)
                )
    return [[attention_maps.describe(s, h) for h in range(model.config.n_head)] for s in sums]


def probe_length(config):
    """L, the length of each x in the probe's x || x: up to 32, within half the context
    and the vocabulary less one. HeadsError where the model is too small for 2."""
    L = min(32, config.block_size // 2, config.vocab_size - 1)
    if L < 2:
        raise HeadsError(
            f"the induction probe needs block_size >= 4 and vocab_size >= 3 (this model has "
            f"{config.block_size} and {config.vocab_size})"
        )
    return L


def probe_tokens(config, seed, n_seq=PROBE_SEQUENCES):
    """(n_seq, 2L) token ids x || x, each x L distinct random tokens, and L."""
    L = probe_length(config)
    gen = torch.Generator().manual_seed(seed)
    sequences = [torch.randperm(config.vocab_size, generator=gen)[:L] for _ in range(n_seq)]
    x = torch.stack(sequences)  # (n_seq, L)
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
    return {
        name: torch.stack(
            [torch.as_tensor(m)[:, :, i, k].double().mean(dim=(0, 2)) for m in maps]
        ).numpy()
        for name, k in keys.items()
    }


@torch.no_grad()
def induction_scores(model, seed):
    """probe_scores of the model's attention on probe_tokens."""
    idx, L = probe_tokens(model.config, seed)
    _, maps = model.attention_maps(idx.to(model.lm_head.weight.device))
    return probe_scores([m.cpu() for m in maps], L)


@torch.no_grad()
def repeat_losses(model, idx, L):
    """The mean loss on idx = x || x (n, 2L), on the first copy of x and on the second.
    A model that copies from its context (an induction head) predicts the second far
    better than the first. Returns (first, second)."""
    logits, _ = model(idx)  # (n, 2L, vocab)
    losses = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), idx[:, 1:], reduction="none"
    )  # (n, 2L - 1): the loss of predicting token i + 1 at position i
    # positions 0 .. L - 2 predict the first copy; L .. 2L - 2 the second (L - 1 predicts
    # the second copy's first token, which the first copy does not tell)
    return losses[:, : L - 1].mean().item(), losses[:, L:].mean().item()


def copy_losses(model, seed):
    """repeat_losses on the induction probe (random tokens, so the first copy is
    unpredictable): the in-context learning the probe sees."""
    idx, L = probe_tokens(model.config, seed)
    return repeat_losses(model, idx.to(model.lm_head.weight.device), L)


@torch.no_grad()
def knockouts(model, seed):
    """Each head removed in turn (ablated: its output zeroed before c_proj): every head's
    induction score and the probe's second-copy loss without it. What it measures is the
    total effect of the head on the induction circuit, through every later path: a
    previous-token head that an induction head reads through K-composition should, when
    removed, take the induction head's score and the copying with it.
    Returns {"induction": (n_layer, n_head, n_layer, n_head) scores, entry [l1, h1, l2, h2]
    the score of (l2, h2) without (l1, h1); "copy_loss": (n_layer, n_head) second-copy
    losses; "baseline": {"induction": (n_layer, n_head), "first_copy_loss", "copy_loss"}}."""
    n_layer, n_head = model.config.n_layer, model.config.n_head
    first, second = copy_losses(model, seed)
    baseline = {
        "induction": induction_scores(model, seed)["induction"],
        "first_copy_loss": first,
        "copy_loss": second,
    }
    induction = np.zeros((n_layer, n_head, n_layer, n_head))
    copy_loss = np.zeros((n_layer, n_head))
    for layer in range(n_layer):
        for head in range(n_head):
            with ablated(model, [(layer, head)]):
                induction[layer, head] = induction_scores(model, seed)["induction"]
                copy_loss[layer, head] = copy_losses(model, seed)[1]
    return {"induction": induction, "copy_loss": copy_loss, "baseline": baseline}


@contextlib.contextmanager
def ablated(model, heads):
    """Inside, the given (layer, head) pairs add nothing: their slice of the
    attention output is zeroed on its way into c_proj (c_proj's bias stays)."""
    hs = model.config.n_embd // model.config.n_head
    keep = {}
    for layer, head in heads:
        w = model.lm_head.weight
        mask = keep.setdefault(
            layer, torch.ones(model.config.n_embd, device=w.device, dtype=w.dtype)
        )
        mask[head * hs : (head + 1) * hs] = 0

    def hook(mask):
        return lambda module, args: (args[0] * mask,)

    handles = [
        model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook(mask))
        for layer, mask in keep.items()
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


PATHS = ("q", "k", "v")  # the three inputs of a head: what composition is into


@contextlib.contextmanager
def path_ablated(model, writers, reader_layer, paths):
    """Inside, the direct path from the writer heads (layer, head) of one earlier layer
    into reader_layer's queries, keys or values (paths, a subset of PATHS) is cut: those
    projections read the residual stream less the writers' outputs, everything else
    reads it whole. With paths=("k",) this removes exactly what K-composition is about:
    the writers' outputs as the later heads' keys see them (Elhage et al. 2021).
    The writers' outputs through any other route (an MLP, the unembedding) stay."""
    (layer,) = {w_layer for w_layer, _ in writers}
    if reader_layer <= layer:
        raise ValueError(f"a head of layer {reader_layer} reads nothing layer {layer} writes")
    c = model.config
    hs = c.n_embd // c.n_head
    kv_width = c.n_kv_head * hs
    columns = {"q": slice(0, c.n_embd), "k": slice(c.n_embd, c.n_embd + kv_width)}
    columns["v"] = slice(c.n_embd + kv_width, None)
    keep = torch.zeros(c.n_embd, device=model.lm_head.weight.device)
    for _, head in writers:
        keep[head * hs : (head + 1) * hs] = 1
    w_o = model.transformer.h[layer].attn.c_proj.weight  # (C out, C in)
    reader = model.transformer.h[reader_layer]
    seen = {}

    def writers_output(module, args):
        seen["out"] = (args[0] * keep) @ w_o.T  # (B, T, C) the writers' part of c_proj's output

    def stream(module, args):
        seen["x"] = args[0]  # (B, T, C) the residual stream the reader layer reads

    def projections(module, args, output):
        # F.linear, not module(): calling the module would run this hook again
        without = F.linear(reader.ln_1(seen["x"] - seen["out"]), module.weight, module.bias)
        output = output.clone()
        for path in paths:
            output[..., columns[path]] = without[..., columns[path]]
        return output

    handles = [
        model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(writers_output),
        reader.register_forward_pre_hook(stream),
        reader.attn.c_attn.register_forward_hook(projections),
    ]
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
    runs = (
        [[]]
        + [[lh] for lh in every]
        + [[(layer, h) for h in range(n_head)] for layer in range(n_layer)]
    )
    losses = []
    for removed in tqdm(runs, desc="ablation", file=sys.stderr, leave=False):
        with ablated(model, removed):
            losses.append(val_loss(model, data, spans, batch_size))
    base = losses[0]
    head_nats = np.array(losses[1 : 1 + len(every)]).reshape(n_layer, n_head) - base
    pruned = [lh for lh in every if head_nats[lh] < prune_below]
    with ablated(model, pruned):
        pruned_loss = val_loss(model, data, spans, batch_size) if pruned else base
    return {
        "baseline_loss": base,
        "head_nats": head_nats,
        "layer_nats": np.array(losses[1 + len(every) :]) - base,
        "pruned": pruned,
        "pruned_loss": pruned_loss,
    }
