"""
Greedy decoding to the full context on the baby model: ours with the KV cache
(eager, and compiled unless --quick), ours recomputing the window, and Hugging
Face's generate, batch 1 and 8.

    python -m bench.generate [--device=cpu|cuda] [--quick] [--threads=N]
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
from support import engine

# Targets for the CPU figures (docs/benchmarks.md says whether they are met)
TARGET_CACHE_VS_NOCACHE = 5.0  # generation at full context, baby model
TARGET_CACHE_VS_HF = 2.0


def check_greedy_agree(ours, hf, device, n=8):
    """The first n greedy tokens of ours (cache and no cache) and Hugging Face's must agree."""
    prompt = torch.zeros(1, 1, dtype=torch.long, device=device)
    a = ours.generate(prompt, n, temperature=0.0)
    b = engine.generate(ours, prompt, n, temperature=0.0, use_cache=False)
    with torch.no_grad():
        c = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
        )
    if not (torch.equal(a, b) and torch.equal(a, c)):
        raise common.BenchError(
            f"greedy tokens disagree (ours cached {a.tolist()}, ours uncached "
            f"{b.tolist()}, Hugging Face {c.tolist()}); the benchmark would compare "
            "different work"
        )
    return n


def bench_batch(ours, hf, batch, new_tokens, agree, args, log):
    """One batch size: every contender decodes new_tokens from a 1-token prompt;
    agree is how many greedy tokens the models were checked to agree on."""
    device, quick = args.device, args.quick
    gpu = device == "cuda"
    repeats = 3
    if quick:
        repeats = 1
    prompt = torch.zeros(batch, 1, dtype=torch.long, device=device)
    mask = torch.ones_like(prompt)

    def ours_gen(use_cache, n=new_tokens):
        out = engine.generate(ours, prompt, n, temperature=0.0, use_cache=use_cache)
        assert out.shape == (batch, 1 + n)
        return out

    def ours_compiled(n=new_tokens):
        out = common.generate_compiled(ours, prompt, n)
        assert out.shape == (batch, 1 + n)
        return out

    def hf_gen(n=new_tokens):
        with torch.no_grad():
            out = hf.generate(
                prompt,
                attention_mask=mask,
                use_cache=True,
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
            )
        assert out.shape == (batch, 1 + n)

    fns = {
        "ours_cache": lambda: ours_gen(True),
        "ours_nocache": lambda: ours_gen(False),
        "hf": hf_gen,
    }
    # a short warm-up: the first calls pay for lazy initialisation
    ours_gen(True, 8)
    ours_gen(False, 8)
    hf_gen(8)
    compile_s = None
    # compiling takes longer than --quick allows
    if not quick:
        log(f"generate: compiling the decode step for batch {batch} ...")
        t0 = time.perf_counter()
        ours_compiled(8)
        compile_s = time.perf_counter() - t0
        common.check_compiled_greedy(ours, ours_compiled(), ours_gen(True), "baby model")
        fns["ours_compiled"] = ours_compiled
    peaks = {}
    # one extra run each, alone, for its peak memory
    if gpu:
        for key, fn in fns.items():
            peaks[key] = common.peak_gpu_bytes(fn)
    times = common.alternate(fns, repeats, 1, device)
    row = dict(
        batch=batch,
        prompt_tokens=1,
        new_tokens=new_tokens,
        repeats=repeats,
        kv_cache_bytes=ours.make_kv_cache(batch).nbytes,
        compile_s=compile_s,
        peak_rss_bytes=common.peak_rss_bytes(),
        greedy_tokens_agree=agree,
    )
    for key, ts in times.items():
        dt = median(ts)
        row[key] = dict(
            s=dt,
            tokens_per_s=batch * new_tokens / dt,
            peak_extra_gpu_bytes=peaks.get(key),
            samples_s=ts,
        )
    row["cache_over_nocache"] = (
        row["ours_cache"]["tokens_per_s"] / row["ours_nocache"]["tokens_per_s"]
    )
    row["cache_over_hf"] = row["ours_cache"]["tokens_per_s"] / row["hf"]["tokens_per_s"]
    row["compiled_over_hf"] = None
    if "ours_compiled" in row:
        row["compiled_over_hf"] = row["ours_compiled"]["tokens_per_s"] / row["hf"]["tokens_per_s"]
    return row


def bench_generate(args, log):
    device, quick = args.device, args.quick
    torch.manual_seed(0)
    ours = GPT(GPTConfig(dropout=0.0, bias=True, **common.BABY)).to(device).eval()
    hf = common.to_hf(ours).eval()
    block = ours.config.block_size
    # the full context: a 1-token prompt grows to block_size tokens
    new_tokens = block - 1
    if quick:
        new_tokens = 16
    idx = torch.randint(0, common.BABY["vocab_size"], (2, block), device=device)
    common.check_same_logits(ours, hf, idx, "baby model")
    agree = check_greedy_agree(ours, hf, device)
    # half the bytes to read per token; both models alike, after the fp32 checks
    if device == "cuda":
        ours = ours.to(torch.bfloat16)
        hf = hf.to(torch.bfloat16)
    rows = []
    for batch in (1, 8):
        log(f"generate: batch {batch}, {new_tokens} new tokens ...")
        rows.append(bench_batch(ours, hf, batch, new_tokens, agree, args, log))
    return rows


def generate_table(rows, gpu):
    head = [
        "batch",
        "new tokens",
        "ours cache tok/s",
        "ours compiled tok/s",
        "ours no-cache tok/s",
        "HF generate tok/s",
        "cache/no-cache",
        "cache/HF",
        "compiled/HF",
        "compile s",
        "KV cache bytes",
    ]
    if gpu:
        head.append("peak extra GPU MiB (cache / no-cache / HF)")
    else:
        head.append("peak RSS MiB (process)")
    lines = [head]
    for r in rows:
        compiled = ["-", "-", "-"]
        if "ours_compiled" in r:
            compiled = [
                f"{r['ours_compiled']['tokens_per_s']:,.0f}",
                f"{r['compiled_over_hf']:.1f}x",
                f"{r['compile_s']:.0f}",
            ]
        line = [
            str(r["batch"]),
            str(r["new_tokens"]),
            f"{r['ours_cache']['tokens_per_s']:,.0f}",
            compiled[0],
            f"{r['ours_nocache']['tokens_per_s']:,.0f}",
            f"{r['hf']['tokens_per_s']:,.0f}",
            f"{r['cache_over_nocache']:.1f}x",
            f"{r['cache_over_hf']:.1f}x",
            compiled[1],
            compiled[2],
            f"{r['kv_cache_bytes']:,}",
        ]
        if gpu:
            peaks = [r[k]["peak_extra_gpu_bytes"] for k in ("ours_cache", "ours_nocache", "hf")]
            line.append(" / ".join(f"{p / 2**20:.0f}" for p in peaks))
        else:
            line.append(f"{r['peak_rss_bytes'] / 2**20:.0f}")
        lines.append(line)
    return common.markdown(lines)


def generate_targets(rows, quick):
    """The CPU targets, each with its measured value and whether it is met (None for
    --quick, whose short generations stop well before the full context)."""
    found = []
    for r in rows:
        batch = f"generation batch {r['batch']}"
        x = r["cache_over_nocache"]
        text = f"{batch}: cache >= {TARGET_CACHE_VS_NOCACHE}x no-cache"
        found.append(common.target(text, x, x >= TARGET_CACHE_VS_NOCACHE, quick))
        x = r["cache_over_hf"]
        text = f"{batch}: cache >= {TARGET_CACHE_VS_HF}x Hugging Face generate"
        found.append(common.target(text, x, x >= TARGET_CACHE_VS_HF, quick))
        x = r["compiled_over_hf"]
        if x is not None:
            text = f"{batch}: compiled cache >= {TARGET_CACHE_VS_HF}x Hugging Face generate"
            found.append(common.target(text, x, x >= TARGET_CACHE_VS_HF, quick))
    return found


def section(args, log):
    """The figures, the table and (on a CPU) the targets, for common.run."""
    rows = bench_generate(args, log)
    gpu = args.device == "cuda"
    table = "## Generation (greedy, 1-token prompt, baby model)\n\n" + generate_table(rows, gpu)
    found = [] if gpu else generate_targets(rows, args.quick)
    return dict(generate=rows), [table], found


def sections(args):
    return [section]


if __name__ == "__main__":
    sys.exit(common.main("bench.generate", __doc__, common.Settings, sections, sys.argv[1:]))
