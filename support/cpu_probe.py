"""
The rare cases of bf16_verdict.py: measuring this CPU, where no verdict is cached yet,
and the CPU classes the tests simulate.

A child process runs bfloat16 at the training step's shapes (probe_child), so that
only its death is at stake; where it dies, a second child tries oneDNN capped at
AVX512-BF16, below its AMX kernels (probe_verdict). The child also times a bfloat16
matrix multiply against float32's (bf16_slowdown): a busy machine must not decide
for good, so each precision's best of rounds that alternate the two is taken, and a
figure that contradicts the CPU's flags is measured again before it is believed.
bf16_verdict.py caches the verdict.

GPT_SIMULATE_CPU makes the probe behave as one of the CPU classes below
(SIMULATED_CLASSES), so that the tests of every class run on any machine: the
verdict, its cache, dtype='auto' and the one-line errors, as on that class.

    python -m support.cpu_probe --child    what the probe's child runs
"""

import json
import os
import signal
import subprocess
import sys
import time

from support.bf16_verdict import AMX_FREE_ISA, NATIVE_SLOWDOWN
from support.hardware import (
    FLAG_FIELDS,
    ISA,
    ISAS_WITHOUT_BF16,
    NATIVE_BF16_FLAGS,
    SIMULATE,
    cpuinfo,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each class, with the flags such a CPU advertises:
#   avx2         bfloat16 emulated: the probe's child runs with oneDNN and ATen capped to
#                AVX2, so its bfloat16 is really emulated, and its slowdown really measured
#   avx512_bf16  native bfloat16 (where this CPU emulates it, the measured slowdown is kept
#                beside a simulated 1.0)
#   amx          native bfloat16 through AMX tiles, the same way
#   amx_sigill   AMX advertised but not allowed: the probe's child dies with SIGILL unless
#                oneDNN is capped below AMX; capped, it is native (as avx512_bf16)
#   sigill       bfloat16 kills the process whatever the cap
AVX2_FLAGS = {"avx2"}
BF16_FLAGS = AVX2_FLAGS | {"avx512f", "avx512_bf16"}
AMX_FLAGS = BF16_FLAGS | {"amx_tile", "amx_bf16"}
SIMULATED_CLASSES = {
    "avx2": AVX2_FLAGS,
    "avx512_bf16": BF16_FLAGS,
    "amx": AMX_FLAGS,
    "amx_sigill": AMX_FLAGS,
    "sigill": AMX_FLAGS,
}
# oneDNN's ISA levels below AMX (its "CPU dispatcher control" docs)
ISAS_WITHOUT_AMX = ISAS_WITHOUT_BF16 | {"AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16"}


def simulated_class():
    """The CPU class named by GPT_SIMULATE_CPU, or None. An unknown name stops the
    process with one line: a typo must not test the real machine unnoticed."""
    name = os.environ.get(SIMULATE, "")
    if not name:
        return None
    if name not in SIMULATED_CLASSES:
        sys.exit(
            f"error: {SIMULATE}={name} is no CPU class; use one of {', '.join(SIMULATED_CLASSES)}"
        )
    return name


def cpu_flags():
    """The flags this CPU advertises, or those of the simulated class."""
    simulated = simulated_class()
    if simulated is not None:
        return SIMULATED_CLASSES[simulated]
    return set(cpuinfo(FLAG_FIELDS).split())


def probe(extra_env=None):
    """Run probe_child in a child process: its result dict, or {'crashed': signal
    name} when it died of a signal, or {'failed': reason}."""
    env = dict(os.environ, **(extra_env or {}))
    if simulated_class() == "avx2":
        # oneDNN and ATen without their bfloat16 kernels: the child's bfloat16 is really
        # emulated, so its slowdown is measured, not assumed
        env.update({ISA: "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "support.cpu_probe", "--child"],
            cwd=ROOT,  # where the support package is found, whatever the caller's folder
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return dict(failed=str(e).splitlines()[0])
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f"signal {-r.returncode}"
        return dict(crashed=name)
    if r.returncode != 0 or not r.stdout.strip():
        lines = (r.stderr or "no output").strip().splitlines()
        return dict(failed=lines[-1] if lines else f"exit {r.returncode}")
    return dict(
        json.loads(r.stdout.strip().splitlines()[-1]), probe_s=round(time.perf_counter() - t0, 2)
    )


def new_verdict():
    """A verdict measured now (see probe_verdict), with the time it was measured and,
    under GPT_SIMULATE_CPU, the simulated class."""
    verdict = probe_verdict()
    verdict["measured_at"] = time.strftime("%Y-%m-%d %H:%M")
    simulated = simulated_class()
    if simulated is None:
        return verdict
    verdict["simulated"] = simulated
    # a native class simulated on a CPU that emulates bfloat16: the speed is the class's,
    # the figure this CPU measured is kept beside it
    native_class = bool(SIMULATED_CLASSES[simulated] & NATIVE_BF16_FLAGS)
    if native_class and verdict["runs"] and verdict["slowdown"] > NATIVE_SLOWDOWN:
        verdict["measured_slowdown"] = verdict["slowdown"]
        verdict["slowdown"] = 1.0
    return verdict


def probe_verdict():
    """Probe, and if bfloat16 kills the child, probe again with oneDNN capped below AMX."""
    first = probe()
    if "crashed" not in first:
        return dict(first, runs="failed" not in first, env={})
    user_isa = os.environ.get(ISA)
    if user_isa:
        return dict(
            runs=False,
            env={},
            why=f"bfloat16 crashes on this CPU ({first['crashed']} in a test run, "
            f"with {ISA}={user_isa})",
        )
    second = probe({ISA: AMX_FREE_ISA})
    if "failed" in second:  # not a verdict: not cached, tried again next time
        return dict(second, runs=False, env={})
    if "crashed" in second:
        return dict(
            runs=False,
            env={},
            why=f"bfloat16 crashes on this CPU ({first['crashed']} in a test run, "
            f"also with {ISA}={AMX_FREE_ISA})",
        )
    return dict(second, runs=True, env={ISA: AMX_FREE_ISA}, amx_crashed=first["crashed"])


def simulate(verdict):
    """Under GPT_SIMULATE_CPU, before torch loads: where the simulated class cannot run
    bfloat16, this process dies at its first bfloat16 op on the CPU, as on the real
    machine. An unknown class stops the process (simulated_class)."""
    simulated_class()
    if not verdict["runs"] and "torch" not in sys.modules:
        simulate_crash()


def simulate_crash():
    """Tests: make this process die as such a CPU's would, at its first bfloat16
    op on the CPU, so that a path that still runs one cannot pass unseen."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    def cpu_bf16(x):
        return (
            x is torch.bfloat16
            or isinstance(x, torch.Tensor)
            and x.dtype == torch.bfloat16
            and x.is_cpu
        )

    class DieOnBf16(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if any(cpu_bf16(x) for x in tree_leaves((args, kwargs or {}))):
                sys.stderr.write(
                    f"simulated SIGILL: {getattr(func, '__name__', func)} in bfloat16\n"
                )
                os.kill(os.getpid(), signal.SIGILL)
            return func(*args, **(kwargs or {}))

    DieOnBf16().__enter__()  # for the rest of the process


def probe_child():
    """In the child: bfloat16 through every kind of op a training step runs, at
    the CPU recipe's shapes, then one matmul timed against float32. Prints JSON."""
    simulated = simulated_class()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    amx_allowed = os.environ.get(ISA, "").upper() not in ISAS_WITHOUT_AMX
    if simulated == "sigill" or (simulated == "amx_sigill" and amx_allowed):
        os.kill(os.getpid(), signal.SIGILL)
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    linear = torch.nn.Linear(128, 512)  # the MLP's first layer, batch 32 x 64
    x = torch.randn(32 * 64, 128, requires_grad=True)
    with torch.autocast("cpu", bf16):
        loss = linear(x).float().square().mean()
    q, k, v = (torch.randn(32, 4, 64, 32, dtype=bf16, requires_grad=True) for _ in range(3))
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            loss = (
                loss
                + F.scaled_dot_product_attention(q, k, v, is_causal=True).float().square().mean()
            )
    loss.backward()
    g = torch.randn(128, 512).bfloat16()  # Muon's Newton-Schulz iteration multiplies in bfloat16
    gram = g @ g.T
    torch.addmm(g, torch.addmm(gram, gram, gram, beta=-4.7, alpha=2.0), g, beta=3.4)
    slowdown, attempts = steady_slowdown(bool(cpu_flags() & NATIVE_BF16_FLAGS))
    print(json.dumps(dict(slowdown=round(slowdown, 2), attempts=attempts)))


def steady_slowdown(flags_promise_native, attempts=3):
    """(bf16_slowdown, attempts): measured again, up to `attempts` times, while the
    figure contradicts what the CPU's flags promise. Load from other processes
    slows both precisions alike within a round, so the best of the rounds holds;
    a figure that still contradicts the flags after that is this CPU's truth
    (a virtual machine may hide what its flags advertise)."""
    for attempt in range(1, attempts + 1):
        slowdown = bf16_slowdown()
        if (slowdown <= NATIVE_SLOWDOWN) == flags_promise_native:
            break
    return slowdown, attempt


def bf16_slowdown(n=256, rounds=5, repeats=3):
    """Time of a bfloat16 (n, n) matrix multiply over a float32 one on one thread
    (other threads' load would blur the ratio): each precision's best over rounds
    that alternate the two, so a burst of other work cannot fall on one alone."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    matrices = {}
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        matrices[dtype] = (torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype))
        best[dtype] = float("inf")
    try:
        for _ in range(rounds):
            for dtype, (a, b) in matrices.items():
                a @ b  # warm: the first call picks the kernel
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    a @ b
                    best[dtype] = min(best[dtype], time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return best[torch.bfloat16] / best[torch.float32]


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    probe_child()
