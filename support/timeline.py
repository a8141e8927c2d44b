"""
A training run's timeline: when did each head take on its job?

train.py calls at_evaluation() at every evaluation. With --snapshots=True it
keeps a weights-only checkpoint in out_dir/snapshots/iter_NNNNNN.pt, in
ckpt.pt's format (model weights, model args, tokenizer; no optimizer state, and
resuming never reads them), so sample.py, heads.py and explore.py load any of
them as they load ckpt.pt, and explore.py steps through them. At most
snapshot_limit are kept: when one more would pass it, every other one goes, so
those left stay evenly spread over the run (the newest is always kept).

With --log_heads=True it adds each head's induction score and label to the
evaluation's line in log.jsonl: the induction probe of head_measures (random
tokens repeated) and the pattern label of attention_maps on the first windows
of the val split, the fixed batch every evaluation reads, so that the numbers
of two evaluations compare. It also adds the in-context learning score
(icl_score, below) on the first ICL_WINDOWS windows of the val split, the same
windows at every evaluation. experiments/head_timeline.py draws them.
"""

import dataclasses
import os
import re

import numpy as np
import torch
import torch.nn.functional as F

from data.tokenizer import get_tokenizer
from support import head_measures
from support.checkpoint import SNAPSHOT_DIR, checkpoint_path, save_checkpoint, what_is_kept
from support.run_log import read_evaluations

SNAPSHOT_NAME = re.compile(r"^iter_(\d{6,})\.pt$")
SEED = 1337  # the induction probe's random tokens: heads.py's and the explorer's
PROBE_WINDOWS = 4  # val windows the pattern labels are read on ...
PROBE_LENGTH = 128  # ... each of at most this many tokens
# val windows of block_size tokens the in-context learning score reads: on natural text its
# standard error is then about 0.2 nats (docs/heads.md), on the induction corpus far less
# than the 2.6 nats the score falls by
ICL_WINDOWS = 64
ICL_BATCH_TOKENS = 8192  # tokens per forward of that score (the logits are batch x T x vocab)


def snapshot_path(out_dir, iter_num):
    return os.path.join(out_dir, SNAPSHOT_DIR, f"iter_{iter_num:06d}.pt")


def list_snapshots(out_dir):
    """{iter: path} of the snapshots in out_dir, oldest first."""
    folder = os.path.join(out_dir, SNAPSHOT_DIR)
    if not os.path.isdir(folder):
        return {}
    found = {}
    for name in os.listdir(folder):
        match = SNAPSHOT_NAME.match(name)
        if match:
            found[int(match[1])] = os.path.join(folder, name)
    return dict(sorted(found.items()))


def checkpoint_step(out_dir):
    """The iter of out_dir's ckpt.pt, or None when there is none (mmap: no weights read)."""
    path = checkpoint_path(out_dir)
    if not os.path.isfile(path):
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (RuntimeError, OSError, ValueError, EOFError):
        return None
    return ckpt.get("iter_num")


def logged_iters(out_dir):
    """The iters of the evaluations in out_dir/log.jsonl."""
    if not os.path.isfile(os.path.join(out_dir, "log.jsonl")):
        return set()
    return {record["iter"] for record in read_evaluations(out_dir)}


# -----------------------------------------------------------------------------
# Snapshots


def write_snapshot(cfg, model, meta, iter_num):
    """The weights at iter_num, as ckpt.pt holds them, less the optimizer and RNG state."""
    snapshot = dict(
        model=model.state_dict(),
        model_args=dataclasses.asdict(model.config),
        iter_num=iter_num,
        config=dataclasses.asdict(cfg),
        tokenizer=meta["tokenizer"],
        dataset=cfg.dataset,
    )
    # a snapshot has no earlier version: what a failed one leaves is ckpt.pt
    kept = f"no snapshot at iter {iter_num}; {what_is_kept(cfg.out_dir)}"
    save_checkpoint(snapshot, snapshot_path(cfg.out_dir, iter_num), kept)


def kept_snapshots(iters, newest, limit, eval_interval):
    """Which of iters (with newest) to keep: those at multiples of stride * eval_interval
    for the smallest stride in 1, 2, 4, ... that keeps at most limit (>= 2), and newest."""
    stride = 1
    while True:
        every = stride * eval_interval
        chosen = {i for i in iters if i == newest or i % every == 0}
        # past newest, only iter 0 and newest are multiples: two, within any limit
        if len(chosen) <= limit or every > newest:
            return chosen
        stride *= 2


def update_snapshots(cfg, model, meta, iter_num):
    """Write iter_num's snapshot; remove those of another run (their iter is not in
    this run's log) and those past snapshot_limit."""
    write_snapshot(cfg, model, meta, iter_num)
    found = list_snapshots(cfg.out_dir)
    ours = logged_iters(cfg.out_dir) | {iter_num}
    kept = kept_snapshots(set(found) & ours, iter_num, cfg.snapshot_limit, cfg.eval_interval)
    for i, path in found.items():
        if i not in kept:
            os.remove(path)


# -----------------------------------------------------------------------------
# Heads


def probe_text(val, n):
    """The first n tokens of the val split as a numpy array, whatever holds the split:
    a tensor on the device, a memmap or shards."""
    if isinstance(val, torch.Tensor):
        return val[:n].cpu().numpy()
    return np.asarray(val[np.arange(n)])


@torch.no_grad()
def head_probe(model, tok, tokens):
    """Every head's induction score and label, by the explorer's and heads.py's rule
    (induction when the probe says so, else its pattern), the pattern read on tokens
    (a 1-D numpy array) in windows of the model's context or PROBE_LENGTH.
    Returns {"induction": (n_layer) lists of (n_head) floats, "label": ... of str}."""
    length = min(model.config.block_size, PROBE_LENGTH, len(tokens) - 1)
    spans = head_measures.windows(len(tokens), length, PROBE_WINDOWS)
    spans = [(start, n) for start, n in spans if n == length]
    was_training = model.training
    model.eval()
    try:
        induction = head_measures.induction_scores(model, SEED)["induction"]  # (n_layer, n_head)
        found = head_measures.patterns(model, tok, tokens, spans, PROBE_WINDOWS)
    finally:
        model.train(was_training)
    labels = []
    for layer, row in enumerate(found):
        labels.append([])
        for head, pattern in enumerate(row):
            if induction[layer, head] >= head_measures.INDUCTION:
                labels[layer].append("induction")
            else:
                labels[layer].append(pattern["label"])
    return {"induction": np.round(induction, 4).tolist(), "label": labels}


def icl_positions(block_size):
    """The early and late positions of the in-context learning score: Olsson et al.
    (2022) compare the loss on token 50 with the loss on token 500 of a 512-token
    context; here those positions are scaled to the context, 50/512 and 500/512 of
    block_size (6 and 62 for 64 tokens, 25 and 250 for 256), counted from 0 as the
    positions whose next token is predicted."""
    early = round(block_size * 50 / 512)
    late = min(round(block_size * 500 / 512), block_size - 1)
    return early, late


@torch.no_grad()
def icl_score(model, tokens):
    """Olsson et al.'s in-context learning score on tokens (a 1-D numpy array): the mean
    loss at the late position of icl_positions minus the mean loss at the early one,
    over the non-overlapping windows of block_size tokens that tokens holds. Negative
    when the model predicts better with more context: it learns from its context.
    Returns (score, windows read)."""
    T = model.config.block_size
    n_windows = (len(tokens) - 1) // T
    early, late = icl_positions(T)
    rows = np.arange(n_windows)[:, None] * T + np.arange(T + 1)  # (N, T + 1)
    device = model.lm_head.weight.device
    chunk = torch.from_numpy(tokens[rows].astype(np.int64)).to(device)  # (N, T + 1)
    was_training = model.training
    model.eval()
    losses = []
    try:
        for part in chunk.split(max(1, ICL_BATCH_TOKENS // T)):
            logits, _ = model(part[:, :-1])  # (B, T, vocab)
            picked = logits[:, [early, late]].float()  # (B, 2, vocab)
            targets = part[:, [early + 1, late + 1]]  # (B, 2)
            losses.append(F.cross_entropy(picked.transpose(1, 2), targets, reduction="none"))
    finally:
        model.train(was_training)
    losses = torch.cat(losses).mean(dim=0)  # (2,) mean loss at the early and late position
    return (losses[1] - losses[0]).item(), n_windows


def check_settings(cfg):
    """The settings of --snapshots and --log_heads, checked before any work."""
    if cfg.snapshot_limit < 2:
        raise ValueError(f"snapshot_limit must be 2 or more, got {cfg.snapshot_limit}")


def check(config):
    """For --log_heads: HeadsError (a ValueError) where a model of config's size is too
    small for the induction probe, so that the run stops before it trains."""
    try:
        head_measures.probe_length(config)
    except head_measures.HeadsError as e:
        raise head_measures.HeadsError(f"log_heads=True: {e}") from None


def at_evaluation(cfg, model, meta, val, iter_num):
    """What --snapshots and --log_heads do at an evaluation: the snapshot written, and
    the fields to add to the evaluation's log line (none without --log_heads)."""
    if cfg.eval_only:
        return {}
    if cfg.snapshots:
        update_snapshots(cfg, model, meta, iter_num)
    if not cfg.log_heads:
        return {}
    tok = get_tokenizer(meta["tokenizer"])
    tokens = probe_text(val, PROBE_WINDOWS * PROBE_LENGTH + 1)
    T = model.config.block_size
    icl_tokens = probe_text(val, min(ICL_WINDOWS * T, len(val) - 1) + 1)
    score, _ = icl_score(model, icl_tokens)
    return {"heads": head_probe(model, tok, tokens), "icl_score": round(score, 4)}
