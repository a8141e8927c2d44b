"""
The losses a training run is evaluated on: the mean loss per token over a list
of batches, shared by the processes and stopped within a batch by a stop signal;
on random batches of each split (estimate_loss), and on the whole val split.
"""

import torch
from tqdm import tqdm

from data.batches import get_batch
from support.distributed import all_sum
from support.run_state import Run
from support.signals import Stopped, stop_requested


@torch.no_grad()
def mean_loss(run: Run, model, data, batches, desc):
    """Mean loss per token over batches [(starts (N,), length)], shared by the
    processes, with a progress bar; a stop signal ends it (Stopped) within a batch."""
    total = torch.zeros(2, device=run.device)  # (loss summed over tokens, tokens)
    mine = batches[run.dp_rank :: run.dp_world]  # the ranks of one sequence share its batches
    rounds = -(-len(batches) // run.dp_world)  # every process checks for a stop in every round
    model.eval()
    try:
        bar = tqdm(
            range(rounds), desc=desc, leave=False, disable=not run.master, dynamic_ncols=True
        )
        for i in bar:
            if stop_requested(run.signals, run.world, run.device, agree=True):
                raise Stopped()
            if i < len(mine):
                x, y = map(run.split, get_batch(data, *mine[i], run.device))
                with run.ctx():
                    total[0] += model(x, y)[1].float() * y.numel()
                total[1] += y.numel()
    finally:
        model.train()
    total = all_sum(total, run.world)
    return (total[0] / total[1]).item()


def estimate_loss(run: Run, seed):
    """Loss on eval_iters random batches per split. The generator is a fresh one,
    so evaluating never shifts the training batches. The model runs as written, not
    compiled: compiling its eval-mode graph as well took longer than the forward
    passes it would speed up (some 40 s of a CPU run's 90 s of compiling, for
    evaluations of a few seconds; docs/benchmarks.md)."""
    gen, B, T = torch.Generator().manual_seed(seed), run.cfg.batch_size, run.cfg.block_size
    losses = {}
    for split, data in run.splits.items():
        starts = torch.randint(len(data) - T, (run.cfg.eval_iters, B), generator=gen)  # (iters, B)
        batches = [(row, T) for row in starts]
        losses[split] = mean_loss(run, run.raw, data, batches, f"evaluating {split}")
    return losses


def full_val_loss(run: Run):
    """Loss on every token of the val split, in non-overlapping block_size
    windows (the last one shorter): the val loss of record, without sampling noise."""
    data, B, T = run.splits["val"], run.cfg.batch_size, run.cfg.block_size
    n = len(data) - 1  # tokens with a next token to predict
    starts = torch.arange(0, n, T)
    batches = [(batch, T) for batch in starts[: n // T].split(B)]
    tail = n % T // run.split_unit * run.split_unit  # context parallelism leaves out < 2P tokens
    if tail:
        batches.append((starts[-1:], tail))
    return mean_loss(run, run.raw, data, batches, "whole val split")
