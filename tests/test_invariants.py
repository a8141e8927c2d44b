"""What any causal attention must keep, whatever its formula: the tests to run after an
edit to model.py. python -m pytest -n 0 tests/test_invariants.py: 44 tests in about 5 s
on two cores of an Intel Xeon, 14 s with pytest's start (-n 0: workers would each start
torch).

Each runs on both paths that train: the fused kernel (fused=True, the default) and
attention() with causal_mask() as written (fused=False), the only path an edit inside
those two functions reaches. On each, for the model's configurations:
  - causality: a token changes no logit before its own position;
  - the cache: decoding a token at a time, or a chunk at a time, through the KV cache
    gives the full forward's logits; so does the fixed-shape decode step of
    sample.py --compile, on fused=False (it runs attention() as written on either path,
    so on a fused model it is the fused kernel against attention(): tests/test_model.py's
    stock-formula test);
  - the batch: each sequence's logits are its own, whatever the others are;
  - the heads: a head's W_Q, W_K and W_V change its own slice of what W_O reads and no
    other head's (the heads are independent, and concatenated in order).

A legitimate change of the formula (ALiBi, scores / d instead of / sqrt(d)) keeps them
all on the path it trains; a leak of the future, or heads or sequences that mix, fail
the one they break (tests/test_invariants_mutants.py makes such edits and checks each
verdict). The tests marked stock_formula elsewhere check softmax(Q K^T / sqrt(d)) V
itself, or a copy of it (the fused kernel against attention() as written, worked
numbers, the exports): an edit to attention() is expected to fail those.

Where an edit meets a place it does not reach, these tests say so. attention() receives
no positions: it sees the keys in position order with its queries the last of them,
except in a sliding window's rolling cache (keys in slot order: ALiBi written inside
attention() fails the cache test there) and in the decode step (the whole buffer, the
positions past the query masked by a mask of its own: a window written into
causal_mask() fails the decode-step test). And a fused model's chunk after cached
positions takes its mask from causal_mask(), where its full forward does not.

Imports only model.py, torch and pytest, so that it runs against any copy of model.py.
"""

import pytest
import torch

import model

# a tiny model: 2 layers, 4 heads of size 8, a context of 16
SIZES = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
# the configurations that train: GPTConfig's defaults (GPT-2's architecture), the
# recipes' (config/shakespeare.py: rotary, QK-norm, ReLU², no biases), grouped-query
# attention, KV shifting, and a sliding window (its rolling cache when decoding)
CONFIGS = {
    "gpt2": dict(),
    "recipe": dict(rope=True, qk_norm=True, activation="relu2", bias=False),
    "grouped-query": dict(n_kv_head=2, rope=True, qk_norm=True, qk_gain=True),
    "kv shift": dict(kv_shift=True, n_kv_head=2, rope=True, qk_norm=True),
    "sliding window": dict(sliding_window=5, rope=True),
}
# fused=True: the kernel; fused=False: attention() and causal_mask() as written
PATHS = {"fused=True": True, "fused=False": False}
EDIT = "(an edit to attention() or causal_mask() trains only with fused=False)"


def build(module, fused, options, seed=0):
    """A model of module (model.py or a copy of it) with every parameter moved off its
    initial value: attention far from uniform, every gain, bias and mixing weight at work."""
    torch.manual_seed(seed)
    gpt = module.GPT(module.GPTConfig(**SIZES, **options, fused=fused))
    with torch.no_grad():
        for p in gpt.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
            else:
                p.add_(0.3 * torch.randn_like(p))
    return gpt.eval()


def tokens(batch, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, SIZES["vocab_size"], (batch, SIZES["block_size"]), generator=generator)


def logits_as_trained(gpt, idx):
    """The training forward: train mode, gradients on (dropout is 0, so it is deterministic)."""
    gpt.train()
    with torch.enable_grad():
        logits, _ = gpt(idx, torch.zeros_like(idx))
    gpt.eval()
    return logits.detach()


def check_causal(gpt):
    idx = tokens(2)
    T = idx.size(1)
    before = logits_as_trained(gpt, idx)
    for t in range(T - 1):
        changed = idx.clone()
        # every token after t replaced by another
        changed[:, t + 1 :] = (idx[:, t + 1 :] + 1) % SIZES["vocab_size"]
        after = logits_as_trained(gpt, changed)
        leak = (after[:, : t + 1] - before[:, : t + 1]).abs().max().item()
        assert leak <= 1e-6, (
            f"the tokens after position {t} changed the logits at or before it by {leak:.3g}: "
            f"a query sees later keys {EDIT}"
        )
        assert not torch.allclose(after[:, t + 1], before[:, t + 1])  # the change is seen


@torch.no_grad()
def check_cache(gpt):
    idx = tokens(2)
    full, _ = gpt(idx)
    cache = gpt.make_kv_cache(2)
    steps = [gpt(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(idx.size(1))]
    gap = (torch.cat(steps, dim=1) - full).abs().max().item()
    assert gap <= 1e-5, (
        f"decoding a token at a time ({type(cache).__name__}) differs from the full forward "
        f"by {gap:.3g}: the cached keys and values, or their mask, are not what the full "
        f"forward attends to {EDIT}"
    )
    cache.reset()
    chunks = [gpt(idx[:, a:b], kv_cache=cache)[0] for a, b in ((0, 5), (5, 11), (11, 16))]
    gap = (torch.cat(chunks, dim=1) - full).abs().max().item()
    assert gap <= 1e-5, (
        f"a chunk after cached positions differs from the full forward by {gap:.3g}: its "
        f"queries are the last of the keys (causal_mask(T, Tk)) {EDIT}"
    )


@torch.no_grad()
def check_decode_step(gpt):
    idx = tokens(2)
    full, _ = gpt(idx)
    cache = gpt.make_kv_cache(2, zero=True)
    gpt(idx[:, :5], kv_cache=cache)  # the prompt, as sample.py prefills it
    steps = [gpt.decode_step(idx[:, t : t + 1], torch.tensor([t]), cache) for t in range(5, 16)]
    gap = (torch.stack(steps, dim=1) - full[:, 5:]).abs().max().item()
    assert gap <= 1e-5, (
        f"the fixed-shape decode step (sample.py --compile) differs from the full forward by "
        f"{gap:.3g}. It runs attention() over the whole cache with the positions past the "
        f"query masked: its query is not the last key, and its mask does not come from "
        f"causal_mask()"
    )


@torch.no_grad()
def check_batch(gpt):
    idx = tokens(4)
    together, _ = gpt(idx)
    for b in range(idx.size(0)):
        alone, _ = gpt(idx[b : b + 1])
        gap = (alone[0] - together[b]).abs().max().item()
        assert gap <= 1e-5, f"sequence {b} alone differs from it in a batch by {gap:.3g} {EDIT}"
    order = torch.tensor([2, 0, 3, 1])
    shuffled, _ = gpt(idx[order])
    torch.testing.assert_close(shuffled, together[order], rtol=0, atol=1e-5)


def head_outputs(gpt, idx, layer):
    """What W_O (attn.c_proj) reads in a layer: the heads' outputs side by side (B, T, C)."""
    seen = []
    c_proj = gpt.transformer.h[layer].attn.c_proj
    handle = c_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        gpt(idx)
    finally:
        handle.remove()
    return seen[0]


@torch.no_grad()
def check_heads(gpt):
    c = gpt.config
    hs = c.n_embd // c.n_head
    group = c.n_head // c.n_kv_head
    idx = tokens(2)
    for layer in range(c.n_layer):
        attn = gpt.transformer.h[layer].attn
        before = head_outputs(gpt, idx, layer)
        # c_attn's rows: every query head's W_Q, then every key/value head's W_K, then W_V
        starts = {"W_Q": 0, "W_K": c.n_embd, "W_V": c.n_embd + c.n_kv_head * hs}
        for name, start in starts.items():
            n = c.n_head if name == "W_Q" else c.n_kv_head
            for h in range(n):
                rows = slice(start + h * hs, start + (h + 1) * hs)
                # the query heads that read it: itself, or a key/value head's group
                readers = [h] if name == "W_Q" else list(range(h * group, (h + 1) * group))
                saved = attn.c_attn.weight[rows].clone()
                attn.c_attn.weight[rows] += torch.randn_like(saved)
                after = head_outputs(gpt, idx, layer)
                attn.c_attn.weight[rows] = saved
                change = (after - before).abs().amax(dim=(0, 1)).view(c.n_head, hs).amax(-1)
                for head in range(c.n_head):
                    if head in readers:
                        assert change[head] > 1e-3, (
                            f"layer {layer}: head {head}'s slice of W_O's input did not change "
                            f"with its {name} {EDIT}"
                        )
                    else:
                        assert change[head] <= 1e-6, (
                            f"layer {layer}: {name} of head {h} changed head {head}'s slice of "
                            f"W_O's input by {change[head]:.3g}: the heads mix {EDIT}"
                        )


# ---------------------------------------------------------------------------
# the tests: every check on both paths, for every configuration


@pytest.fixture(params=list(PATHS), ids=list(PATHS))
def fused(request):
    return PATHS[request.param]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_future_token_changes_no_past_logit(fused, config):
    check_causal(build(model, fused, CONFIGS[config]))


@pytest.mark.parametrize("config", list(CONFIGS))
def test_cached_decoding_equals_the_full_forward(fused, config):
    check_cache(build(model, fused, CONFIGS[config]))


# sample.py --compile decodes a full-attention cache only (a window is refused there)
@pytest.mark.parametrize("config", [name for name in CONFIGS if name != "sliding window"])
def test_the_decode_step_equals_the_full_forward(config):
    check_decode_step(build(model, False, CONFIGS[config]))


@pytest.mark.parametrize("config", list(CONFIGS))
def test_each_sequence_of_a_batch_is_independent(fused, config):
    check_batch(build(model, fused, CONFIGS[config]))


@pytest.mark.parametrize("config", list(CONFIGS))
def test_the_heads_are_independent_and_concatenated(fused, config):
    check_heads(build(model, fused, CONFIGS[config]))
