"""
The run-time estimate printed before a run on a CPU: one training iter and one
evaluation batch timed on this machine, scaled up to the whole run.
"""

import copy
import time

import torch
from tqdm import tqdm

from data.batches import get_batch
from support.optim import make_optimizers
from support.resume import rng_state, set_rng_state
from support.run_state import Run


def time_iter(run: Run, fraction=2):
    """(seconds per training iter, seconds per evaluation batch) here, timed on a
    copy of the model with optimizers of its own, so the run's weights, optimizer
    state, RNG and batches stay as they were. The passes run on 1/fraction of a
    micro-batch and are scaled up, so the estimate comes within seconds even where
    a step takes a minute; each is timed on its second call (the first picks
    kernels and allocates)."""
    cfg, rng = run.cfg, rng_state(run.device)
    model = copy.deepcopy(run.raw)
    optimizers = make_optimizers(model, cfg, run.device.type, run.dtype)
    n = max(1, cfg.batch_size // fraction)
    x, y = get_batch(
        run.splits["val"], torch.zeros(n, dtype=torch.long), cfg.block_size, run.device
    )

    def forward_backward():
        with run.ctx():
            model(x, y)[1].backward()

    def optimizer_step():
        for opt in optimizers:
            opt.step()

    @torch.no_grad()
    def evaluation():
        with run.ctx():
            model(x, y)

    def seconds(fn):
        for _ in range(2):
            if run.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
        if run.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    try:
        scale = cfg.batch_size / n
        micro_steps = cfg.gradient_accumulation_steps // run.world
        step = micro_steps * scale * seconds(forward_backward)
        step += seconds(optimizer_step)
        model.eval()
        return step, scale * seconds(evaluation)
    finally:
        set_rng_state(rng, run.device)


def run_seconds(cfg, start_iter, start_evaluated, step_s, eval_batch_s, val_tokens):
    """(seconds, how) the rest of a run takes at step_s per iter and eval_batch_s
    per evaluation batch: its iters (up to max_time), the evaluations at every
    eval_interval (but an evaluated start) and the final one, with the whole val
    split if eval_full_val."""
    iters, every = cfg.max_iters - start_iter, cfg.eval_interval
    # the multiples of every in [start_iter, max_iters), then the final evaluation
    evals = -(-cfg.max_iters // every) - -(-start_iter // every) + 1
    evals -= int(start_evaluated and start_iter % every == 0)
    batches = evals * 2 * cfg.eval_iters
    if cfg.eval_full_val:
        batches += -(-(val_tokens - 1) // (cfg.block_size * cfg.batch_size))
    train_s = iters * step_s
    if cfg.max_time > 0:
        train_s = min(train_s, cfg.max_time)
    how = (
        f"{iters:,} iters x {step_s:.3g} s + {evals} evaluations, "
        f"{batches:,} batches x {eval_batch_s:.3g} s"
    )
    return train_s + batches * eval_batch_s, how


def print_run_estimate(run: Run):
    """Say how long the run should take here, before it starts."""
    step_s, eval_batch_s = time_iter(run)
    val_tokens = len(run.splits["val"])
    seconds, how = run_seconds(
        run.cfg, run.start_iter, run.start_evaluated, step_s, eval_batch_s, val_tokens
    )
    for unit, size in (("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or unit == "s":
            break
    tqdm.write(
        f"this run should take about {seconds / size:.1f} {unit} here "
        f"({how}; timed on this machine)"
    )
