"""
How fast is model.py, against Hugging Face's GPT-2 on the same machine in the same run?

    python bench.py [--device=cpu|cuda] [--quick] [--compile] [--threads=N] [--out=bench.json]

Three sections, each printed as a markdown table and written to --out as JSON:
  1. train      one optimizer step (forward, backward, AdamW) for three model sizes,
                ours against transformers' GPT2LMHeadModel with the same weights
  2. generate   greedy decoding to the full context on the baby model: ours with the
                KV cache (eager, and compiled unless --quick), ours recomputing the
                window, and Hugging Face's generate
  3. attention  model.attention (explicit, materialises the (T, T) weights) against
                F.scaled_dot_product_attention as the context grows
  4. decode     CUDA only: GPT-2 124M, batch 1, the compiled decode step (CUDA graphs)
                as a fraction of the memory-bandwidth limit
  --recipes     instead of those: config/shakespeare_cpu.py against nanoGPT's CPU
                settings (config/shakespeare_cpu_classic.py), each trained to the end
                by train.py, on this CPU as it is and capped at AVX2 (no AVX-512, no
                native bfloat16, like most laptops): whole-val loss and wall time
  --long_context  instead of those: sliding-window attention (W = 256, float32) against
                dense causal attention, the attention alone and a whole attention layer,
                fwd + bwd, T = 1024 .. 16384; then the rolling KV cache: its bytes, its
                tokens/s early and late in a 20 x block_size generation, and against a
                dense model that slides and recomputes past block_size
                (--long_context_part=attention or =cache: that half alone)

Timings alternate between the contenders in the same process (rotating which goes
first) and report medians, so a busy machine slows all of them alike.
transformers is a test-only dependency (requirements-dev.txt).
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import contextlib
import datetime
import json
import os
import platform
import resource
import sys
import time
from statistics import median

import torch
import torch.nn.functional as F

from model import GPT, GPTConfig, MultiHeadAttention, attention, causal_mask, windowed_attention
from support.configurator import ConfigError, describe, parse_args

DEFAULTS = dict(
    device="cpu",  # cpu or cuda
    quick=False,  # small repeat counts, no GPT-2 124M training, shorter generation: under a minute
    compile=False,  # torch.compile our model for the training section (cuda only)
    threads=0,  # CPU threads; 0 keeps torch's default. 1 steadies ratios on a busy machine
    out="bench.json",  # where every figure goes
    recipes=False,  # instead: train the CPU recipe against nanoGPT's CPU settings, on this CPU and capped at AVX2
    nanogpt="",  # with --recipes: a nanoGPT checkout (its data prepared) whose own train.py runs beside ours
    long_context=False,  # instead: sliding-window attention and the rolling KV cache against dense
    long_context_part="all",  # with --long_context: all, attention or cache
)

# name, model shape, batch on CPU, batch on GPU
TRAIN_CASES = [
    (
        "nanoGPT CPU settings",
        dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65),
        12,
        12,
    ),
    ("baby model", dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65), 8, 64),
    (
        "GPT-2 124M",
        dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
        1,
        12,
    ),
]
BABY = TRAIN_CASES[1][1]

# Targets for the CPU figures (docs/benchmarks.md says whether they are met).
TARGET_TRAIN_VS_HF = 1.25  # nanoGPT CPU settings: HF ms/step / ours ms/step
TARGET_CACHE_VS_NOCACHE = 5.0  # generation at full context, baby model
TARGET_CACHE_VS_HF = 2.0


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


# The CPU recipe's targets (docs/benchmarks.md): the val loss nanoGPT's CPU settings
# reach, in at most this fraction of their wall time, on the same machine.
TARGET_RECIPE_LOSS = 1.88
TARGET_RECIPE_WALL = 0.30
RECIPES = [
    ("nanoGPT CPU settings", "config/shakespeare_cpu_classic.py"),
    ("ours", "config/shakespeare_cpu.py"),
]
# ATen, oneDNN and MKL each cap the instructions they use at these settings, so a
# CPU with AVX-512 and native bfloat16 runs like one with AVX2 alone.
AVX2_CAP = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}


class BenchError(Exception):
    """A problem the user can fix; printed as one line."""


# -----------------------------------------------------------------------------
# Timing


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def alternate(fns, repeats, calls, device):
    """Time each of fns (name -> callable) for `calls` calls per repeat.

    The contenders take turns within every repeat and the order rotates between
    repeats, so background load and warm caches favour none of them.
    Returns name -> list of seconds per call, one entry per repeat.
    """
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            sync(device)
            times[name].append((time.perf_counter() - t0) / calls)
    return times


def autocast(device):
    # bf16 on GPU for every contender alike; plain fp32 on CPU
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_rss_bytes():
    """The process's peak resident memory so far (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


# -----------------------------------------------------------------------------
# Hugging Face GPT-2 with our weights


def hf_config(config, activation="gelu_new"):
    """GPT2Config with our model's shape. gelu_new is GPT-2's own config value;
    sdpa is Hugging Face's fastest attention on CPU and GPU."""
    from transformers import GPT2Config

    return GPT2Config(
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        vocab_size=config.vocab_size,
        activation_function=activation,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
        attn_implementation="sdpa",
    )


def to_hf(model, activation="gelu_new"):
    """A GPT2LMHeadModel holding a copy of our model's weights."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(hf_config(model.config, activation))
    sd = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to wte in both models
        # Hugging Face keeps these projections as Conv1D, (in, out): Linear's (out, in) transposed
        if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            tensor = tensor.t()
        sd[key] = tensor.clone()
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise BenchError(
            f"weight conversion to Hugging Face GPT-2 failed: missing {missing}, "
            f"unexpected {unexpected}"
        )
    hf.tie_weights()
    hf.generation_config.eos_token_id = None  # never stop early: every run makes all its tokens
    hf.generation_config.pad_token_id = 0
    return hf.to(next(model.parameters()).device)


def check_same_logits(ours, hf, idx, what):
    """Both models must compute the same function, or the timings compare different work."""
    with torch.no_grad():
        a = ours(idx)[0]
        b = hf(input_ids=idx).logits
    diff = (a - b).abs().max().item()
    if diff > (2e-2 if idx.is_cuda else 1e-3):  # TF32 matmuls on GPU
        raise BenchError(
            f"{what}: our logits and Hugging Face's differ by {diff:.2e}; "
            "the weight converter in bench.py is out of date"
        )
    return diff


# -----------------------------------------------------------------------------
# 1. Training step


def adamw(model, device):
    """AdamW with weight decay on matrices only, as model.configure_optimizers does."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), fused=device == "cuda")


def train_step_fn(model, loss_fn, optimizer, device):
    def step():
        with autocast(device):
            loss = loss_fn(model)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_train(args, log):
    device, quick = args["device"], args["quick"]
    gpu = device == "cuda"
    if gpu:
        warmup, repeats, calls = 10, 10, 10
    else:
        warmup, repeats, calls = (1, 3, 2) if quick else (3, 15, 5)
    rows = []
    for name, shape, cpu_batch, gpu_batch in TRAIN_CASES:
        if name == "GPT-2 124M" and not gpu:
            if quick:
                log(f"train: {name} skipped (--quick on CPU)")
                continue
            warmup_c, repeats_c, calls_c = 1, 3, 1  # about ten seconds a step on two cores
        elif name == "baby model" and not gpu:
            warmup_c, repeats_c, calls_c = (1, 1, 1) if quick else (2, 7, 2)
        else:
            warmup_c, repeats_c, calls_c = warmup, repeats, calls
        batch = gpu_batch if gpu else cpu_batch
        T = shape["block_size"]
        log(f"train: {name}, batch {batch} x {T} ...")
        torch.manual_seed(0)
        ours = GPT(GPTConfig(dropout=0.0, bias=True, **shape)).to(device)
        hf = to_hf(ours)  # gelu_new: what GPT-2's config.json asks for
        hf_fused = to_hf(ours, activation="gelu_pytorch_tanh")  # Hugging Face's fused-kernel option
        seq = torch.randint(0, shape["vocab_size"], (batch, T + 1), device=device)
        x, y = seq[:, :-1], seq[:, 1:]
        logit_diff = check_same_logits(ours, hf, x[:1], name)

        # each model's own training loss: ours takes targets, Hugging Face shifts labels itself
        ours_loss = lambda m: m(x, y)[1]
        hf_loss = lambda m: m(input_ids=x, labels=x).loss
        fns = {}
        compiled = gpu and args["compile"]
        our_module = torch.compile(ours) if compiled else ours
        fns["ours"] = train_step_fn(
            our_module, ours_loss, ours.configure_optimizers(0.1, 1e-4, (0.9, 0.95), device), device
        )
        fns["hf"] = train_step_fn(hf, hf_loss, adamw(hf, device), device)
        fns["hf_fused_gelu"] = train_step_fn(hf_fused, hf_loss, adamw(hf_fused, device), device)
        for fn in fns.values():
            for _ in range(warmup_c):
                fn()
        times = alternate(fns, repeats_c, calls_c, device)

        tokens = batch * T
        row = dict(
            name=name,
            model=shape,
            batch=batch,
            tokens_per_step=tokens,
            warmup_steps=warmup_c,
            repeats=repeats_c,
            steps_per_repeat=calls_c,
            compiled=compiled,
            autocast="bf16" if gpu else None,
            max_logit_diff_vs_hf=logit_diff,
        )
        for key, ts in times.items():
            dt = median(ts)
            mfu = ours.estimate_mfu(tokens, dt) if gpu else None  # same FLOPs for every contender
            row[key] = dict(
                ms_per_step=dt * 1e3,
                tokens_per_s=tokens / dt,
                mfu=mfu,
                samples_ms=[t * 1e3 for t in ts],
            )
        row["hf_over_ours"] = row["hf"]["ms_per_step"] / row["ours"]["ms_per_step"]
        row["hf_fused_gelu_over_ours"] = (
            row["hf_fused_gelu"]["ms_per_step"] / row["ours"]["ms_per_step"]
        )
        rows.append(row)
        del ours, hf, hf_fused, fns, our_module
    return rows


def train_table(rows, gpu):
    head = [
        "model",
        "batch x block",
        "ours ms/step",
        "HF ms/step",
        "HF fused-GELU ms/step",
        "ours tok/s",
        "HF tok/s",
        "HF/ours",
        "HF fused-GELU/ours",
    ]
    if gpu:
        head += ["ours MFU", "HF MFU"]
    lines = [head]
    for r in rows:
        line = [
            r["name"],
            f"{r['batch']} x {r['model']['block_size']}",
            f"{r['ours']['ms_per_step']:.1f}",
            f"{r['hf']['ms_per_step']:.1f}",
            f"{r['hf_fused_gelu']['ms_per_step']:.1f}",
            f"{r['ours']['tokens_per_s']:,.0f}",
            f"{r['hf']['tokens_per_s']:,.0f}",
            f"{r['hf_over_ours']:.2f}x",
            f"{r['hf_fused_gelu_over_ours']:.2f}x",
        ]
        if gpu:
            line += [_pct(r["ours"]["mfu"]), _pct(r["hf"]["mfu"])]
        lines.append(line)
    return markdown(lines)


def _verdict(met):
    return "not judged (--quick)" if met is None else "met" if met else "NOT met"


def _pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


# -----------------------------------------------------------------------------
# 2. Generation


def bench_generate(args, log):
    device, quick = args["device"], args["quick"]
    gpu = device == "cuda"
    torch.manual_seed(0)
    ours = GPT(GPTConfig(dropout=0.0, bias=True, **BABY)).to(device).eval()
    hf = to_hf(ours).eval()
    block = ours.config.block_size
    # the full context: a 1-token prompt grows to block_size tokens
    new_tokens = 16 if quick else block - 1
    repeats = 1 if quick else 3
    check_same_logits(
        ours, hf, torch.randint(0, BABY["vocab_size"], (2, block), device=device), "baby model"
    )
    agree = check_greedy_agree(ours, hf, device)
    if gpu:  # half the bytes to read per token; both models alike, after the fp32 checks
        ours, hf = ours.to(torch.bfloat16), hf.to(torch.bfloat16)

    rows = []
    for batch in (1, 8):
        log(f"generate: batch {batch}, {new_tokens} new tokens ...")
        prompt = torch.zeros(batch, 1, dtype=torch.long, device=device)
        mask = torch.ones_like(prompt)

        def ours_gen(use_cache, n=new_tokens, compile=False):
            out = ours.generate(prompt, n, temperature=0.0, use_cache=use_cache, compile=compile)
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
        ours_gen(True, 8), ours_gen(False, 8), hf_gen(8)
        compile_s = None
        if not quick:  # compiling takes longer than --quick allows
            log(f"generate: compiling the decode step for batch {batch} ...")
            t0 = time.perf_counter()
            ours_gen(True, 8, compile=True)
            compile_s = time.perf_counter() - t0
            check_compiled_greedy(ours, ours_gen(True, compile=True), ours_gen(True), "baby model")
            fns["ours_compiled"] = lambda: ours_gen(True, compile=True)
        peaks = {}
        if gpu:  # one extra run each, alone, for its peak memory
            for key, fn in fns.items():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()  # both models' weights
                fn()
                torch.cuda.synchronize()
                peaks[key] = torch.cuda.max_memory_allocated() - base
        times = alternate(fns, repeats, 1, device)
        row = dict(
            batch=batch,
            prompt_tokens=1,
            new_tokens=new_tokens,
            repeats=repeats,
            kv_cache_bytes=ours.make_kv_cache(batch).nbytes,
            compile_s=compile_s,
            peak_rss_bytes=peak_rss_bytes(),
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
        row["compiled_over_hf"] = (
            row["ours_compiled"]["tokens_per_s"] / row["hf"]["tokens_per_s"]
            if "ours_compiled" in row
            else None
        )
        rows.append(row)
    return rows


def check_compiled_greedy(model, compiled, eager, what):
    """The compiled decode step must make the eager path's greedy choices. In
    float32 (CPU) the tokens are identical. In bf16 two different kernels may
    break a near-tie differently, after which the sequences part ways; there,
    every token the compiled path chose must be within rounding of the best
    logit of a plain forward over the same tokens."""
    if torch.equal(compiled, eager):
        return
    bs = model.config.block_size
    if model.lm_head.weight.dtype == torch.float32 or compiled.size(1) > bs:
        raise BenchError(
            f"{what}: compiled and eager greedy tokens differ; the benchmark would "
            "compare different work"
        )
    with torch.no_grad():
        logits = model(compiled[:, :-1])[0].float()  # (B, T - 1, vocab)
    chosen = logits.gather(-1, compiled[:, 1:, None])[..., 0]
    gap = (logits.max(-1).values - chosen).max().item()
    if gap > 0.1:  # bf16 logits of a few units carry about 1e-2 of rounding
        raise BenchError(
            f"{what}: the compiled step chose a token {gap:.3f} below the best "
            "logit of a plain forward"
        )


def bench_decode_bandwidth(args, log):
    """CUDA only: GPT-2 124M in bf16, batch 1, 1-token prompt to the full context;
    the compiled fixed-shape decode step (CUDA graphs) against the eager cached
    loop, and tokens/s as a fraction of the memory-bandwidth limit: every weight
    and the filled part of the cache read once per token."""
    torch.manual_seed(0)
    shape = TRAIN_CASES[2][1]
    model = GPT(GPTConfig(dropout=0.0, bias=True, **shape)).to("cuda", torch.bfloat16).eval()
    n = 128 if args["quick"] else shape["block_size"] - 1
    prompt = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    log("decode: GPT-2 124M, compiling the decode step ...")
    t0 = time.perf_counter()
    model.generate(prompt, 8, temperature=0.0, compile=True)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    check_compiled_greedy(
        model,
        model.generate(prompt, n, temperature=0.0, compile=True),
        model.generate(prompt, n, temperature=0.0),
        "GPT-2 124M",
    )
    times = alternate(
        {
            "compiled": lambda: model.generate(prompt, n, temperature=0.0, compile=True),
            "eager": lambda: model.generate(prompt, n, temperature=0.0),
        },
        3,
        1,
        "cuda",
    )
    c, elem = model.config, model.lm_head.weight.element_size()
    # every matrix once (the tied head reads all of wte); wpe only gives one row a token
    weight_bytes = model.num_params(non_embedding=True) * elem
    # keys and values of every layer for the positions filled, averaged over the run
    cache_bytes = 2 * c.n_layer * c.n_embd * elem * (1 + n) / 2
    peak = next(
        (bw for key, bw in PEAK_BANDWIDTH.items() if key in torch.cuda.get_device_name()), None
    )
    limit = peak / (weight_bytes + cache_bytes) if peak else None
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
        row[key] = dict(
            tokens_per_s=tps, fraction_of_limit=tps / limit if limit else None, samples_s=ts
        )
    return row


def decode_bandwidth_table(r):
    def frac(x):
        return f"{x:.0%}" if x is not None else "- (unknown peak bandwidth)"

    lines = [
        ["path", "tok/s", "fraction of the bandwidth limit"],
        [
            "compiled, CUDA graphs",
            f"{r['compiled']['tokens_per_s']:,.0f}",
            frac(r["compiled"]["fraction_of_limit"]),
        ],
        [
            "eager, KV cache",
            f"{r['eager']['tokens_per_s']:,.0f}",
            frac(r["eager"]["fraction_of_limit"]),
        ],
    ]
    limit = f"{r['limit_tokens_per_s']:,.0f} tok/s" if r["limit_tokens_per_s"] else "unknown"
    return (
        markdown(lines) + f"\n\nLimit: {limit} ({r['weight_bytes'] / 1e6:.0f} MB of weights + "
        f"{r['mean_cache_bytes'] / 1e6:.1f} MB of cache per token on average, at "
        f"{(r['peak_bandwidth'] or 0) / 1e12:.2f} TB/s); compiling took {r['compile_s']:.0f} s."
    )


def check_greedy_agree(ours, hf, device, n=8):
    """The first n greedy tokens of ours (cache and no cache) and Hugging Face's must agree."""
    prompt = torch.zeros(1, 1, dtype=torch.long, device=device)
    a = ours.generate(prompt, n, temperature=0.0, use_cache=True)
    b = ours.generate(prompt, n, temperature=0.0, use_cache=False)
    with torch.no_grad():
        c = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
        )
    if not (torch.equal(a, b) and torch.equal(a, c)):
        raise BenchError(
            f"greedy tokens disagree (ours cached {a.tolist()}, ours uncached "
            f"{b.tolist()}, Hugging Face {c.tolist()}); the benchmark would compare "
            "different work"
        )
    return n


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
    head += ["peak extra GPU MiB (cache / no-cache / HF)"] if gpu else ["peak RSS MiB (process)"]
    lines = [head]
    for r in rows:
        compiled = "ours_compiled" in r
        line = [
            str(r["batch"]),
            str(r["new_tokens"]),
            f"{r['ours_cache']['tokens_per_s']:,.0f}",
            f"{r['ours_compiled']['tokens_per_s']:,.0f}" if compiled else "-",
            f"{r['ours_nocache']['tokens_per_s']:,.0f}",
            f"{r['hf']['tokens_per_s']:,.0f}",
            f"{r['cache_over_nocache']:.1f}x",
            f"{r['cache_over_hf']:.1f}x",
            f"{r['compiled_over_hf']:.1f}x" if compiled else "-",
            f"{r['compile_s']:.0f}" if compiled else "-",
            f"{r['kv_cache_bytes']:,}",
        ]
        if gpu:
            line.append(
                " / ".join(
                    f"{r[k]['peak_extra_gpu_bytes'] / 2**20:.0f}"
                    for k in ("ours_cache", "ours_nocache", "hf")
                )
            )
        else:
            line.append(f"{r['peak_rss_bytes'] / 2**20:.0f}")
        lines.append(line)
    return markdown(lines)


# -----------------------------------------------------------------------------
# Recipes: time to the target loss, whole training runs


def cpu_classes():
    """[(name, environment, train.py arguments)]: this CPU as it is; where it runs
    bfloat16 natively, the same in float32 (the class whose bfloat16 crashes or
    is slower, like a VM that advertises AMX it does not allow); then capped at
    AVX2 if it has more."""
    from support.hardware import native_bf16

    native, why = native_bf16("cpu")
    capability = torch.backends.cpu.get_cpu_capability()
    classes = [(f"this CPU ({capability}, {why})", {}, [])]
    if native:
        classes.append(
            (f"this CPU in float32 ({capability}, bfloat16 not used)", {}, ["--dtype=float32"])
        )
    if capability != "AVX2" or native:
        classes.append(("capped at AVX2 (no native bfloat16)", AVX2_CAP, []))
    return classes


def train_run(config, env, out_dir, data_root=None, args=()):
    """Run train.py on a config to the end: (wall seconds, its last log record, device
    and dtype, phases). Phases split the wall time by when train.py's lines appear:
    start-up (to the line naming the device), training (train.py's own clock),
    evaluations and saving (the rest until its last line), exit (after it)."""
    import subprocess
    import tempfile

    extra = [f"--data_root={data_root}"] if data_root else []
    extra += list(args)
    stamps, stdout = {}, []
    with tempfile.TemporaryFile(
        "w+"
    ) as err:  # the progress bar's stderr: a pipe left unread would fill
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [
                sys.executable,
                "train.py",
                config,
                f"--out_dir={out_dir}",
                "--eval_full_val=True",
                *extra,
            ],
            cwd=os.path.dirname(os.path.abspath(__file__)),
            env=dict(os.environ, **env),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        for line in proc.stdout:
            stdout.append(line)
            for key, mark in (("start", "parameters |"), ("done", "done at iter")):
                if mark in line:
                    stamps[key] = time.perf_counter() - t0
        proc.wait()
        wall = time.perf_counter() - t0
        err.seek(0)
        stderr = err.read()
    if proc.returncode != 0 or len(stamps) < 2:
        raise BenchError(f"train.py {config} failed: {stderr.strip().splitlines()[-1:]}")
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        last = json.loads(f.read().splitlines()[-1])
    start = next(line for line in stdout if "parameters |" in line)
    phases = dict(
        startup_s=stamps["start"],
        training_s=last["elapsed_s"],
        evaluations_s=stamps["done"] - stamps["start"] - last["elapsed_s"],
        exit_s=wall - stamps["done"],
    )
    return wall, last, start.split("|")[1].strip(), phases


# nanoGPT's README command for a CPU (its train.py trains in float32 there)
NANOGPT_CPU = [
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--dropout=0.0",
]


def nanogpt_run(path, env, out_dir):
    """nanoGPT's own train.py, as its README runs it on a CPU: (wall seconds, its
    last val loss, an estimate over eval_iters batches)."""
    import re
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "train.py", *NANOGPT_CPU, f"--out_dir={out_dir}"],
        cwd=path,
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    losses = re.findall(r"step \d+: train loss [\d.]+, val loss ([\d.]+)", proc.stdout)
    if proc.returncode != 0 or not losses:
        raise BenchError(
            f"nanoGPT's train.py failed: {(proc.stderr.strip().splitlines() or ['no output'])[-1]}"
        )
    return wall, float(losses[-1])


def bench_recipes(log, recipes=RECIPES, data_root=None, nanogpt=""):
    """Each recipe trained to the end on each CPU class, the first recipe (nanoGPT's
    settings) first: the others' wall times are given as fractions of its, and of
    nanoGPT's own train.py's when a checkout is given."""
    import tempfile

    from data.prepare import ensure_dataset

    ensure_dataset("shakespeare_char", data_root)  # prepared before the clocks start
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cpu, env, args in cpu_classes():
            walls = {}
            if nanogpt:
                log(f"recipes: nanoGPT's own train.py on {cpu} ...")
                walls["nanoGPT"], val = nanogpt_run(
                    nanogpt, env, os.path.join(tmp, f"nanogpt{len(rows)}")
                )
                rows.append(
                    dict(
                        cpu=cpu,
                        recipe="nanoGPT itself",
                        config="nanoGPT train.py",
                        reference=True,
                        device="cpu, float32",
                        iters=2000,
                        val_loss=val,
                        wall_s=walls["nanoGPT"],
                    )
                )
            for i, (name, config) in enumerate(recipes):
                log(f"recipes: {config} on {cpu} ...")
                # the reference keeps its own settings: nanoGPT trains in float32 on a CPU anyway
                wall, last, device, phases = train_run(
                    config, env, os.path.join(tmp, f"{len(rows)}"), data_root, args if i else ()
                )
                walls[name] = wall
                rows.append(
                    dict(
                        cpu=cpu,
                        recipe=name,
                        config=config,
                        reference=i == 0,
                        device=device,
                        iters=last["iter"],
                        val_loss_full=last["val_loss_full"],
                        wall_s=wall,
                        wall_over_classic=wall / walls[recipes[0][0]],
                        **phases,
                    )
                )
                if nanogpt:
                    rows[-1]["wall_over_nanogpt"] = wall / walls["nanoGPT"]
    return rows


def recipes_table(rows):
    lines = [
        "| CPU | recipe | device, dtype | iters | val loss | start-up s | training s | evaluations s "
        "| exit s | wall s | wall / nanoGPT's settings | wall / nanoGPT itself |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(r, key, form):
        return format(r[key], form) if key in r else "-"

    for r in rows:
        loss = (
            f"{r['val_loss_full']:.4f} (whole split)"
            if "val_loss_full" in r
            else f"{r['val_loss']:.4f} (estimate)"
        )
        lines.append(
            f"| {r['cpu']} | `{r['config']}` | {r['device']} | {r['iters']} | {loss} | "
            + " | ".join(
                cell(r, k, ".1f") for k in ("startup_s", "training_s", "evaluations_s", "exit_s")
            )
            + f" | {r['wall_s']:.1f} | {cell(r, 'wall_over_classic', '.2f')} | "
            f"{cell(r, 'wall_over_nanogpt', '.2f')} |"
        )
    return "\n".join(lines)


def recipe_targets(rows):
    return [
        dict(
            target=f"{r['cpu']}: whole-val loss <= {TARGET_RECIPE_LOSS} in <= {TARGET_RECIPE_WALL}x "
            "the wall time of nanoGPT's CPU settings",
            measured=r["wall_over_classic"],
            met=r["val_loss_full"] <= TARGET_RECIPE_LOSS
            and r["wall_over_classic"] <= TARGET_RECIPE_WALL,
        )
        for r in rows
        if "wall_over_classic" in r and not r["reference"]
    ]


# -----------------------------------------------------------------------------
# 3. Attention alone

# How far each attention path may be from a float64 reference, in units in the
# last place (ulps) of the output's dtype at the size of its largest entry.
# Rounding the output alone costs half an ulp and the scores and weights a few
# more (measured on a CPU: under 1 in bfloat16, under 4 in float32); a wrong
# mask or scale is off by about the output itself, 2^7 ulps or more in bfloat16.
ATTENTION_TOLERANCE_ULPS = 8


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
            raise BenchError(
                f"attention at T={T}: the {name} path is {err:.1f} ulps from a float64 "
                f"reference (at most {ATTENTION_TOLERANCE_ULPS} expected)"
            )
    return errors


def bench_attention(args, log):
    device, quick = args["device"], args["quick"]
    gpu = device == "cuda"
    B, nh, hs = 1, 12, 64
    dtype = torch.bfloat16 if gpu else torch.float32  # the flash kernel needs half precision on GPU
    lengths = [64 * 2**i for i in range(4 if quick else 7)]  # 64 .. 512 or 4096
    repeats = 3 if quick else 5
    rows = []
    for T in lengths:
        weights_bytes = B * nh * T * T * torch.finfo(dtype).bits // 8
        # the explicit path holds about three (T, T) tensors at once: scores, masked, softmax
        if 4 * weights_bytes > free_memory(device) // 2:
            log(f"attention: T={T} skipped, not enough free memory")
            rows.append(dict(T=T, skipped="not enough free memory", weights_bytes=weights_bytes))
            continue
        log(f"attention: T={T} ...")
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, nh, T, hs, device=device, dtype=dtype) for _ in range(3))
        mask = causal_mask(T, T, device=device)

        def explicit():
            return attention(q, k, v, mask)[0]

        def fused():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        with torch.no_grad():
            outputs = {"explicit": explicit(), "sdpa": fused()}
            errors = check_attention(q, k, v, mask, outputs, T)
            diff = (outputs["explicit"].float() - outputs["sdpa"].float()).abs().max().item()
            del outputs
            peaks = {}
            if gpu:
                for key, fn in (("explicit", explicit), ("sdpa", fused)):
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    fn()
                    torch.cuda.synchronize()
                    peaks[key] = torch.cuda.max_memory_allocated() - base
            times = alternate(
                {"explicit": explicit, "sdpa": fused}, repeats, 1 if T >= 1024 else 5, device
            )
        rows.append(
            dict(
                T=T,
                B=B,
                n_head=nh,
                head_size=hs,
                dtype=str(dtype).removeprefix("torch."),
                weights_bytes=weights_bytes,
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
        )
        del q, k, v, mask
    return rows


def free_memory(device):
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


def attention_table(rows, gpu):
    head = ["T", "explicit ms", "SDPA ms", "explicit/SDPA", "(T, T) weights bytes"]
    if gpu:
        head += ["peak extra MiB explicit", "peak extra MiB SDPA"]
    lines = [head]
    for r in rows:
        if "skipped" in r:
            lines.append(
                [str(r["T"]), "skipped", "skipped", "", f"{r['weights_bytes']:,}"]
                + ([""] * 2 if gpu else [])
            )
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
    return markdown(lines)


# -----------------------------------------------------------------------------
# Long context: sliding-window attention and the rolling KV cache

# Targets (issue: long context); the window and shapes they were set for
TARGET_WINDOW_ATTENTION = 4.0  # attention alone, fwd + bwd, T = 8192: dense ms / windowed ms
TARGET_WINDOW_LAYER = 5.0  # one attention layer, fwd + bwd, T = 16384: dense / windowed
TARGET_WINDOW_LINEAR = 2.3  # windowed layer: ms at T = 16384 / ms at T = 8192, at most
TARGET_ROLLING_STEADY = (
    0.85  # tokens/s over the last 10% of a 20 x block_size generation / first 10%
)
TARGET_ROLLING_VS_SLIDE = (
    1.3  # past block_size: windowed tokens/s / dense (slide and recompute) tokens/s
)
LONG_W, LONG_HEADS, LONG_HS = 256, 4, 64
LONG_LENGTHS, LONG_QUICK = [1024, 2048, 4096, 8192, 16384], [1024, 2048, 4096]
DECODE_SHAPE = dict(n_layer=6, n_head=6, n_embd=384, block_size=1024, vocab_size=65, rope=True)
DECODE_W, DECODE_S = 128, 4


def fwd_bwd(fn, *inputs):
    def step():
        for x in inputs:
            x.grad = None
        fn(*inputs).sum().backward()

    return step


def bench_window_attention(args, log):
    """The attention alone and a whole attention layer (n_embd 256, 4 heads, with its
    projections), fwd + bwd, float32: windowed (model.windowed_attention, the training
    path) against dense causal SDPA, alternating in one process (medians of 5 repeats, 3 with --quick)."""
    quick = args["quick"]
    lengths = LONG_QUICK if quick else LONG_LENGTHS
    rows = []
    for T in lengths:
        log(f"long context: T={T} ...")
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, LONG_HEADS, T, LONG_HS, requires_grad=True) for _ in range(3))
        with torch.no_grad():  # the windowed path against the explicit one, 64 rows
            rows_ = torch.linspace(0, T - 1, 64).long()
            ref = attention(q[:, :, rows_], k, v, causal_mask(T, T, LONG_W)[rows_])[0]
            err = (windowed_attention(q, k, v, LONG_W)[:, :, rows_] - ref).abs().max().item()
        if err > 1e-5:
            raise BenchError(f"windowed attention at T={T} is {err:.2e} from the explicit path")
        cfg = dict(
            n_embd=LONG_HEADS * LONG_HS,
            n_head=LONG_HEADS,
            block_size=T,
            n_layer=1,
            vocab_size=65,
            rope=True,
        )
        torch.manual_seed(0)
        dense_layer = MultiHeadAttention(GPTConfig(**cfg))
        window_layer = MultiHeadAttention(GPTConfig(**cfg, sliding_window=LONG_W))
        window_layer.load_state_dict(dense_layer.state_dict())
        x = torch.randn(1, T, LONG_HEADS * LONG_HS, requires_grad=True)
        fns = {
            "attention_dense": fwd_bwd(
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v
            ),
            "attention_window": fwd_bwd(
                lambda q, k, v: windowed_attention(q, k, v, LONG_W), q, k, v
            ),
            "layer_dense": fwd_bwd(lambda x: dense_layer(x)[0], x),
            "layer_window": fwd_bwd(lambda x: window_layer(x)[0], x),
        }
        for fn in fns.values():  # warm-up
            fn()
        times = alternate(fns, 3 if quick else 5, 1, "cpu")
        row = dict(
            T=T,
            window=LONG_W,
            max_abs_error=err,
            **{key: median(ts) * 1e3 for key, ts in times.items()},
        )
        row["attention_speedup"] = row["attention_dense"] / row["attention_window"]
        row["layer_speedup"] = row["layer_dense"] / row["layer_window"]
        rows.append(row)
    return rows


def rate(model, prompt, n, window=None, sinks=0):
    """Greedy decoding of n tokens; per tenth of them, (tokens/s over the tenth, tokens/s
    from its median step). The median is what a passing stall of a shared machine moves
    least; a step that does more work (a dense model's slide) does not move it either."""
    stamps = [time.perf_counter()]
    for _ in model.generate_stream(prompt, n, temperature=0, window=window, sinks=sinks):
        stamps.append(time.perf_counter())
    steps, tenth = [b - a for a, b in zip(stamps, stamps[1:])], n // 10
    tenths = [steps[i * tenth : (i + 1) * tenth] for i in range(10)]
    return [len(t) / sum(t) for t in tenths], [1 / median(t) for t in tenths]


def step_ms(models, steps=100):
    """Median ms of one-token decode steps, for each (model, positions cached first), alternating."""
    tok, times, caches = torch.zeros(1, 1, dtype=torch.long), {name: [] for name in models}, {}
    with torch.no_grad():
        for name, (model, filled) in models.items():
            caches[name] = model.make_kv_cache(1)
            model(torch.zeros(1, filled, dtype=torch.long), kv_cache=caches[name])
        for _ in range(steps):
            for name, (model, _) in models.items():
                t0 = time.perf_counter()
                model(tok, kv_cache=caches[name], last_only=True)
                times[name].append(time.perf_counter() - t0)
    return {name: median(t) * 1e3 for name, t in times.items()}


def bench_rolling_cache(args, log):
    """The rolling KV cache of a windowed rope model (6 layers, 384 wide, block 1024,
    W = 128, S = 4, eager, float32) against the same model dense, which slides."""
    quick = args["quick"]
    shape = dict(DECODE_SHAPE, block_size=256) if quick else DECODE_SHAPE
    block = shape["block_size"]
    torch.manual_seed(0)
    dense = GPT(GPTConfig(**shape)).eval()
    window = GPT(GPTConfig(**shape, sliding_window=DECODE_W, sink_tokens=DECODE_S)).eval()
    window.load_state_dict(dense.state_dict())
    prompt = torch.zeros(1, 1, dtype=torch.long)
    n = 20 * block
    log(f"long context: the rolling cache, {n} tokens ...")
    rolling, typical = rate(window, prompt, n)
    # past block_size: the same number of tokens, block_size .. 2 block_size, both models
    log("long context: past block_size, dense (slides) against windowed ...")
    past = torch.zeros(1, block, dtype=torch.long)
    past_rates = {}
    for r in range(3):
        for name, model in (
            (("dense", dense), ("window", window))
            if r % 2 == 0
            else (("window", window), ("dense", dense))
        ):
            past_rates.setdefault(name, []).append(sum(rate(model, past, block)[0]) / 10)
    # what bounds the ratio: a windowed step against the dense model's with as few positions
    # cached, and with as many as past block_size (its slides come on top)
    steps = step_ms(
        {
            "window": (window, block),
            "dense, S + W cached": (dense, DECODE_W + DECODE_S),
            "dense, 3/4 block_size cached": (dense, block * 3 // 4),
        },
        min(100, block // 4),
    )
    dense_bytes, window_bytes = dense.make_kv_cache(1).nbytes, window.make_kv_cache(1).nbytes
    return dict(
        shape=shape,
        window=DECODE_W,
        sinks=DECODE_S,
        tokens=n,
        tokens_per_s_by_tenth=rolling,
        last_over_first=rolling[-1] / rolling[0],
        tokens_per_s_by_tenth_median_step=typical,
        last_over_first_median_step=typical[-1] / typical[0],
        step_ms=steps,
        cache_bytes_window=window_bytes,
        cache_bytes_dense=dense_bytes,
        cache_fraction=window_bytes / dense_bytes,
        expected_fraction=(DECODE_W + DECODE_S) / block,
        past_block_tokens_per_s=dict(
            dense=median(past_rates["dense"]), window=median(past_rates["window"])
        ),
        window_over_dense=median(past_rates["window"]) / median(past_rates["dense"]),
    )


def long_context_tables(attn, roll):
    lines = [
        [
            "T",
            "attention dense ms",
            "attention window ms",
            "speed-up",
            "layer dense ms",
            "layer window ms",
            "speed-up",
        ]
    ]
    for r in attn:
        lines.append(
            [
                str(r["T"]),
                f"{r['attention_dense']:.1f}",
                f"{r['attention_window']:.1f}",
                f"{r['attention_speedup']:.1f}x",
                f"{r['layer_dense']:.1f}",
                f"{r['layer_window']:.1f}",
                f"{r['layer_speedup']:.1f}x",
            ]
        )
    if roll is None:
        return markdown(lines), None
    tenths = " / ".join(f"{x:.0f}" for x in roll["tokens_per_s_by_tenth"])
    typical = " / ".join(f"{x:.0f}" for x in roll["tokens_per_s_by_tenth_median_step"])
    steps = ", ".join(f"{name} {ms:.2f}" for name, ms in roll["step_ms"].items())
    cache = (
        f"- rolling KV cache: {roll['cache_bytes_window']:,} bytes against {roll['cache_bytes_dense']:,} dense "
        f"({roll['cache_fraction']:.4f}; (S + W) / block_size = {roll['expected_fraction']:.4f})\n"
        f"- tokens/s by tenth of a {roll['tokens']}-token greedy generation: {tenths} (from each tenth's "
        f"median step: {typical})\n"
        f"- past block_size: windowed {roll['past_block_tokens_per_s']['window']:.0f} tokens/s, dense (slides "
        f"and recomputes) {roll['past_block_tokens_per_s']['dense']:.0f} tokens/s\n"
        f"- one decode step, median ms: {steps}"
    )
    return markdown(lines), cache


def long_context_targets(attn, roll, quick):
    by_t = {r["T"]: r for r in attn}
    found = []
    if 8192 in by_t:
        x = by_t[8192]["attention_speedup"]
        found.append(
            dict(
                target=f"attention alone, T = 8192, W = {LONG_W}: >= {TARGET_WINDOW_ATTENTION}x dense",
                measured=x,
                met=x >= TARGET_WINDOW_ATTENTION,
            )
        )
    if 16384 in by_t:
        x = by_t[16384]["layer_speedup"]
        found.append(
            dict(
                target=f"attention layer, T = 16384: >= {TARGET_WINDOW_LAYER}x dense",
                measured=x,
                met=x >= TARGET_WINDOW_LAYER,
            )
        )
        x = by_t[16384]["layer_window"] / by_t[8192]["layer_window"]
        found.append(
            dict(
                target=f"windowed layer, T = 16384 / T = 8192: <= {TARGET_WINDOW_LINEAR}x",
                measured=x,
                met=x <= TARGET_WINDOW_LINEAR,
            )
        )
    if roll is None:
        return found
    x = roll["cache_fraction"]
    found.append(
        dict(
            target="rolling cache bytes = (S + W) / block_size of dense",
            measured=x,
            met=abs(x - roll["expected_fraction"]) < 1e-9,
        )
    )
    for key, how in (
        ("last_over_first", ""),
        ("last_over_first_median_step", " (from the median steps)"),
    ):
        x = roll[key]
        found.append(
            dict(
                target=f"rolling cache: last 10% tokens/s >= {TARGET_ROLLING_STEADY} of the first "
                f"10%{how}",
                measured=x,
                met=x >= TARGET_ROLLING_STEADY,
            )
        )
    x = roll["window_over_dense"]
    found.append(
        dict(
            target=f"past block_size: windowed >= {TARGET_ROLLING_VS_SLIDE}x dense tokens/s",
            measured=x,
            met=x >= TARGET_ROLLING_VS_SLIDE,
        )
    )
    if quick:
        for t in found:
            t["met"] = None
    return found


# -----------------------------------------------------------------------------
# Report


def markdown(lines):
    out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
    out += ["| " + " | ".join(line) + " |" for line in lines[1:]]
    return "\n".join(out)


def targets(result):
    """The CPU targets, each with its measured value and whether it is met (None for
    --quick, whose short generations stop well before the full context)."""
    found = []
    train = {r["name"]: r for r in result["train"]}
    if "nanoGPT CPU settings" in train:
        x = train["nanoGPT CPU settings"]["hf_over_ours"]
        found.append(
            dict(
                target=f"training step, nanoGPT CPU settings: >= {TARGET_TRAIN_VS_HF}x "
                "faster than Hugging Face",
                measured=x,
                met=x >= TARGET_TRAIN_VS_HF,
            )
        )
    for r in result["generate"]:
        x, y = r["cache_over_nocache"], r["cache_over_hf"]
        found.append(
            dict(
                target=f"generation batch {r['batch']}: cache >= {TARGET_CACHE_VS_NOCACHE}x "
                "no-cache",
                measured=x,
                met=x >= TARGET_CACHE_VS_NOCACHE,
            )
        )
        found.append(
            dict(
                target=f"generation batch {r['batch']}: cache >= {TARGET_CACHE_VS_HF}x "
                "Hugging Face generate",
                measured=y,
                met=y >= TARGET_CACHE_VS_HF,
            )
        )
        z = r["compiled_over_hf"]
        if z is not None:
            found.append(
                dict(
                    target=f"generation batch {r['batch']}: compiled cache >= "
                    f"{TARGET_CACHE_VS_HF}x Hugging Face generate",
                    measured=z,
                    met=z >= TARGET_CACHE_VS_HF,
                )
            )
    if result["quick"]:
        for t in found:
            t["met"] = None
    return found


def load_average():
    # other processes on the machine slow every contender; this says how busy it was
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(args, log=print):
    device = args["device"]
    if device not in ("cpu", "cuda"):
        raise BenchError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("CUDA is not available here; run with --device=cpu")
    if args["threads"] < 0:
        raise BenchError(f"--threads must be 0 (torch's default) or more, got {args['threads']}")
    folder = os.path.dirname(os.path.abspath(args["out"]))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise BenchError(
            f"cannot write {args['out']}: {folder} is not a writable folder; "
            "pass --out=PATH somewhere writable"
        )
    try:
        import transformers
    except ImportError:
        raise BenchError(
            "bench.py compares against Hugging Face GPT-2: "
            "pip install transformers (see requirements-dev.txt)"
        ) from None
    transformers.logging.set_verbosity_error()
    if device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for every contender alike
    if args["threads"]:
        torch.set_num_threads(args["threads"])

    gpu = device == "cuda"
    result = dict(
        device=dict(type=device, name=device_name(device), threads=torch.get_num_threads()),
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command=" ".join(["python", "bench.py"] + sys.argv[1:]),
        quick=args["quick"],
        notes=[
            "Hugging Face GPT2LMHeadModel runs with attn_implementation='sdpa', its fastest "
            "attention; 'HF' uses activation gelu_new as GPT-2's config does, 'HF fused-GELU' "
            "uses gelu_pytorch_tanh (same function, PyTorch's fused kernel)",
            "both models hold the same weights (converted from ours) and dropout 0",
            "medians of alternating repeats; on CUDA, training runs under bf16 autocast, "
            "generation with bf16 weights and attention in bf16, for every contender alike",
        ],
    )
    result["load_average_before"] = load_average()
    t0 = time.perf_counter()
    if args["recipes"]:
        if gpu:
            raise BenchError("--recipes compares CPU training recipes; drop --device=cuda")
        result["recipes"] = bench_recipes(log, nanogpt=args["nanogpt"])
        result["targets"] = recipe_targets(result["recipes"])
        result["seconds"], result["load_average_after"] = time.perf_counter() - t0, load_average()
        result["markdown"] = (
            header_lines(result, device)
            + "\n\n## Training to the target loss\n\n"
            + recipes_table(result["recipes"])
            + "\n\n"
            + targets_list(result["targets"])
        )
        return result
    if args["long_context"]:
        part = args["long_context_part"]
        if part not in ("all", "attention", "cache"):
            raise BenchError(f"--long_context_part is all, attention or cache, not {part!r}")
        if gpu:
            raise BenchError("--long_context measures the CPU path; drop --device=cuda")
        attn = bench_window_attention(args, log) if part in ("all", "attention") else []
        roll = bench_rolling_cache(args, log) if part in ("all", "cache") else None
        result["long_context"], result["rolling_cache"] = attn, roll
        result["targets"] = long_context_targets(attn, roll, args["quick"])
        result["seconds"], result["load_average_after"] = time.perf_counter() - t0, load_average()
        table, cache = long_context_tables(attn, roll)
        result["markdown"] = "\n\n".join(
            [header_lines(result, device)]
            + (
                [
                    f"## Sliding window W = {LONG_W} against dense causal, fwd + bwd, float32 ({LONG_HEADS} heads of "
                    f"{LONG_HS}; layer: n_embd {LONG_HEADS * LONG_HS} with its projections)\n\n"
                    + table
                ]
                if attn
                else []
            )
            + (
                [
                    "## Rolling KV cache (6 layers, 384 wide, block 1024, W = 128, S = 4, eager)\n\n"
                    + cache
                ]
                if roll
                else []
            )
            + [targets_list(result["targets"])]
        )
        return result
    result["train"] = bench_train(args, log)
    result["generate"] = bench_generate(args, log)
    result["attention"] = bench_attention(args, log)
    result["decode_bandwidth"] = bench_decode_bandwidth(args, log) if gpu else None
    result["targets"] = targets(result) if not gpu else []
    result["seconds"] = time.perf_counter() - t0
    result["load_average_after"] = load_average()

    tables = [
        "## Training step (forward, backward, AdamW)\n\n" + train_table(result["train"], gpu),
        "## Generation (greedy, 1-token prompt, baby model)\n\n"
        + generate_table(result["generate"], gpu),
        "## Attention alone (B=1, 12 heads, head size 64, causal, forward)\n\n"
        + attention_table(result["attention"], gpu),
    ]
    if result["decode_bandwidth"]:
        tables.append(
            "## Decoding GPT-2 124M, batch 1, bf16\n\n"
            + decode_bandwidth_table(result["decode_bandwidth"])
        )
    if result["targets"]:
        tables.append(targets_list(result["targets"]))
    result["markdown"] = header_lines(result, device) + "\n\n" + "\n\n".join(tables)
    return result


def header_lines(result, device):
    return (
        f"{result['device']['name']} ({device}, {result['device']['threads']} threads), "
        f"torch {result['torch']}, transformers {result['transformers']}, {result['date']}\n"
        f"command: {result['command']}\n"
        f"load average (1 min) before / after: {result['load_average_before']} / "
        f"{result['load_average_after']}"
    )


def targets_list(targets):
    return "## Targets\n\n" + "\n".join(
        f"- {t['target']}: {t['measured']:.2f}x, {_verdict(t['met'])}" for t in targets
    )


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\n\noptions:\n" + describe(DEFAULTS))
        return 0
    try:
        args = parse_args(DEFAULTS, argv, allow_files=False)
        start = time.perf_counter()
        result = run(
            args,
            log=lambda msg: print(
                f"[{time.perf_counter() - start:5.0f} s] {msg}", file=sys.stderr, flush=True
            ),
        )
    except (ConfigError, BenchError) as e:
        print(f"bench.py: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except torch.OutOfMemoryError:
        print("bench.py: out of GPU memory; free the GPU or run with --quick", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench.py: interrupted; nothing written", file=sys.stderr)
        return 130
    print(result["markdown"])
    try:
        tmp = args["out"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args["out"])
    except OSError as e:
        print(
            f"bench.py: cannot write {args['out']} ({e.strerror}); pass --out=PATH "
            "somewhere writable",
            file=sys.stderr,
        )
        return 1
    print(f"\nwrote {args['out']} ({result['seconds']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
