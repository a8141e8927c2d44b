"""
Where a command computes, and in what precision: the device (CUDA, then MPS,
then the CPU), the dtype ('auto' decides from the hardware, hardware.py), and
the autocast context every training forward pass runs in.
"""

import contextlib
import ctypes
import platform
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from support.hardware import auto_dtype, bf16_error, native_bf16


class DeviceError(ValueError):
    """A device or precision this machine cannot use; one line saying what to do."""


# the short names a command's --dtype also takes
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def pick_device(name, local_rank=0, ddp=False):
    """The torch.device --device=name names, for every command: 'auto' is CUDA,
    then MPS, then the CPU. Under torchrun (ddp) each process takes the GPU of its
    local_rank. A CUDA device becomes the current one: synchronize, pinned copies,
    the MFU's device name and the bfloat16 check act on the current device, which
    is otherwise GPU 0."""
    available = {
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
        "cpu": True,
    }
    if name == "auto":
        name = next(kind for kind, ok in available.items() if ok)
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in available:
        raise DeviceError(f"unknown --device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    if not available[device.type]:
        missing = {"cuda": "no CUDA GPU is available", "mps": "MPS is not available"}
        raise DeviceError(f"--device={name} but {missing[device.type]}; use --device=cpu")
    if device.type == "cuda" and (ddp or device.index is None):
        device = torch.device("cuda", local_rank)  # one GPU per process
    if device.type == "cuda":
        if device.index >= torch.cuda.device_count():
            raise DeviceError(
                f"there is no {device}: this machine has {torch.cuda.device_count()} GPU(s); "
                "use --device=cuda:N with N below that, or fewer processes"
            )
        torch.cuda.set_device(device)
    return device


def training_dtype(name, device):
    """(dtype name, why) of a training run: 'auto' is bfloat16 autocast where the
    hardware has native bfloat16 (hardware.py), float16 needs CUDA, and bfloat16
    is refused where it would die with SIGILL."""
    dtype, why = name, "as set"
    if dtype == "auto":
        dtype, why = auto_dtype(device.type)
    if dtype == "float16" and device.type != "cuda":
        raise DeviceError("float16 training needs CUDA; use --dtype=bfloat16 or --dtype=float32")
    if dtype == "bfloat16" and (error := bf16_error(device.type)):
        raise DeviceError(error)
    return dtype, why


def inference_dtype(name, device):
    """The torch dtype a model is cast to for sampling and analysis: 'auto' is
    bfloat16 on a GPU with native bfloat16 tensor cores (a V100 or T4 would
    emulate it), else float32; bfloat16 is refused where it would die with SIGILL."""
    if name == "auto":
        if device.type == "cuda" and native_bf16("cuda")[0]:
            return torch.bfloat16
        return torch.float32
    dtype = DTYPE_ALIASES.get(name, name)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise DeviceError(f"unknown --dtype {name!r}; use auto, float32, bfloat16 or float16")
    if dtype == "float16" and device.type == "mps":
        raise DeviceError(bf16_error("mps").replace("bfloat16", "float16", 1))
    if dtype == "bfloat16" and (error := bf16_error(device.type)):
        raise DeviceError(error)
    return getattr(torch, dtype)


def explain_device(cfg, device, dtype):
    """What a CPU run should know before it starts: no GPU was found (and what to
    run instead), or bfloat16 was asked for where this CPU only emulates it."""
    if cfg.device == "auto" and device.type == "cpu":
        print(
            "no GPU found: training on the CPU. For a model sized for a CPU, run "
            "python train.py config/shakespeare.py",
            flush=True,
        )
    if device.type == "cpu" and dtype == "bfloat16" and not native_bf16("cpu")[0]:
        print(
            f"warning: this CPU has {native_bf16('cpu')[1]}, so bfloat16 is emulated and "
            "matrix multiplies run many times slower than in float32; --dtype=auto picks "
            "float32 here",
            file=sys.stderr,
        )


def pin_cpu_vector_width():
    """Name the width of the CPU's vector registers to inductor before it compiles.

    Inductor writes its C++ kernels for the vector width it picks from
    ATEN_CPU_CAPABILITY and the CPU's flags (512 bits on AVX-512, 256 with
    ATEN_CPU_CAPABILITY=avx2), but its on-disk cache of compiled graphs is keyed by
    its config, where that width is None either way. A graph compiled in a process
    capped at AVX2 (the cap docs/benchmarks.md measures the AVX2 class with) is then
    read back by an uncapped AVX-512 process, whose compiler builds the kernels with
    16-float vectors where the code steps by 8: each store writes past its buffer
    and the run dies of heap corruption (malloc: unaligned tcache chunk). Setting
    cpp.simdlen to the width inductor would pick anyway changes no kernel, and puts
    the width in the cache key. A width the user set is kept."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if config.cpp.simdlen is None:
        # 0 where the CPU has no vector ISA inductor uses: scalar code, as before
        config.cpp.simdlen = pick_vec_isa().bit_width()


# mallopt's parameters, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_freed_memory():
    """Keep the memory a CPU training step frees for the next step (Linux, glibc); whether
    it was set. Each step frees its activations and allocates them again. glibc's malloc
    serves a block above its mmap threshold with a fresh mapping, and gives the top of
    its heap back to the system above its trim threshold: either way the next step takes
    the pages back one fault at a time, some 25,000 faults and 4% of a step of
    config/shakespeare_cpu_15min.py on a 2-core AMD EPYC. Blocks up to 32 MiB (the most
    glibc allows that setting everywhere) come from the heap, and the heap keeps up to
    1 GiB it no longer uses."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False  # another malloc
    libc = ctypes.CDLL(None)
    # a fixed mmap threshold first: setting the trim threshold alone also stops glibc
    # raising the mmap threshold as blocks are freed, and every activation is mapped anew
    if not libc.mallopt(M_MMAP_THRESHOLD, 32 << 20):
        return False
    return bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))


@contextlib.contextmanager
def precision_context(device_type, dtype, block_size):
    """Autocast for the forward pass (nothing in float32). On CPU, for contexts of
    128 or less, attention takes PyTorch's math path: there the CPU flash-attention
    kernel is 2-3x slower in bfloat16 than in float32, while the math path's
    matrix multiplies run at bfloat16 speed (docs/benchmarks.md, 'Training on CPU
    in bfloat16'). Longer contexts keep the fused kernel, which wins there."""
    if dtype == "float32":
        yield
        return
    kernels = contextlib.nullcontext()
    if device_type == "cpu" and block_size <= 128:
        kernels = sdpa_kernel(SDPBackend.MATH)
    with torch.autocast(device_type, getattr(torch, dtype)), kernels:
        yield
