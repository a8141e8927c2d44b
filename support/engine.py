"""
The generation engine: model.generate's loop with every option, written once.

GPT.generate (model.py) is the plain cached sampling loop. stream() here is the same loop
for the commands: it yields each token as it comes, and takes the options a command
needs (Sampling: top-p, a seeded generator, no cache, StreamingLLM's window, the
compiled decode step, attention maps). The compiled step is GPT.decode_step compiled
once per model, batch size, device and dtype, kept, and rebuilt when a weight changes.
sample.py, the explorer and the benchmarks decode through it.

    from support import engine
    out = engine.generate(model, idx, 200, temperature=0.0, compiled=True)
    for token, maps, start in engine.stream(model, idx, 200, top_p=0.9, attention=True):
        ...
"""

import warnings
from dataclasses import dataclass

import torch

from model import StreamingKVCache, sample_next
from support.device import pin_cpu_vector_width

# read by inductor when it compiles, at the first call: the weights frozen in as constants,
# so max-autotune writes its own matrix-vector kernels; autotuning kept quiet
FROZEN = dict(
    freezing=True,
    autotune_num_choices_displayed=0,
    max_autotune_report_choices_stats=False,
)


def check_compilable(model, device):
    """The models and devices the compiled step serves, else one line saying what to do."""
    if model.config.attention != "softmax":
        raise ValueError(
            "compiled decoding runs softmax attention through the full KV cache; "
            "decode this linear-attention model eagerly (compiled=False)"
        )
    if model.config.sliding_window is not None:
        raise ValueError(
            "compiled decoding runs full attention, not a sliding window; "
            "decode this model eagerly (compiled=False)"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"compiled decoding runs full attention on CPU or CUDA, not {device.type}; "
            "decode eagerly (compiled=False)"
        )


def fresh_token(token):
    """A contiguous (B, 1) copy: a view into idx would change strides every step."""
    return token.clone(memory_format=torch.contiguous_format)


def cuda_graph_step(model, cache):
    """decode_step recorded as a CUDA graph that writes the cache in place: the buffers are
    static addresses, so only the token is copied in at each replay."""
    for t in cache.k + cache.v + [cache.at]:
        torch._dynamo.mark_static_address(t)
    compiled = torch.compile(model.decode_step, mode="reduce-overhead", fullgraph=True)

    def step(token):
        token = fresh_token(token)
        # the last step's logits are used up: the graph may write over them
        torch.compiler.cudagraph_mark_step_begin()
        logits = compiled(token, cache.at, cache)  # (B, vocab)
        cache.advance(1)
        return logits[:, None]  # (B, 1, vocab), as forward gives

    return step


def frozen_step(model, cache):
    """decode_step compiled with max-autotune and the weights frozen in (CPU, or CUDA
    without graphs)."""
    compiled = torch.compile(model.decode_step, mode="max-autotune-no-cudagraphs", fullgraph=True)

    def step(token):
        token = fresh_token(token)
        with torch._inductor.config.patch(FROZEN), warnings.catch_warnings():
            # max-autotune's C++ templates call a deprecated storage API inside
            # inductor: a warning about torch's own code, nothing a user can change
            warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
            logits = compiled(token, cache.at, cache)  # (B, vocab)
        cache.advance(1)
        return logits[:, None]  # (B, 1, vocab)

    return step


def weight_versions(model):
    """Each parameter's in-place write counter: a frozen step is stale once one moves."""
    return tuple(p._version for p in model.parameters())


def compiled_decoder(model, batch_size, cuda_graphs=None):
    """(step, cache): the model's decode step compiled, with its zeroed KVCache. step(token
    (B, 1)) returns the logits (B, 1, vocab) forward would and advances the cache. Built
    once per model, batch size, device, dtype and cuda_graphs, and kept; cuda_graphs
    (default: on CUDA) records a CUDA graph, else the weights are frozen in and changing
    one rebuilds the step."""
    weight = model.transformer.wte.weight
    check_compilable(model, weight.device)
    if cuda_graphs is None:
        cuda_graphs = weight.device.type == "cuda"
    key = (batch_size, weight.device, weight.dtype, cuda_graphs)
    version = None
    if not cuda_graphs:
        version = weight_versions(model)
    # kept on the model, so that they go when it goes
    if not hasattr(model, "compiled_decoders"):
        model.compiled_decoders = {}
    kept = model.compiled_decoders.get(key)
    if kept is not None and kept[2] == version:
        return kept[0], kept[1]
    if weight.device.type == "cpu":
        pin_cpu_vector_width()
    cache = model.make_kv_cache(batch_size, zero=True)
    if cuda_graphs:
        step = cuda_graph_step(model, cache)
    else:
        step = frozen_step(model, cache)
    model.compiled_decoders[key] = (step, cache, version)
    return step, cache


@dataclass
class Sampling:
    """How generation picks each token and what it runs the tokens through: the options of
    stream() and generate(), in one place. The defaults are model.generate's loop."""

    temperature: float = 1.0  # 0: greedy
    top_k: int | None = None  # sample among the k most likely tokens
    top_p: float | None = None  # nucleus: the fewest most likely tokens reaching p
    generator: torch.Generator | None = None  # seeded: the same samples again
    use_cache: bool = True  # False: the whole window through the model for every token
    window: int | None = None  # StreamingLLM's cache: `sinks` first tokens and a window
    sinks: int = 0
    compiled: bool = False  # each new token through the compiled decode step
    attention: bool = False  # each step yields its forward's attention maps

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        eager_only = self.attention or not self.use_cache or self.window is not None
        if self.compiled and (eager_only or self.sinks):
            raise ValueError(
                "a compiled decoder decodes through the full KV cache, without attention maps "
                "or a window; pass compiled=False for those"
            )


def forward(model, idx, cache, attention):
    """The logits (B, T or 1, vocab) of idx through the cache, and with attention, the maps."""
    if attention:
        return model.attention_maps(idx, kv_cache=cache)
    logits, _ = model(idx, kv_cache=cache, last_only=True)
    return logits, None


@torch.no_grad()
def stream(model, idx, max_new_tokens, **options):
    """Yield (next_token (B, 1), maps, window_start) for each new token; options: Sampling's.

    The window (the prompt's last block_size tokens, or what is left after a slide) goes
    through the model in one forward that fills the cache; then only the newest token
    does (compiled: through the compiled step). maps (with attention): the per-layer
    weights of the forward that gave this token, over idx[:, window_start:]: (B, nh, T, T)
    maps, then one (B, nh, 1, Tk) row per step (a rolling cache's: by slot)."""
    s = Sampling(**options)
    if idx.size(1) < 1:
        raise ValueError("generation needs at least one prompt token")
    cache = None
    if s.use_cache:
        cache = model.make_kv_cache(idx.size(0), window=s.window, sinks=s.sinks)
    step = None
    if s.compiled:
        step, cache = compiled_decoder(model, idx.size(0))
    # StreamingLLM's cache never slides: it takes the last S + W tokens, all it has places for
    streaming = isinstance(cache, StreamingKVCache)
    keep = model.config.context
    if streaming:
        keep = cache.block_size
    start = max(0, idx.size(1) - keep)
    fresh = True
    for _ in range(max_new_tokens):
        new_start = start
        if not streaming:
            new_start = model.context_start(idx.size(1), start)
        if cache is None or fresh or new_start != start:
            # the whole window in one forward: the prompt, after a slide, or without a cache
            start = new_start
            fresh = False
            if cache is not None:
                cache.reset()
            logits, maps = forward(model, idx[:, start:], cache, s.attention)
        elif step is not None:
            logits = step(idx[:, -1:])
            maps = None
        else:
            logits, maps = forward(model, idx[:, -1:], cache, s.attention)
        token = sample_next(logits[:, -1], s.temperature, s.top_k, s.top_p, s.generator)
        idx = torch.cat((idx, token), dim=1)
        yield token, maps, start


def generate(model, idx, max_new_tokens, **options):
    """idx (B, T) with max_new_tokens tokens appended, as model.generate, with Sampling's
    options: use_cache=False (the whole window every step, the same slides) and the
    compiled step (in float32) give model.generate's greedy tokens."""
    new_tokens = [token for token, _, _ in stream(model, idx, max_new_tokens, **options)]
    return torch.cat([idx] + new_tokens, dim=1)


def generate_compiled(model, idx, max_new_tokens, **options):
    """generate with each new token through the compiled step."""
    return generate(model, idx, max_new_tokens, compiled=True, **options)
