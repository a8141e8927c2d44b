"""
Context parallelism: every sequence split over P processes, which together
train one model as if each held the whole sequence.

    # 4 processes: 2 rings of 2, data-parallel, which share the micro-steps of a step
    torchrun --standalone --nproc_per_node=4 train.py config/shakespeare_cpu.py \
        --context_parallel=2 --gradient_accumulation_steps=2

The world of processes is a grid: consecutive ranks form a context-parallel
group of P (the ranks of one sequence: a ring), and the world holds
world / P such groups, which are data-parallel to each other. Each rank gets
its part of every sequence (split_sequence: the zigzag layout by default), its
tokens' positions in the whole sequence (for the learned position embeddings
or rope), and attention by ring_attention over its group; everything else in a
transformer acts on one token at a time, so it needs nothing more. Each rank's
loss is the mean over its own tokens, which are as many on every rank: the mean
of the ranks' losses is the loss over all tokens, and DDP's gradient average
over the whole world is its gradient.
"""

import torch.distributed as dist

from support.ring_attention import (
    Ring,
    check_length,
    ring_attention,
    sequence_positions,
    split_sequence,
)


def check(cfg, world):
    """The settings' errors, one line each, before any process group exists (the
    layout's name is checked with the other settings, support/settings.py)."""
    p, layout = cfg.context_parallel, cfg.context_parallel_layout
    if p > 1 and cfg.log_heads:
        raise ValueError("log_heads=True needs context_parallel=1: the probe runs the whole model")
    if world % p:
        raise ValueError(
            f"context_parallel={p} does not divide the {world} process(es); run a multiple "
            f"of {p} processes (torchrun --nproc_per_node=N)"
        )
    if p == 1:
        return
    check_length(cfg.block_size, p, layout == "zigzag")
    if cfg.kv_shift:
        raise ValueError(
            "context parallelism splits each sequence over processes, and KV shifting mixes "
            "each key with the one before it; use --kv_shift=False or --context_parallel=1"
        )
    if cfg.token_shift:
        raise ValueError(
            "context parallelism splits each sequence over processes, and token shift mixes "
            "each embedding with the one before it; use --token_shift=False or "
            "--context_parallel=1"
        )
    attn_dropout = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
    if attn_dropout > 0:
        raise ValueError(
            "context parallelism has no attention dropout; use --attn_dropout=0 "
            "(--dropout on the residual stream alone is allowed)"
        )
    if cfg.compile:
        raise ValueError(
            "context parallelism runs uncompiled (the ring's transfers are not traced); "
            "use --compile=False"
        )


class ContextParallel:
    """This rank's place in the grid; call after init_process_group, on every rank."""

    def __init__(self, size, zigzag=True):
        world, rank = dist.get_world_size(), dist.get_rank()
        self.size, self.zigzag = size, zigzag
        self.unit = 2 * size if zigzag else size  # a sequence's length must be a multiple of this
        self.rank = rank % size  # in its ring
        self.dp_rank, self.dp_world = rank // size, world // size
        # every rank must create every group, in the same order
        groups = [
            dist.new_group(list(range(d * size, (d + 1) * size))) for d in range(self.dp_world)
        ]
        self.ring = Ring(groups[self.dp_rank], zigzag)

    def split(self, x):
        """This rank's part of sequences x (..., T) -> (..., T / size)."""
        return split_sequence(x, self.rank, self.size, self.zigzag, dim=-1)

    def sdpa(self, q, k, v, attn_mask=None, is_causal=False, dropout_p=0.0, enable_gqa=False):
        """What MultiHeadAttention calls in place of F.scaled_dot_product_attention."""
        if attn_mask is not None or not is_causal or dropout_p > 0:
            raise ValueError(
                "context parallelism computes plain causal attention: no mask, cache or dropout"
            )
        return ring_attention(q, k, v, ring=self.ring)

    def positions(self, T, device):
        """This rank's T tokens' positions in the whole sequence (T * size tokens)."""
        return sequence_positions(T * self.size, self.rank, self.size, self.zigzag, device)

    def attach(self, model):
        """Make model (a GPT) attend over the whole sequence through the ring, at its
        tokens' positions in the whole sequence: through the seam model.py declares."""
        return model.split_context(self)
