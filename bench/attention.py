"""
Attention alone: model.attention (explicit, materialises the (T, T) weights)
against F.scaled_dot_product_attention as the context grows, each checked against
a float64 reference before it is timed.

    python -m bench.attention [--device=cpu|cuda] [--quick] [--threads=N]
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

from statistics import median

import torch
import torch.nn.functional as F

from bench import common
from model import attention, causal_mask

# How far each attention path may be from a float64 reference, in units in the
# last place (ulps) of the output's dtype at the size of its largest entry.
# Rounding the output alone costs half an ulp and the scores and weights a few
# more (measured on a CPU: under 1 in bfloat16, under 4 in float32); a wrong
# mask or scale is off by about the output itself, 2^7 ulps or more in bfloat16.
ATTENTION_TOLERANCE_ULPS = 8

# The shape timed: one sequence, GPT-2 124M's heads
B = 1
N_HEAD = 12
HEAD_SIZE = 64


def error_ulps(out, ref):
    """max |out - ref| in ulps of out's dtype at the magnitude of ref's largest entry."""
    ulp = 2.0 ** torch.floor(torch.log2(ref.abs().max())) * torch.finfo(out.dtype).eps
    return ((out.double() - ref).abs().max() / ulp).item()


def check_attention(q, k, v, mask, outputs, T):
    """Each output (name -> (B, nh, T, hs)) against softmax(q k^T / sqrt(d)) v
    worked out in float64 for 64 query rows spread over the sequence; returns
    name -> error in ulps."""
    rows = torch.linspace(0, T - 1, min(T, 64), device=q.device).long()
    scores = q[:, :, rows].double() @ k.double().transpose(-2, -1) / q.size(-1) ** 0.5
    ref = scores.masked_fill(~mask[rows], float("-inf")).softmax(-1) @ v.double()
    errors = {name: error_ulps(out[:, :, rows], ref) for name, out in outputs.items()}
    for name, err in errors.items():
        if err > ATTENTION_TOLERANCE_ULPS:
            raise common.BenchError(
                f"attention at T={T}: the {name} path is {err:.1f} ulps from a float64 "
                f"reference (at most {ATTENTION_TOLERANCE_ULPS} expected)"
            )
    return errors


def free_memory(device):
    """Bytes free on the device, so the explicit path is not run where it cannot fit."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30  # no /proc (macOS): assume a laptop's worth


def weights_bytes(T, dtype):
    """The size of the explicit path's (B, nh, T, T) attention weights."""
    return B * N_HEAD * T * T * torch.finfo(dtype).bits // 8


def bench_length(T, dtype, repeats, device):
    """Both paths at one context length T: checked, then timed alternately."""
    torch.manual_seed(0)
    shape = (B, N_HEAD, T, HEAD_SIZE)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    mask = causal_mask(T, T, device=device)

    def explicit():
        return attention(q, k, v, mask)[0]

    def fused():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    fns = {"explicit": explicit, "sdpa": fused}
    calls = 5
    if T >= 1024:
        calls = 1
    with torch.no_grad():
        outputs = {name: fn() for name, fn in fns.items()}
        errors = check_attention(q, k, v, mask, outputs, T)
        diff = (outputs["explicit"].float() - outputs["sdpa"].float()).abs().max().item()
        del outputs
        peaks = {}
        if device == "cuda":
            for key, fn in fns.items():
                peaks[key] = common.peak_gpu_bytes(fn)
        times = common.alternate(fns, repeats, calls, device)
    return dict(
        T=T,
        B=B,
        n_head=N_HEAD,
        head_size=HEAD_SIZE,
        dtype=str(dtype).removeprefix("torch."),
        weights_bytes=weights_bytes(T, dtype),
        max_abs_diff=diff,
        explicit=dict(
            ms=median(times["explicit"]) * 1e3,
            error_ulps=errors["explicit"],
            peak_extra_gpu_bytes=peaks.get("explicit"),
        ),
        sdpa=dict(
            ms=median(times["sdpa"]) * 1e3,
            error_ulps=errors["sdpa"],
            peak_extra_gpu_bytes=peaks.get("sdpa"),
        ),
        explicit_over_sdpa=median(times["explicit"]) / median(times["sdpa"]),
    )


def bench_attention(args, log):
    device, quick = args.device, args.quick
    dtype = torch.float32
    # the flash kernel needs half precision on GPU
    if device == "cuda":
        dtype = torch.bfloat16
    lengths = [64 * 2**i for i in range(7)]  # 64 .. 4096
    repeats = 5
    if quick:
        lengths = lengths[:4]  # 64 .. 512
        repeats = 3
    rows = []
    for T in lengths:
        size = weights_bytes(T, dtype)
        # the explicit path holds about three (T, T) tensors at once: scores, masked, softmax
        if 4 * size > free_memory(device) // 2:
            log(f"attention: T={T} skipped, not enough free memory")
            rows.append(dict(T=T, skipped="not enough free memory", weights_bytes=size))
            continue
        log(f"attention: T={T} ...")
        rows.append(bench_length(T, dtype, repeats, device))
    return rows


def attention_table(rows, gpu):
    head = ["T", "explicit ms", "SDPA ms", "explicit/SDPA", "(T, T) weights bytes"]
    if gpu:
        head += ["peak extra MiB explicit", "peak extra MiB SDPA"]
    lines = [head]
    for r in rows:
        if "skipped" in r:
            line = [str(r["T"]), "skipped", "skipped", "", f"{r['weights_bytes']:,}"]
            if gpu:
                line += ["", ""]
            lines.append(line)
            continue
        line = [
            str(r["T"]),
            f"{r['explicit']['ms']:.2f}",
            f"{r['sdpa']['ms']:.2f}",
            f"{r['explicit_over_sdpa']:.1f}x",
            f"{r['weights_bytes']:,}",
        ]
        if gpu:
            line += [
                f"{r['explicit']['peak_extra_gpu_bytes'] / 2**20:.1f}",
                f"{r['sdpa']['peak_extra_gpu_bytes'] / 2**20:.1f}",
            ]
        lines.append(line)
    return common.markdown(lines)


def section(args, log):
    """The figures and the table, for common.run."""
    rows = bench_attention(args, log)
    table = "## Attention alone (B=1, 12 heads, head size 64, causal, forward)\n\n"
    return dict(attention=rows), [table + attention_table(rows, args.device == "cuda")], []


def sections(args):
    return [section]


if __name__ == "__main__":
    sys.exit(common.main("bench.attention", __doc__, common.Settings, sections, sys.argv[1:]))
