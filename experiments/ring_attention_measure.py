"""
The figures of docs/ring_attention.md, on the CPU in float32:

    # blockwise vs explicit attention, T = 1024 ... 16384
    python -m experiments.ring_attention_measure memory
    # contiguous vs zigzag ring of 4: work per step and rank
    python -m experiments.ring_attention_measure idle
    # a training step of T = 4096 split over P = 1, 2, 4
    python -m experiments.ring_attention_measure ranks

Memory is the peak resident memory of the process above what it held before
the measured call (Linux's VmHWM, reset through /proc/self/clear_refs), so it
counts every tensor the call allocates, PyTorch's and the allocator's alike.
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import ctypes
import dataclasses
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model import GPT, GPTConfig, attention, causal_mask
from support import cli
from support.configurator import ConfigError
from support.context_parallel import ContextParallel
from support.distributed import join_forked
from support.ring_attention import Ring, blockwise_attention, ring_attention, split_sequence

MiB = 2**20

# Tensors above 64 KiB get pages of their own from the kernel, returned when
# freed: otherwise glibc raises this threshold as tensors come and go, keeps
# freed memory for reuse, and a later peak would not show in resident memory.
ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD


def resident(key="VmRSS"):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def peak_above_now(fn):
    """(fn's result, bytes of peak resident memory during fn above the memory before)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak starts again from the current resident memory
    before = resident()
    result = fn()
    return result, resident("VmHWM") - before


def memory():
    torch.set_num_threads(1)
    B, nh, hs = 1, 1, 64
    print(
        f"CPU {torch.backends.cpu.get_cpu_capability()}, float32, "
        f"B={B}, heads={nh}, head size {hs}, forward"
    )
    print("| T | explicit (model.attention) | blockwise, block 256 | T x T scores alone |")
    print("|---|---|---|---|")
    warm = torch.randn(1, 1, 512, hs)
    with torch.no_grad():  # the first calls set up the allocator and the kernels
        (
            blockwise_attention(warm, warm, warm, 256),
            attention(warm, warm, warm, causal_mask(512, 512)),
        )
    for T in (1024, 2048, 4096, 8192, 16384):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, nh, T, hs, generator=gen) for _ in range(3))
        with torch.no_grad():
            ours, ours_mem = peak_above_now(lambda: blockwise_attention(q, k, v, 256))
            theirs, theirs_mem = peak_above_now(lambda: attention(q, k, v, causal_mask(T, T))[0])
        assert (ours - theirs).abs().max() < 1e-5
        del ours, theirs
        print(
            f"| {T} | {theirs_mem / MiB:,.0f} MiB | {ours_mem / MiB:,.1f} MiB "
            f"| {T * T * 4 / MiB:,.0f} MiB |",
            flush=True,
        )


def idle_worker(rank, size, init, T, out):
    join_forked(rank, size, init, timeout_s=300)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, T, 64, generator=gen) for _ in range(3))
    times = {}
    for zigzag in (False, True):
        ring = Ring(None, zigzag)
        mine = [split_sequence(t, rank, size, zigzag, dim=2).requires_grad_() for t in (q, k, v)]
        for repeat in range(2):  # the first warms up
            ring.times = []
            dist.barrier()
            ring_attention(*mine, ring=ring).sum().backward()
        times[zigzag] = ring.times  # size forward steps, then size backward steps
    torch.save(times, os.path.join(out, f"{rank}.pt"))
    dist.destroy_process_group()


def on_ranks(worker, size, T):
    """What worker(rank, size, init_file, T, out) saved, one result per rank."""
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            worker,
            args=(size, os.path.join(out, "init"), T, out),
            nprocs=size,
            start_method="fork",
        )
        return [torch.load(os.path.join(out, f"{rank}.pt")) for rank in range(size)]


def idle(size=4, T=4096):
    times = on_ranks(idle_worker, size, T)
    print(
        f"CPU {torch.backends.cpu.get_cpu_capability()}, float32, "
        f"ring of {size} gloo processes, T = {T}, "
        "4 heads of 64, forward + backward; CPU seconds of compute per ring step"
    )
    for zigzag in (False, True):
        t = torch.tensor([times[rank][zigzag] for rank in range(size)])  # (rank, step)
        critical = t.max(dim=0).values.sum().item()  # every step waits for its slowest rank
        busy = t.sum().item()
        idle_share = 1 - busy / (critical * size)
        print(
            f"\n{'zigzag' if zigzag else 'contiguous'}: steps take {critical:.3f} s in all "
            f"(sum of the slowest rank's time per step); "
            f"ranks compute {busy:.3f} s of the {critical * size:.3f} rank-seconds available, "
            f"idle {idle_share:.0%}"
        )
        print(
            "| rank | "
            + " | ".join(f"fwd {s}" for s in range(size))
            + " | "
            + " | ".join(f"bwd {s}" for s in range(size))
            + " |"
        )
        print("|---" * (2 * size + 1) + "|")
        for rank in range(size):
            print(
                f"| {rank} | " + " | ".join(f"{x * 1000:.0f} ms" for x in t[rank].tolist()) + " |"
            )


def ranks_worker(rank, size, init, T, out):
    join_forked(rank, size, init, timeout_s=300)
    torch.manual_seed(0)
    config = GPTConfig(block_size=T, vocab_size=65, n_layer=4, n_head=4, n_embd=128, rope=True)
    idx = torch.randint(0, 65, (1, T + 1), generator=torch.Generator().manual_seed(1))
    x, y = idx[:, :-1], idx[:, 1:]
    results = {}
    for kind in ["sdpa", "ring"] if size == 1 else ["ring"]:
        model = GPT(config)
        if kind == "ring":
            cp = ContextParallel(size, zigzag=True)
            cp.attach(model)
            xs, ys = cp.split(x), cp.split(y)
        else:
            xs, ys = x, y

        def step():
            model(xs, ys)[1].backward()

        step()  # the first step allocates the gradients, which every rank holds whole
        dist.barrier()
        results[kind] = peak_above_now(step)[1]
    torch.save(results, os.path.join(out, f"{rank}.pt"))
    dist.destroy_process_group()


def ranks(T=4096):
    print(
        f"CPU {torch.backends.cpu.get_cpu_capability()}, float32, "
        "GPT of 4 layers, 4 heads, n_embd 128, rope, "
        f"batch 1 x {T} tokens: peak memory of a forward and backward per rank, "
        "above the model and its gradients"
    )
    print("| P | attention | tokens per rank | peak per rank |")
    print("|---|---|---|---|")
    for size in (1, 2, 4):
        res = on_ranks(ranks_worker, size, T)
        for kind in res[0]:
            if kind == "sdpa":
                name = "SDPA (the model unchanged)"
            elif size == 1:
                name = "blockwise"
            else:
                name = "ring, zigzag"
            peak = max(r[kind] for r in res)
            print(f"| {size} | {name} | {T // size} | {peak / MiB:,.1f} MiB |", flush=True)


PARTS = {"memory": memory, "idle": idle, "ranks": ranks}


@dataclasses.dataclass
class Settings:
    part: str = ""  # which figures: memory, idle or ranks


def main(cfg):
    if cfg.part not in PARTS:
        raise ConfigError(f"give one of {', '.join(PARTS)}: which figures to measure")
    PARTS[cfg.part]()


if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], __doc__, Settings, positional="part"))
