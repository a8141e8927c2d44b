"""
CUDA only: decoding GPT-2 124M in bf16, batch 1, a 1-token prompt to the full
context; the compiled fixed-shape decode step (CUDA graphs) against the eager
cached loop, and tokens/s as a fraction of the memory-bandwidth limit: every
weight and the filled part of the cache read once per token.

    python -m bench.decode --device=cuda [--quick]
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import time
from statistics import median

import torch

from bench import common
from model import GPT, GPTConfig
from support.mfu import peak_bandwidth


def gpt2_model(device):
    """GPT-2 124M with random weights in bf16, for decoding: the same shapes, so the same
    bytes read per token, as the published weights (nothing to download)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(dropout=0.0, bias=True, **common.GPT2_124M))
    return model.to(device, torch.bfloat16).eval()


def decode_bytes(model, n):
    """(weight bytes, mean cache bytes) read to decode one token, on average over n tokens
    after a 1-token prompt: every matrix once (the tied head reads all of wte; wpe gives
    a token one row, so it is left out), and the keys and values of every layer for the
    positions filled, (1 + n) / 2 of them on average."""
    c = model.config
    elem = model.lm_head.weight.element_size()
    weight_bytes = model.num_params(non_embedding=True) * elem
    kv_width = c.n_kv_head * (c.n_embd // c.n_head)
    cache_bytes = 2 * c.n_layer * kv_width * elem * (1 + n) / 2
    return weight_bytes, cache_bytes


def bench_decode(model, n, device, name="GPT-2 124M", compiled=True, repeats=3, log=print):
    """Greedy decoding of n tokens after a 1-token prompt at batch 1: the eager cached
    loop and (compiled) the compiled decode step, alternating, each as tokens/s and as a
    fraction of the bandwidth limit (the device's peak bandwidth over decode_bytes; None
    where the peak is unknown, or on a CPU)."""
    prompt = torch.zeros(1, 1, dtype=torch.long, device=device)

    def compiled_path():
        return common.generate_compiled(model, prompt, n)

    def eager():
        return model.generate(prompt, n, temperature=0.0)

    fns = {"eager": eager}
    compile_s = None
    if compiled:
        log(f"decode: {name}, compiling the decode step ...")
        t0 = time.perf_counter()
        common.generate_compiled(model, prompt, 8)
        common.sync(device)
        compile_s = time.perf_counter() - t0
        common.check_compiled_greedy(model, compiled_path(), eager(), name)
        fns = {"compiled": compiled_path, "eager": eager}
    times = common.alternate(fns, repeats, 1, device)
    weight_bytes, cache_bytes = decode_bytes(model, n)
    peak = None
    if device == "cuda":
        peak = peak_bandwidth(torch.cuda.get_device_name())
    limit = None
    if peak:
        limit = peak / (weight_bytes + cache_bytes)
    row = dict(
        model=name,
        dtype=str(model.lm_head.weight.dtype).removeprefix("torch."),
        batch=1,
        new_tokens=n,
        compile_s=compile_s,
        weight_bytes=weight_bytes,
        mean_cache_bytes=cache_bytes,
        peak_bandwidth=peak,
        limit_tokens_per_s=limit,
        compiled=None,
    )
    for key, ts in times.items():
        tps = n / median(ts)
        fraction = None
        if limit:
            fraction = tps / limit
        row[key] = dict(tokens_per_s=tps, fraction_of_limit=fraction, samples_s=ts)
    return row


def bench_decode_bandwidth(args, log):
    n = common.GPT2_124M["block_size"] - 1
    if args.quick:
        n = 128
    return bench_decode(gpt2_model("cuda"), n, "cuda", log=log)


def fraction_cell(x):
    if x is None:
        return "- (unknown peak bandwidth)"
    return f"{x:.0%}"


def decode_bandwidth_table(r):
    lines = [
        ["path", "tok/s", "fraction of the bandwidth limit"],
        [
            "compiled, CUDA graphs",
            f"{r['compiled']['tokens_per_s']:,.0f}",
            fraction_cell(r["compiled"]["fraction_of_limit"]),
        ],
        [
            "eager, KV cache",
            f"{r['eager']['tokens_per_s']:,.0f}",
            fraction_cell(r["eager"]["fraction_of_limit"]),
        ],
    ]
    limit = "unknown"
    if r["limit_tokens_per_s"]:
        limit = f"{r['limit_tokens_per_s']:,.0f} tok/s"
    return (
        common.markdown(lines)
        + f"\n\nLimit: {limit} ({r['weight_bytes'] / 1e6:.0f} MB of weights + "
        f"{r['mean_cache_bytes'] / 1e6:.1f} MB of cache per token on average, at "
        f"{(r['peak_bandwidth'] or 0) / 1e12:.2f} TB/s); compiling took {r['compile_s']:.0f} s."
    )


def section(args, log):
    """The figures and the table, for common.run; on a CPU, nothing to measure."""
    if args.device != "cuda":
        return dict(decode_bandwidth=None), [], []
    row = bench_decode_bandwidth(args, log)
    table = "## Decoding GPT-2 124M, batch 1, bf16\n\n" + decode_bandwidth_table(row)
    return dict(decode_bandwidth=row), [table], []


def sections(args):
    if args.device != "cuda":
        raise common.ConfigError("the decode benchmark measures a GPU; run with --device=cuda")
    return [section]


if __name__ == "__main__":
    sys.exit(common.main("bench.decode", __doc__, common.Settings, sections, sys.argv[1:]))
