"""
Training in several processes (torchrun): joining them, the model compiled and
wrapped in DistributedDataParallel, and their agreement at log steps (the loss,
stopping, the seconds of training). Also the joining of processes forked on one
machine, which the ring attention's tests and measurements use. train.py imports
this module only for several processes or torch.compile.
"""

import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from support.device import pin_cpu_vector_width


def join_processes(device, timeout_s):
    """Join the other processes: NCCL between GPUs, gloo between CPUs; a collective
    that waits more than timeout_s seconds for the others fails."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.type != "cuda":
        dist.init_process_group("gloo", timeout=timeout)
        return
    # By default a collective that fails or outlives the timeout makes NCCL's
    # watchdog thread abort the whole process, before train.py can say what
    # happened. Mode 2 aborts only the communicator; the next collective then
    # raises in Python, and main() prints one line. torchrun sets 1 (abort the
    # process) unless told otherwise, so this overrides it (docs/reliability.md).
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    # device_id: this process's GPU, so NCCL connects now rather than at the
    # first collective, and barrier() need not guess the device from the rank
    dist.init_process_group("nccl", timeout=timeout, device_id=device)


def join_forked(rank, size, init_file, timeout_s):
    """Join size processes forked on this machine rather than started by torchrun
    (the ring's tests and measurements): gloo, meeting through init_file. Each takes
    one thread, as they share the CPU."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def wrap_model(raw, device, world, use_compile):
    """What trains: raw, compiled if use_compile, inside DDP with more than one
    process (its .module is then the compiled model). The compiled module goes
    inside DDP, the order PyTorch's guide "Where to apply torch.compile?" gives:
    compiled inside DDP's forward, the graph is split at DDP's gradient buckets
    (DDPOptimizer), so each bucket's all-reduce overlaps the rest of the backward
    pass."""
    if use_compile and device.type == "cpu":
        pin_cpu_vector_width()
    # dynamic=False: a graph compiled for each shape trained on (seq_warmup's three), where
    # the second shape would otherwise bring one recompiled for any shape
    model = torch.compile(raw, dynamic=False) if use_compile else raw
    if world == 1:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=device_ids)


def lost_peer(e):
    """Whether e is a collective that failed because another process died or hung."""
    text = str(e)
    return isinstance(e, dist.DistError) or "gloo" in text or "NCCL" in text


def agree(run, loss_sum, signalled, timed_out, seconds):
    """(mean loss of the step, whether any process has a stop signal, whether any has
    reached max_time, their mean seconds of training): the processes agree on all
    four (this waits for the device), so that they stop together and an lr schedule
    by time is the same in every process. Every micro-batch's loss is the mean of its
    context_parallel ranks' losses."""
    micro_batches = run.cfg.gradient_accumulation_steps * run.cfg.context_parallel
    signal_count = torch.tensor(float(signalled), device=run.device)
    timed_out_count = torch.tensor(float(timed_out), device=run.device)
    seconds_share = torch.tensor(seconds / run.world, device=run.device)  # summed: the mean
    measures = torch.stack([loss_sum / micro_batches, signal_count, timed_out_count, seconds_share])
    dist.all_reduce(measures)
    loss, signal_count, timed_out_count, seconds = measures.tolist()
    return loss, signal_count > 0, timed_out_count > 0, seconds
