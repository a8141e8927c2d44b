"""
Batches for training and evaluation: a batch is a set of random block_size
windows of a split, and y is x shifted by one token.

    load_split    a split on the device (small), as a memmap (large), or as shards
    get_batch     the windows at given starts, as x, y on the device
    step_batches  this process's micro-batches of one iter
"""

import os

import numpy as np
import torch

from data import DataError
from data.dataset import load_tokens

SMALL_DATASET = 100_000_000  # tokens; a smaller split lives on the device as int64


def load_split(dataset_dir, split, block_size, vocab_size, device):
    """A small split becomes one int64 tensor on the device, so a batch is one
    gather there; a large one stays a memmap, read batch by batch, and a
    sharded one stays its shards' memmaps, never held whole."""
    tokens = load_tokens(dataset_dir, split)
    if len(tokens) < block_size + 1:
        raise ValueError(
            f"the {split} split of {dataset_dir} has {len(tokens)} tokens, fewer than "
            f"block_size + 1 = {block_size + 1}; use a smaller --block_size"
        )
    if not isinstance(tokens, np.memmap):
        return tokens  # a sharded split: its shards' memmaps (data/shards.py)
    if len(tokens) < SMALL_DATASET:
        # a damaged file can hold ids past the vocabulary, which would crash a
        # later step; a large split is not scanned (that would read all of it)
        top = int(tokens.max())
        if top >= vocab_size:
            raise DataError(
                f"{os.path.join(dataset_dir, split + '.bin')} holds token id {top}, outside "
                f"the vocabulary of {vocab_size}; prepare the dataset again"
            )
        return torch.from_numpy(tokens.astype(np.int64)).to(device)
    return tokens


def to_device(t, device):
    if device.type == "cuda":  # from pinned memory the copy does not stall the host
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def get_batch(data, starts, length, device):
    """x, y (N, length) for the windows starting at starts (N,); y is x shifted by one.
    The shards of a split are one stream, so a window may run from one into the next."""
    if isinstance(data, torch.Tensor):
        rows = to_device(starts, device)[:, None] + torch.arange(length + 1, device=device)
        chunk = data[rows]  # (N, length + 1)
    else:
        rows = starts.numpy()[:, None] + np.arange(length + 1)
        chunk = to_device(torch.from_numpy(data[rows].astype(np.int64)), device)
    return chunk[:, :-1], chunk[:, 1:]


def step_batches(data, gen, cfg, rank, world, device):
    """This process's micro-batches of one iter, x and y (accum / world, B, T).

    Every process draws the windows of all micro-steps from the same generator
    and takes micro-steps rank, rank + world, ...: the update is then the same
    whatever the number of processes."""
    n, B, T = cfg.gradient_accumulation_steps, cfg.batch_size, cfg.block_size
    starts = torch.randint(len(data) - T, (n, B), generator=gen)[rank::world]  # (n / world, B)
    x, y = get_batch(data, starts.reshape(-1), T, device)
    return x.reshape(-1, B, T), y.reshape(-1, B, T)
