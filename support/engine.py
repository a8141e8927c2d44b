"""
The generation engine: GPT.decode_step compiled, for model.generate(..., decoder=...).

The model (model.py) keeps the sampling loop and a fixed-shape decode step; this file
compiles that step once per model, batch size, device and dtype, keeps it, and rebuilds it
when a weight changes. sample.py and the benchmarks decode through it.

    from support.engine import compiled_decoder, generate_compiled
    out = generate_compiled(model, idx, 200, temperature=0.0)
    step, cache = compiled_decoder(model, batch_size=1)
    out = model.generate(idx, 200, decoder=(step, cache))
"""

import torch

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
            "decode this linear-attention model eagerly (decoder=None)"
        )
    if model.config.sliding_window is not None:
        raise ValueError(
            "compiled decoding runs full attention, not a sliding window; "
            "decode this model eagerly (decoder=None)"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"compiled decoding runs full attention on CPU or CUDA, not {device.type}; "
            "decode eagerly (decoder=None)"
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
        # (logits (B, 1, vocab), no loss), as forward gives
        return logits[:, None], None

    return step


def frozen_step(model, cache):
    """decode_step compiled with max-autotune and the weights frozen in (CPU, or CUDA
    without graphs)."""
    compiled = torch.compile(model.decode_step, mode="max-autotune-no-cudagraphs", fullgraph=True)

    def step(token):
        token = fresh_token(token)
        with torch._inductor.config.patch(FROZEN):
            logits = compiled(token, cache.at, cache)  # (B, vocab)
        cache.advance(1)
        return logits[:, None], None

    return step


def weight_versions(model):
    """Each parameter's in-place write counter: a frozen step is stale once one moves."""
    return tuple(p._version for p in model.parameters())


def compiled_decoder(model, batch_size, cuda_graphs=None):
    """(step, cache): the model's decode step compiled, with its zeroed KVCache. step(token
    (B, 1)) returns what forward would and advances the cache. Built once per model, batch
    size, device, dtype and cuda_graphs, and kept; cuda_graphs (default: on CUDA) records a
    CUDA graph, else the weights are frozen in and changing one rebuilds the step."""
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
    cache = model.make_kv_cache(batch_size, zero=True)
    if cuda_graphs:
        step = cuda_graph_step(model, cache)
    else:
        step = frozen_step(model, cache)
    model.compiled_decoders[key] = (step, cache, version)
    return step, cache


def generate_compiled(model, idx, max_new_tokens, **sampling_kwargs):
    """model.generate with each new token through the compiled step: the same greedy
    tokens as eager decoding in float32. sampling_kwargs: generate's (temperature, top_k,
    top_p, generator)."""
    decoder = compiled_decoder(model, idx.size(0))
    return model.generate(idx, max_new_tokens, decoder=decoder, **sampling_kwargs)
