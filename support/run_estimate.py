"""
How long a run takes here: one training iter and one evaluation batch timed on
this machine, scaled up to the whole run. train.py prints it before a run on a
CPU that no config sized for it; config/shakespeare.py times the baby GPT's iter
before it picks a model for the machine (seconds_per_iter).
"""

import copy
import functools
import os
import time

import torch
from tqdm import tqdm

from data.dataset import get_batch
from model import GPT, GPTConfig
from support.checkpoint import rng_state, set_rng_state
from support.device import precision_context, training_dtype
from support.optim import make_optimizers
from support.settings import Settings, model_args


def time_iter(run, fraction=2):
    """(seconds per training iter, seconds per evaluation batch) here, timed on a
    copy of the model with optimizers of its own, so the run's weights, optimizer
    state, RNG and batches stay as they were. The passes run on 1/fraction of a
    micro-batch and are scaled up, so the estimate comes within seconds even where
    a step takes a minute."""
    rng = rng_state(run.device)
    try:
        model = copy.deepcopy(run.raw)
        n = max(1, run.cfg.batch_size // fraction)
        return time_passes(model, run.cfg, run.device, run.dtype, run.splits["val"], n, run.world)
    finally:
        set_rng_state(rng, run.device)


def time_passes(model, cfg, device, dtype, data, n, world=1):
    """(seconds per training iter, seconds per evaluation batch) of the run cfg
    describes, its model given, timed on n sequences of data and scaled up to the
    micro-batches of an iter; each pass is timed on its second call (the first
    picks kernels and allocates). The model's weights change: give it a copy."""
    optimizers = make_optimizers(model, cfg, device.type, dtype)
    x, y = get_batch(data, torch.zeros(n, dtype=torch.long), cfg.block_size, device)

    def forward_backward():
        with precision_context(device.type, dtype, cfg.block_size):
            model(x, y)[1].backward()

    def optimizer_step():
        for opt in optimizers:
            opt.step()

    @torch.no_grad()
    def evaluation():
        with precision_context(device.type, dtype, cfg.block_size):
            model(x, y)

    def seconds(fn):
        for _ in range(2):
            synchronize(device)
            t0 = time.perf_counter()
            fn()
        synchronize(device)
        return time.perf_counter() - t0

    scale = cfg.batch_size / n
    micro_steps = cfg.gradient_accumulation_steps // world
    step = micro_steps * scale * seconds(forward_backward)
    step += seconds(optimizer_step)
    model.eval()
    return step, scale * seconds(evaluation)


def synchronize(device):
    """Wait for the device's queued work, so that a timer reads its time."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def seconds_per_iter(settings, device_name, vocab_size=65, tokens=512):
    """Seconds per iter of the run that settings (a config file's variables)
    describe, on device_name: one iter timed on about `tokens` tokens of a new
    model of its shape, in its precision, and scaled up; what a config file asks
    before it picks a model for the machine (config/shakespeare.py). None under
    torchrun, where every process would time for itself, and might choose
    differently."""
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        return None
    keys = Settings.__dataclass_fields__
    cfg = Settings(**{key: value for key, value in settings.items() if key in keys})
    return timed_iter(cfg, device_name, vocab_size, tokens)


@functools.cache
def timed_iter(cfg, device_name, vocab_size, tokens):
    """seconds_per_iter's timing, once per process for each run and device: a
    process that reads the same config again (the tests, the GPU script) pays once."""
    device = torch.device(device_name)
    dtype, _ = training_dtype(cfg.dtype, device)
    with torch.random.fork_rng(devices=[]):
        model = GPT(GPTConfig(**model_args(cfg, vocab_size))).to(device)
        data = torch.randint(vocab_size, (2 * cfg.block_size,), device=device)
        n = max(1, min(cfg.batch_size, tokens // cfg.block_size))
        step_s, _ = time_passes(model, cfg, device, dtype, data, n)
    return step_s


def run_seconds(
    cfg, start_iter, start_evaluated, step_s, eval_batch_s, val_tokens, start_seconds=0.0
):
    """(seconds, how) the rest of a run takes at step_s per iter and eval_batch_s
    per evaluation batch: its iters (up to max_time), the evaluations at every
    eval_interval (but an evaluated start) and the final one, with the whole val
    split if eval_full_val. start_seconds: of training before the run, which
    max_time counts."""
    iters, every = cfg.max_iters - start_iter, cfg.eval_interval
    # the multiples of every in [start_iter, max_iters), then the final evaluation
    evals = -(-cfg.max_iters // every) - -(-start_iter // every) + 1
    evals -= int(start_evaluated and start_iter % every == 0)
    batches = evals * 2 * cfg.eval_iters
    if cfg.eval_full_val:
        batches += -(-(val_tokens - 1) // (cfg.block_size * cfg.batch_size))
    train_s = iters * step_s
    if cfg.max_time > 0:
        train_s = min(train_s, cfg.max_time - start_seconds)
    how = (
        f"{iters:,} iters x {step_s:.3g} s + {evals} evaluations, "
        f"{batches:,} batches x {eval_batch_s:.3g} s"
    )
    return train_s + batches * eval_batch_s, how


def print_run_estimate(run):
    """Say how long the run should take here, before it starts."""
    step_s, eval_batch_s = time_iter(run)
    val_tokens = len(run.splits["val"])
    seconds, how = run_seconds(
        run.cfg, run.start_iter, run.start_evaluated, step_s, eval_batch_s, val_tokens, run.seconds
    )
    for unit, size in (("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or unit == "s":
            break
    tqdm.write(
        f"this run should take about {seconds / size:.1f} {unit} here "
        f"({how}; timed on this machine)"
    )
