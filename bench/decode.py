"""
CUDA only: decoding GPT-2 124M in bf16, batch 1, a 1-token prompt to the full
context; the compiled fixed-shape decode step (CUDA graphs) against the eager
cached loop, and tokens/s as a fraction of the memory-bandwidth limit: every
weight and the filled part of the cache read once per token.

    python -m bench.decode --device=cuda [--quick]
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import sys
import time
from statistics import median

import torch

from bench import common
from model import GPT, GPTConfig

# Peak memory bandwidth in bytes/s (vendor data sheets), matched in order against
# torch.cuda.get_device_name(); the H100 SXM reports itself as "H100 80GB HBM3".
PEAK_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,
}


def peak_bandwidth(name):
    """The data-sheet bandwidth of the GPU called name, or None if it is not listed."""
    return next((bw for key, bw in PEAK_BANDWIDTH.items() if key in name), None)


def bench_decode_bandwidth(args, log):
    torch.manual_seed(0)
    shape = common.GPT2_124M
    model = GPT(GPTConfig(dropout=0.0, bias=True, **shape)).to("cuda", torch.bfloat16).eval()
    n = shape["block_size"] - 1
    if args.quick:
        n = 128
    prompt = torch.zeros(1, 1, dtype=torch.long, device="cuda")

    def compiled():
        return common.generate_compiled(model, prompt, n)

    def eager():
        return model.generate(prompt, n, temperature=0.0)

    log("decode: GPT-2 124M, compiling the decode step ...")
    t0 = time.perf_counter()
    common.generate_compiled(model, prompt, 8)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    common.check_compiled_greedy(model, compiled(), eager(), "GPT-2 124M")
    times = common.alternate({"compiled": compiled, "eager": eager}, 3, 1, "cuda")
    c = model.config
    elem = model.lm_head.weight.element_size()
    # every matrix once (the tied head reads all of wte); wpe only gives one row a token
    weight_bytes = model.num_params(non_embedding=True) * elem
    # keys and values of every layer for the positions filled, averaged over the run
    cache_bytes = 2 * c.n_layer * c.n_embd * elem * (1 + n) / 2
    peak = peak_bandwidth(torch.cuda.get_device_name())
    limit = None
    if peak:
        limit = peak / (weight_bytes + cache_bytes)
    row = dict(
        model="GPT-2 124M",
        dtype="bfloat16",
        batch=1,
        new_tokens=n,
        compile_s=compile_s,
        weight_bytes=weight_bytes,
        mean_cache_bytes=cache_bytes,
        peak_bandwidth=peak,
        limit_tokens_per_s=limit,
    )
    for key, ts in times.items():
        tps = n / median(ts)
        fraction = None
        if limit:
            fraction = tps / limit
        row[key] = dict(tokens_per_s=tps, fraction_of_limit=fraction, samples_s=ts)
    return row


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
        raise common.BenchError("the decode benchmark measures a GPU; run with --device=cuda")
    return [section]


if __name__ == "__main__":
    sys.exit(common.main("bench.decode", __doc__, common.Settings, sections, sys.argv[1:]))
