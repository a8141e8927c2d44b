"""
Long context, on the CPU: sliding-window attention (W = 256, float32) against
dense causal attention, the attention alone and a whole attention layer, fwd +
bwd, T = 1024 .. 16384; then the rolling KV cache: its bytes, its tokens/s early
and late in a 20 x block_size generation, and against a dense model that slides
and recomputes past block_size (--long_context_part=attention or =cache: that
half alone).

    python -m bench.long_context [--quick] [--long_context_part=all|attention|cache]
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import time
from statistics import median

import torch
import torch.nn.functional as F

from bench import common
from model import GPT, GPTConfig, MultiHeadAttention, attention, causal_mask, windowed_attention
from support import engine


@dataclasses.dataclass
class Settings(common.Settings):
    long_context_part: str = "all"  # all, attention or cache


# Targets (issue: long context); the window and shapes they were set for
TARGET_WINDOW_ATTENTION = 4.0  # attention alone, fwd + bwd, T = 8192: dense ms / windowed ms
TARGET_WINDOW_LAYER = 5.0  # one attention layer, fwd + bwd, T = 16384: dense / windowed
TARGET_WINDOW_LINEAR = 2.3  # windowed layer: ms at T = 16384 / ms at T = 8192, at most
# tokens/s over the last 10% of a 20 x block_size generation / first 10%
TARGET_ROLLING_STEADY = 0.85
# past block_size: windowed tokens/s / dense (slide and recompute) tokens/s
TARGET_ROLLING_VS_SLIDE = 1.3
LONG_W = 256
LONG_HEADS = 4
LONG_HS = 64
LONG_LENGTHS = [1024, 2048, 4096, 8192, 16384]
LONG_QUICK = [1024, 2048, 4096]
DECODE_SHAPE = dict(n_layer=6, n_head=6, n_embd=384, block_size=1024, vocab_size=65, rope=True)
DECODE_W = 128
DECODE_S = 4


def fwd_bwd(fn, *inputs):
    """One forward and backward of fn as a callable, for alternate()."""

    def step():
        for x in inputs:
            x.grad = None
        fn(*inputs).sum().backward()

    return step


def dense_attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def window_attention(q, k, v):
    return windowed_attention(q, k, v, LONG_W)


def layer_output(layer):
    """The layer's output alone: attention layers also return what they cache."""

    def forward(x):
        return layer(x)[0]

    return forward


def check_window(q, k, v, T):
    """The windowed path against the explicit one with a window mask, 64 rows:
    the largest difference."""
    with torch.no_grad():
        rows = torch.linspace(0, T - 1, 64).long()
        ref = attention(q[:, :, rows], k, v, causal_mask(T, T, LONG_W)[rows])[0]
        err = (windowed_attention(q, k, v, LONG_W)[:, :, rows] - ref).abs().max().item()
    if err > 1e-5:
        raise common.BenchError(f"windowed attention at T={T} is {err:.2e} from the explicit path")
    return err


def bench_window_attention(args, log):
    """The attention alone and a whole attention layer (n_embd 256, 4 heads, with its
    projections), fwd + bwd, float32: windowed (model.windowed_attention, the training
    path) against dense causal SDPA, alternating in one process (medians of 5
    repeats, 3 with --quick)."""
    lengths = LONG_LENGTHS
    repeats = 5
    if args.quick:
        lengths = LONG_QUICK
        repeats = 3
    rows = []
    for T in lengths:
        log(f"long context: T={T} ...")
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, LONG_HEADS, T, LONG_HS, requires_grad=True) for _ in range(3))
        err = check_window(q, k, v, T)
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
            "attention_dense": fwd_bwd(dense_attention, q, k, v),
            "attention_window": fwd_bwd(window_attention, q, k, v),
            "layer_dense": fwd_bwd(layer_output(dense_layer), x),
            "layer_window": fwd_bwd(layer_output(window_layer), x),
        }
        for fn in fns.values():  # warm-up
            fn()
        times = common.alternate(fns, repeats, 1, "cpu")
        row = dict(T=T, window=LONG_W, max_abs_error=err)
        for key, ts in times.items():
            row[key] = median(ts) * 1e3
        row["attention_speedup"] = row["attention_dense"] / row["attention_window"]
        row["layer_speedup"] = row["layer_dense"] / row["layer_window"]
        rows.append(row)
    return rows


def rate(model, prompt, n, window=None, sinks=0):
    """Greedy decoding of n tokens; per tenth of them, (tokens/s over the tenth, tokens/s
    from its median step). The median is what a passing stall of a shared machine moves
    least; a step that does more work (a dense model's slide) does not move it either."""
    stamps = [time.perf_counter()]
    for _ in engine.stream(model, prompt, n, temperature=0, window=window, sinks=sinks):
        stamps.append(time.perf_counter())
    steps = [b - a for a, b in zip(stamps, stamps[1:])]
    tenth = n // 10
    tenths = [steps[i * tenth : (i + 1) * tenth] for i in range(10)]
    return [len(t) / sum(t) for t in tenths], [1 / median(t) for t in tenths]


def step_ms(models, steps=100):
    """Median ms of one-token decode steps, for each (model, positions cached first),
    alternating."""
    tok = torch.zeros(1, 1, dtype=torch.long)
    times = {name: [] for name in models}
    caches = {}
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


def past_block_rates(dense, window, block):
    """tokens/s of each model decoding block_size tokens past a block_size prompt,
    three runs, alternating which goes first."""
    past = torch.zeros(1, block, dtype=torch.long)
    past_rates = {"dense": [], "window": []}
    for r in range(3):
        order = [("dense", dense), ("window", window)]
        if r % 2:
            order.reverse()
        for name, model in order:
            past_rates[name].append(sum(rate(model, past, block)[0]) / 10)
    return past_rates


def bench_rolling_cache(args, log):
    """The rolling KV cache of a windowed rope model (6 layers, 384 wide, block 1024,
    W = 128, S = 4, eager, float32) against the same model dense, which slides."""
    shape = DECODE_SHAPE
    if args.quick:
        shape = dict(DECODE_SHAPE, block_size=256)
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
    past_rates = past_block_rates(dense, window, block)
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
    dense_bytes = dense.make_kv_cache(1).nbytes
    window_bytes = window.make_kv_cache(1).nbytes
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
    """The window's table, and the rolling cache's figures as a list (None without them)."""
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
        return common.markdown(lines), None
    tenths = " / ".join(f"{x:.0f}" for x in roll["tokens_per_s_by_tenth"])
    typical = " / ".join(f"{x:.0f}" for x in roll["tokens_per_s_by_tenth_median_step"])
    steps = ", ".join(f"{name} {ms:.2f}" for name, ms in roll["step_ms"].items())
    past = roll["past_block_tokens_per_s"]
    cache = (
        f"- rolling KV cache: {roll['cache_bytes_window']:,} bytes against "
        f"{roll['cache_bytes_dense']:,} dense ({roll['cache_fraction']:.4f}; "
        f"(S + W) / block_size = {roll['expected_fraction']:.4f})\n"
        f"- tokens/s by tenth of a {roll['tokens']}-token greedy generation: {tenths} "
        f"(from each tenth's median step: {typical})\n"
        f"- past block_size: windowed {past['window']:.0f} tokens/s, dense (slides "
        f"and recomputes) {past['dense']:.0f} tokens/s\n"
        f"- one decode step, median ms: {steps}"
    )
    return common.markdown(lines), cache


def long_context_targets(attn, roll, quick):
    by_t = {r["T"]: r for r in attn}
    found = []
    if 8192 in by_t:
        x = by_t[8192]["attention_speedup"]
        text = f"attention alone, T = 8192, W = {LONG_W}: >= {TARGET_WINDOW_ATTENTION}x dense"
        found.append(common.target(text, x, x >= TARGET_WINDOW_ATTENTION, quick))
    if 16384 in by_t:
        x = by_t[16384]["layer_speedup"]
        text = f"attention layer, T = 16384: >= {TARGET_WINDOW_LAYER}x dense"
        found.append(common.target(text, x, x >= TARGET_WINDOW_LAYER, quick))
        x = by_t[16384]["layer_window"] / by_t[8192]["layer_window"]
        text = f"windowed layer, T = 16384 / T = 8192: <= {TARGET_WINDOW_LINEAR}x"
        found.append(common.target(text, x, x <= TARGET_WINDOW_LINEAR, quick))
    if roll is not None:
        x = roll["cache_fraction"]
        text = "rolling cache bytes = (S + W) / block_size of dense"
        exact = abs(x - roll["expected_fraction"]) < 1e-9
        found.append(common.target(text, x, exact, quick))
        for key, how in (
            ("last_over_first", ""),
            ("last_over_first_median_step", " (from the median steps)"),
        ):
            x = roll[key]
            text = (
                f"rolling cache: last 10% tokens/s >= {TARGET_ROLLING_STEADY} of the first 10%{how}"
            )
            found.append(common.target(text, x, x >= TARGET_ROLLING_STEADY, quick))
        x = roll["window_over_dense"]
        text = f"past block_size: windowed >= {TARGET_ROLLING_VS_SLIDE}x dense tokens/s"
        found.append(common.target(text, x, x >= TARGET_ROLLING_VS_SLIDE, quick))
    return found


def section(args, log):
    """The figures, the tables and the targets, for common.run."""
    part = args.long_context_part
    if part not in ("all", "attention", "cache"):
        raise common.ConfigError(f"--long_context_part is all, attention or cache, not {part!r}")
    if args.device == "cuda":
        raise common.ConfigError("--long_context measures the CPU path; drop --device=cuda")
    attn = []
    if part in ("all", "attention"):
        attn = bench_window_attention(args, log)
    roll = None
    if part in ("all", "cache"):
        roll = bench_rolling_cache(args, log)
    table, cache = long_context_tables(attn, roll)
    tables = []
    if attn:
        tables.append(
            f"## Sliding window W = {LONG_W} against dense causal, fwd + bwd, float32 "
            f"({LONG_HEADS} heads of {LONG_HS}; layer: n_embd {LONG_HEADS * LONG_HS} with "
            "its projections)\n\n" + table
        )
    if roll:
        tables.append(
            "## Rolling KV cache (6 layers, 384 wide, block 1024, W = 128, S = 4, "
            "eager)\n\n" + cache
        )
    found = long_context_targets(attn, roll, args.quick)
    return dict(long_context=attn, rolling_cache=roll), tables, found


def sections(args):
    return [section]


if __name__ == "__main__":
    sys.exit(common.main("bench.long_context", __doc__, Settings, sections, sys.argv[1:]))
