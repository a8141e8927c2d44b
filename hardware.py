"""
Which precision is fast on this machine.

bfloat16 halves the bytes moved and, where the hardware multiplies it natively,
runs matrix multiplies several times faster than float32: CUDA GPUs from Ampere
on, and x86 CPUs with AVX512-BF16 or AMX. Elsewhere PyTorch emulates it, and a
CPU matrix multiply in bfloat16 is then about 40x slower than in float32
(docs/benchmarks.md). So "auto" precision, and the precision of Muon's
orthogonalisation, follow native_bf16().

To measure the float32 path on a CPU that has bfloat16, set oneDNN's own
ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN runs PyTorch's CPU bfloat16 matrix multiplies):
bfloat16 is then really emulated, and native_bf16 says so.
"""

import functools
import os
import time

import torch

# ONEDNN_MAX_CPU_ISA values that stop below oneDNN's native bfloat16 kernels
# (avx512_core_bf16 and above); see oneDNN's "CPU dispatcher control" docs.
ONEDNN_ISAS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                            "AVX512_CORE_VNNI"}


def native_bf16(device_type):
    """(True or False, why) for the device type ('cuda', 'cpu', 'mps')."""
    if device_type == "cuda":
        # including_emulation=False: pre-Ampere GPUs (V100, T4) run bf16 emulated
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return native, "native bfloat16" if native else "no native bfloat16 on this GPU"
    if device_type == "cpu":
        return cpu_native_bf16()
    return False, f"bfloat16 not used on {device_type}"


@functools.cache
def cpu_native_bf16():
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if isa in ONEDNN_ISAS_WITHOUT_BF16:
        return False, f"no native bfloat16: ONEDNN_MAX_CPU_ISA={isa}"
    if not torch.backends.mkldnn.is_available():
        return False, "no native bfloat16: this PyTorch has no oneDNN"
    caps = torch.cpu.get_capabilities()
    if caps.get("architecture") in ("x86_64", "i386", "i686", "AMD64"):
        found = [name for name in ("amx_bf16", "avx512_bf16") if caps.get(name)]
        return bool(found), f"native bfloat16: {found[0]}" if found else "no native bfloat16"
    # other CPUs (Arm, Power, ...): no flag to read through PyTorch, so time it once
    ratio = bf16_slowdown()
    native = ratio < 1.5
    return native, f"{'native' if native else 'no native'} bfloat16: a matrix multiply takes {ratio:.1f}x float32's time"


def bf16_slowdown(n=256, repeats=5):
    """Time of a bfloat16 (n, n) matrix multiply over a float32 one, best of
    repeats, on one thread (other threads' load would blur the ratio)."""
    threads, times = torch.get_num_threads(), {}
    torch.set_num_threads(1)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
            a @ b  # warm-up: the first call picks the kernel
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                a @ b
                best = min(best, time.perf_counter() - t0)
            times[dtype] = best
    finally:
        torch.set_num_threads(threads)
    return times[torch.bfloat16] / times[torch.float32]


def auto_dtype(device_type):
    """(dtype name, why) for dtype='auto': bfloat16 where it is native; on CUDA
    otherwise float16 (with a GradScaler), elsewhere float32."""
    native, why = native_bf16(device_type)
    if native:
        return "bfloat16", why
    return ("float16" if device_type == "cuda" else "float32"), why
