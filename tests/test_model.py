"""model.py against independent oracles: worked numbers from the attention
literature, PyTorch's scaled_dot_product_attention, and Hugging Face GPT-2."""

import ast
import copy
import dataclasses
import math
import os
import re
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from model import (
    GPT,
    GPTConfig,
    Head,
    KVCache,
    MultiHeadAttention,
    attention,
    causal_mask,
    sample_next,
)
from support import engine
from support.engine import compiled_decoder, generate_compiled
from support.loading import from_checkpoint
from support.mfu import estimate_mfu
from support.optim import configure_optimizers


def tiny_config(**kw):
    args = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
    args.update(kw)
    return GPTConfig(**args)


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(tiny_config(**kw)).eval()


# ---------------------------------------------------------------------------
# attention and the causal mask


@pytest.mark.stock_formula
def test_worked_example():
    q = torch.tensor([[1.0, 0.0, 1.0]])
    K = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    V = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    out, weights = attention(q, K, V)
    assert torch.allclose(weights, torch.tensor([[0.264, 0.264, 0.471]]), atol=1e-3)
    assert torch.allclose(out, torch.tensor([[3.41, 4.41]]), atol=1e-2)


@pytest.mark.stock_formula
def test_attention_equals_hand_computation_and_rows_sum_to_one():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    out, weights = attention(q, k, v)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(8)
    expected_w = scores.exp() / scores.exp().sum(-1, keepdim=True)
    assert torch.allclose(weights, expected_w, atol=1e-6)
    assert torch.allclose(out, torch.einsum("bhqk,bhkd->bhqd", expected_w, v), atol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 5), atol=1e-6)


@pytest.mark.stock_formula
@pytest.mark.parametrize("t_q,t_k", [(6, 6), (1, 6), (3, 6)])
def test_attention_matches_sdpa(t_q, t_k):
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 3, t_q, 16), torch.randn(2, 3, t_k, 16), torch.randn(2, 3, t_k, 16)
    out, _ = attention(q, k, v)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-5)
    mask = causal_mask(t_q, t_k)
    out, weights = attention(q, k, v, mask)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5)
    assert torch.all(weights[..., ~mask] == 0)


def test_causal_mask_values():
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(3, 5), expected)
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(causal_mask(1, 7), torch.ones(1, 7, dtype=torch.bool))


@pytest.mark.stock_formula
def test_attention_is_permutation_equivariant():
    torch.manual_seed(2)
    x = torch.randn(6, 8)
    Wq, Wk, Wv = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)
    perm = torch.randperm(6)
    out, _ = attention(x @ Wq, x @ Wk, x @ Wv)
    xp = x[perm]
    out_p, _ = attention(xp @ Wq, xp @ Wk, xp @ Wv)
    assert torch.allclose(out_p, out[perm], atol=1e-5)


# ---------------------------------------------------------------------------
# heads


def copy_heads_from(mha, heads):
    """Give each Head the slice of the batched projection that belongs to it."""
    C, hs = mha.c_proj.weight.size(0), mha.head_size
    group = mha.n_head // mha.n_kv_head
    w, b = mha.c_attn.weight, mha.c_attn.bias
    for h, head in enumerate(heads):
        g = h // group  # the key/value head this query head shares
        rows = {"query": h * hs, "key": C + g * hs, "value": C + mha.n_kv_head * hs + g * hs}
        for name, start in rows.items():
            lin = getattr(head, name)
            lin.weight.data.copy_(w[start : start + hs])
            lin.bias.data.copy_(b[start : start + hs])


@pytest.mark.stock_formula
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_multihead_equals_heads_concatenated_then_w_o(n_kv_head):
    torch.manual_seed(3)
    config = tiny_config(n_kv_head=n_kv_head)
    mha = MultiHeadAttention(config).eval()
    heads = [Head(32, 8) for _ in range(4)]
    copy_heads_from(mha, heads)
    x = torch.randn(2, 10, 32)
    concat = torch.cat([head(x)[0] for head in heads], dim=-1)  # (B, T, C)
    expected = mha.c_proj(concat)
    assert torch.allclose(mha(x), expected, atol=1e-5)
    # recording the weights takes the explicit path: the same output, and the heads' weights
    mha.maps = []
    assert torch.allclose(mha(x), expected, atol=1e-5)
    per_head = torch.stack([head(x)[1] for head in heads], dim=1)  # (B, nh, T, T)
    assert torch.allclose(mha.maps[0], per_head, atol=1e-6)


@pytest.mark.stock_formula
def test_a_head_attends_with_its_own_projections_of_the_input():
    """Head: Q = X W_Q, K = X W_K, V = X W_V (its query, key and value layers), then
    attention under the causal mask; against the fused kernel fed projections made by hand."""
    torch.manual_seed(5)
    head = Head(32, 8)
    x = torch.randn(2, 10, 32)
    q = x @ head.query.weight.T + head.query.bias  # (B, T, hs)
    k = x @ head.key.weight.T + head.key.bias  # (B, T, hs)
    v = x @ head.value.weight.T + head.value.bias  # (B, T, hs)
    out, weights = head(x)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5)
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # no query sees a later key


@pytest.mark.stock_formula
def test_sdpa_path_equals_explicit_path():
    model = tiny_model()
    idx = torch.randint(0, 37, (3, 16))
    logits, _ = model(idx)
    logits_explicit, maps = model.attention_maps(idx)
    assert torch.allclose(logits, logits_explicit, atol=1e-5)
    assert len(maps) == 2 and maps[0].shape == (3, 4, 16, 16)


def test_grouped_query_cache_is_smaller():
    full = tiny_model().make_kv_cache(2)
    for n_kv_head in (2, 1):
        model = tiny_model(n_kv_head=n_kv_head)
        cache = model.make_kv_cache(2)
        assert (
            isinstance(cache, KVCache)
            and len(cache.k) == 2
            and cache.k[0].shape == (2, n_kv_head, 16, 8)
        )
        assert full.nbytes == cache.nbytes * (4 // n_kv_head)
        logits, _ = model(torch.randint(0, 37, (2, 5)), kv_cache=cache)
        assert logits.shape == (2, 5, 37) and cache.pos == 5


# ---------------------------------------------------------------------------
# causality


@pytest.mark.parametrize("fused", [True, False])
def test_future_tokens_do_not_change_past_logits(fused):
    """On the path that trains, against itself: the fused kernel's logits, or attention()'s
    as written (fused=False, the path an edit to it trains); and the written-out maps give
    no weight to a later key. (tests/test_invariants.py checks every position.)"""
    model = tiny_model(fused=fused)
    idx = torch.randint(0, 37, (1, 16))
    t = 7
    changed = idx.clone()
    changed[0, t + 1 :] = torch.randint(0, 37, (16 - t - 1,))
    a, _ = model(idx)
    b, _ = model(changed)
    assert torch.allclose(a[0, : t + 1], b[0, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(a[0, t + 1 :], b[0, t + 1 :])
    _, maps = model.attention_maps(changed)
    upper = ~causal_mask(16, 16)
    for m in maps:
        assert torch.all(m[..., upper] == 0)


# ---------------------------------------------------------------------------
# KV cache


VARIANTS = [
    dict(),
    dict(n_kv_head=2),
    dict(rope=True, qk_norm=True, activation="relu2"),
    dict(bias=False),
]


@pytest.mark.parametrize("options", VARIANTS)
def test_cache_token_by_token_equals_full_forward(options):
    model = tiny_model(**options)
    idx = torch.randint(0, 37, (2, 16))
    full, _ = model(idx)
    cache = model.make_kv_cache(2)
    k_ptr = cache.k[0].data_ptr()
    steps = [model(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(16)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    assert cache.pos == 16 and cache.k[0].data_ptr() == k_ptr  # written in place
    # a prefill in chunks gives the same logits too
    cache.reset()
    chunks = [
        model(idx[:, :5], kv_cache=cache)[0],
        model(idx[:, 5:11], kv_cache=cache)[0],
        model(idx[:, 11:], kv_cache=cache)[0],
    ]
    assert torch.allclose(torch.cat(chunks, dim=1), full, atol=1e-5)


def test_cached_attention_rows_equal_full_forward_maps():
    model = tiny_model()
    idx = torch.randint(0, 37, (1, 12))
    _, full_maps = model.attention_maps(idx)
    cache = model.make_kv_cache(1)
    _, prefill = model.attention_maps(idx[:, :4], kv_cache=cache)
    assert torch.allclose(prefill[1], full_maps[1][:, :, :4, :4], atol=1e-6)
    for t in range(4, 12):
        _, row = model.attention_maps(idx[:, t : t + 1], kv_cache=cache)
        assert torch.allclose(row[1][:, :, 0], full_maps[1][:, :, t, : t + 1], atol=1e-6)


@pytest.mark.parametrize("options", VARIANTS[:3])
def test_greedy_generation_same_with_and_without_cache(options):
    model = tiny_model(seed=4, **options)
    prompt = torch.randint(0, 37, (2, 3))
    n = 3 * model.config.block_size
    with_cache = model.generate(prompt, n, temperature=0)
    without = engine.generate(model, prompt, n, temperature=0, use_cache=False)
    streamed = engine.generate(model, prompt, n, temperature=0)
    assert with_cache.shape == (2, 3 + n)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache, streamed)
    assert torch.equal(with_cache[:, :3], prompt)


@pytest.mark.stock_formula
@pytest.mark.parametrize("options", VARIANTS)
def test_fixed_shape_decode_step_equals_full_forward(options):
    model = tiny_model(**options)
    idx = torch.randint(0, 37, (2, 16))
    full, _ = model(idx)
    cache = model.make_kv_cache(2, zero=True)
    model(idx[:, :5], kv_cache=cache)  # prefill the usual way
    # unwritten positions are masked: huge values there must change nothing
    for t in cache.k + cache.v:
        t[:, :, 5:] = 1e4
    steps = [model.decode_step(idx[:, t : t + 1], torch.tensor([t]), cache) for t in range(5, 16)]
    assert torch.allclose(torch.stack(steps, dim=1), full[:, 5:], atol=1e-5)


def test_compiled_generation_equals_eager():
    from torch._inductor import config as inductor_config

    model = tiny_model(seed=4, rope=True, qk_norm=True, activation="relu2")
    prompt = torch.randint(0, 37, (2, 3))
    n = 3 * model.config.block_size  # slides the window twice
    eager = model.generate(prompt, n, temperature=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = generate_compiled(model, prompt, n, temperature=0)
    assert torch.equal(compiled, eager)
    # inductor's own deprecation warning (its C++ templates) is not shown to the user
    assert not [w for w in caught if "TypedStorage" in str(w.message)]
    step, cache = compiled_decoder(model, 2)
    assert compiled_decoder(model, 2) == (step, cache)  # built once, kept
    # the position lives on the device and is advanced in place, never re-sent from the host
    at = cache.at
    generate_compiled(model, prompt, 5, temperature=0)
    assert (
        cache.at is at
        and at.data_ptr() == cache.at.data_ptr()
        and at.tolist() == [cache.pos] == [3 + 4]
    )
    # on CPU the weights are frozen into the compiled step: a change rebuilds it (its
    # matrix products from ATen's kernels alone: the autotuner's C++ templates were
    # tried above, and compiling them again would add some 15 s)
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.mul_(-1)
    assert compiled_decoder(model, 2)[0] is not step
    with inductor_config.patch(max_autotune_gemm_backends="ATEN"):
        rebuilt = generate_compiled(model, prompt, n, temperature=0)
    assert torch.equal(rebuilt, model.generate(prompt, n, temperature=0))
    with pytest.raises(ValueError, match="compiled decoder decodes through the full KV cache"):
        generate_compiled(model, prompt, 2, use_cache=False)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_generation_equals_eager_on_cuda():
    model = tiny_model(seed=4).cuda()
    prompt = torch.randint(0, 37, (2, 3), device="cuda")
    n = 3 * model.config.block_size
    eager = model.generate(prompt, n, temperature=0)
    assert torch.equal(generate_compiled(model, prompt, n, temperature=0), eager)
    assert torch.equal(generate_compiled(model, prompt, n, temperature=0), eager)  # replayed


def test_sliding_rule():
    model = tiny_model()  # block_size 16: slide keeps the newest 12
    assert model.context_start(16, 0) == 0
    assert model.context_start(17, 0) == 5
    assert model.context_start(17, 5) == 5
    assert model.context_start(21, 5) == 5
    assert model.context_start(22, 5) == 10
    starts = [
        s
        for _, _, s in engine.stream(model, torch.zeros(1, 1, dtype=torch.long), 40, temperature=0)
    ]
    assert starts[15] == 0 and starts[16] == 5 and starts[-1] > 5


def test_generation_with_long_prompt_keeps_last_window():
    model = tiny_model()
    prompt = torch.randint(0, 37, (1, 40))
    out = model.generate(prompt, 5, temperature=0)
    assert out.shape == (1, 45) and torch.equal(out[:, :40], prompt)
    assert torch.equal(out, engine.generate(model, prompt, 5, temperature=0, use_cache=False))


def test_sampling_controls():
    torch.manual_seed(5)
    logits = torch.randn(4, 37)
    greedy = logits.argmax(-1, keepdim=True)
    assert torch.equal(sample_next(logits, 0.0), greedy)
    assert torch.equal(sample_next(logits, 1.0, top_k=1), greedy)
    assert torch.equal(sample_next(logits, 1.0, top_p=1e-6), greedy)
    # the limits, where float32 would divide by 0 or keep no token: still greedy
    for tiny in (1e-30, 1e-300, 5e-324):
        assert torch.equal(sample_next(logits, tiny), greedy)
        assert torch.equal(sample_next(logits.bfloat16(), tiny), greedy)
        assert torch.equal(sample_next(logits, 1.0, top_p=tiny), greedy)
    # against torch's own softmax and multinomial on the same generator: the same draws
    for temperature in (0.5, 1.0, 1.7):
        ours = torch.Generator().manual_seed(1)
        theirs = torch.Generator().manual_seed(1)
        for _ in range(100):
            expected = torch.multinomial(
                torch.softmax(logits / temperature, -1), 1, generator=theirs
            )
            assert torch.equal(sample_next(logits, temperature, generator=ours), expected)
    # top_k=3 only ever picks among the three largest logits
    top3 = logits.topk(3).indices
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        pick = sample_next(logits, 1.5, top_k=3, generator=g)
        assert torch.all((top3 == pick).any(-1))
    # the same generator seed gives the same samples
    model = tiny_model()
    a = model.generate(
        torch.zeros(1, 1, dtype=torch.long), 20, generator=torch.Generator().manual_seed(7)
    )
    b = model.generate(
        torch.zeros(1, 1, dtype=torch.long), 20, generator=torch.Generator().manual_seed(7)
    )
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------
# bad input


def test_too_long_input_and_cache_overflow_raise():
    model = tiny_model()
    with pytest.raises(ValueError, match="longer than block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))
    cache = model.make_kv_cache(1)
    model(torch.zeros(1, 10, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="overflow"):
        model(torch.zeros(1, 7, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.zeros(1, 1, dtype=torch.long), 3, temperature=-1)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(model, torch.zeros(1, 1, dtype=torch.long), 3, temperature=-1)


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(n_embd=30), "divisible by n_head"),
        (dict(n_kv_head=3), "divisible by n_kv_head"),
        (dict(n_layer=0), "n_layer must be a positive integer"),
        (dict(block_size=-4), "block_size must be a positive integer"),
        (dict(dropout=1.5), "dropout"),
        (dict(activation="swish"), "activation"),
        (dict(qk_gain=True), "set qk_norm=True too"),
    ],
)
def test_config_validation(bad, match):
    with pytest.raises(ValueError, match=match):
        tiny_config(**bad)


def test_attention_dropout_apart_from_the_residual_dropout():
    # nanoGPT's one dropout: the attention weights and the residual stream alike
    model = tiny_model(dropout=0.2).train()
    assert model.config.attn_dropout is None
    assert model.transformer.h[0].attn.dropout_p == 0.2
    # attn_dropout=0: the attention itself is the plain causal softmax while training,
    # against the fused kernel without dropout; the residual stream still drops
    model = tiny_model(dropout=0.2, attn_dropout=0.0).train()
    attn = model.transformer.h[0].attn
    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attn.attend(q, k, v, None, None, 0, None), expected)
    assert attn.resid_dropout.p == 0.2
    assert model.transformer.h[0].mlp.dropout.p == 0.2
    # and the two dropouts' masks differ from one training forward to the next
    x = torch.randint(0, 37, (2, 16))
    assert not torch.equal(model(x)[0], model(x)[0])
    model.eval()
    torch.testing.assert_close(model(x)[0], model(x)[0], rtol=0, atol=0)


def test_dropout_is_the_runs_choice_when_a_checkpoint_loads():
    # a checkpoint's model_args hold the attention dropout it trained with; a run that
    # loads it chooses both again (support/loading.py), None following --dropout
    trained = tiny_model(dropout=0.2, attn_dropout=0.1)
    ckpt = {"model_args": dataclasses.asdict(trained.config), "model": trained.state_dict()}
    for attn_dropout, expected in ((None, 0.05), (0.0, 0.0)):
        model = from_checkpoint(ckpt, "ckpt.pt", dropout=0.05, attn_dropout=attn_dropout)
        assert model.train().transformer.h[0].attn.dropout_p == expected
    # a checkpoint written before attn_dropout existed: the one dropout, as before
    del ckpt["model_args"]["attn_dropout"]
    model = from_checkpoint(ckpt, "ckpt.pt").train()
    assert model.transformer.h[0].attn.dropout_p == 0.2


@pytest.mark.stock_formula
def test_qk_gain_starts_as_plain_qk_norm_and_raises_the_logits_cap():
    """QK-norm's gains start at 1, where the model is the one without them; a gain of a
    on every query dimension and b on every key dimension multiplies each logit by a b,
    so each attention row becomes p ** (a b), renormalised, of the row p without gains."""
    plain = tiny_model(rope=True, qk_norm=True)
    gained = tiny_model(rope=True, qk_norm=True, qk_gain=True)
    missing, unexpected = gained.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing) == sorted(
        f"transformer.h.{i}.attn.{n}_norm.weight" for i in range(2) for n in "qk"
    )
    assert not unexpected and plain.num_params() + 2 * 2 * 8 == gained.num_params()
    idx = torch.randint(0, 37, (2, 16))
    torch.testing.assert_close(gained(idx)[0], plain(idx)[0], rtol=0, atol=0)
    with torch.no_grad():
        gained.transformer.h[0].attn.q_norm.weight.fill_(2.0)
        gained.transformer.h[0].attn.k_norm.weight.fill_(1.5)
    _, maps = plain.attention_maps(idx)
    _, gained_maps = gained.attention_maps(idx)
    sharper = maps[0] ** 3.0  # (B, nh, T, T), masked keys stay 0
    expected = sharper / sharper.sum(-1, keepdim=True)
    torch.testing.assert_close(gained_maps[0], expected, rtol=1e-4, atol=1e-6)


def test_qk_gain_under_bfloat16_autocast_keeps_the_fused_norm_without_a_warning():
    """Under bfloat16 autocast c_attn hands QK-norm bfloat16 queries and keys: the gain
    takes their dtype, as autocast casts a Linear's weight, so torch.rms_norm neither
    warns of a dtype mismatch nor leaves its fused kernel, in autocast or with the whole
    model in bfloat16: x / rms(x) * gain, rounded to bfloat16."""
    model = tiny_model(rope=True, qk_norm=True, qk_gain=True)
    norm = model.transformer.h[0].attn.q_norm
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(2, 4, 16, 8).bfloat16()  # (B, nh, T, hs)
    idx = torch.randint(0, 37, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = norm(x)
            logits, _ = model(idx)
        bf16_logits, _ = copy.deepcopy(model).bfloat16()(idx)
    assert y.dtype == logits.dtype == bf16_logits.dtype == torch.bfloat16
    xf = x.float()
    rms = xf.pow(2).mean(-1, keepdim=True).add(torch.finfo(torch.float32).eps).sqrt()
    expected = (xf / rms * norm.weight.detach().bfloat16().float()).bfloat16()
    torch.testing.assert_close(y, expected)  # to a bfloat16 rounding


# ---------------------------------------------------------------------------
# initialisation and training helpers


def test_gpt2_initialisation_and_tied_head():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=64, vocab_size=500, n_layer=8, n_head=4, n_embd=256))
    assert model.lm_head.weight is model.transformer.wte.weight
    proj = torch.cat([b.attn.c_proj.weight.flatten() for b in model.transformer.h])
    assert abs(proj.std().item() - 0.02 / math.sqrt(16)) < 0.0005
    assert abs(model.transformer.h[0].mlp.c_fc.weight.std().item() - 0.02) < 0.0005
    assert model.num_params() == sum(p.numel() for p in model.parameters())


def test_configure_optimizers_decays_matrices_only():
    model = tiny_model()
    opt = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(
        p.dim() < 2 for p in no_decay["params"]
    )
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert estimate_mfu(model, 1000, 0.1) is None  # no GPU peak to compare with on CPU


def test_loss_ignores_minus_one_and_matches_cross_entropy():
    model = tiny_model()
    idx = torch.randint(0, 37, (2, 8))
    targets = torch.randint(0, 37, (2, 8))
    targets[0, :3] = -1
    logits, loss = model(idx, targets)
    keep = targets != -1
    expected = F.cross_entropy(logits[keep], targets[keep])
    assert torch.allclose(loss, expected, atol=1e-6)


# ---------------------------------------------------------------------------
# Hugging Face GPT-2: same weights, same logits, same greedy tokens


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_positions=32,
        n_embd=48,
        n_layer=3,
        n_head=4,
        vocab_size=101,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-zero biases and gains, so a missed transpose or copy shows
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    folder = tmp_path_factory.mktemp("hf-gpt2")
    hf.save_pretrained(folder)
    return hf, folder


def test_from_pretrained_matches_hugging_face_logits(hf_gpt2):
    hf, folder = hf_gpt2
    ours = GPT.from_pretrained(str(folder)).eval()
    idx = torch.randint(0, 101, (2, 32))
    with torch.no_grad():
        expected = hf(idx).logits
    logits, _ = ours(idx)
    assert torch.allclose(logits, expected, atol=1e-4)


def test_from_pretrained_matches_hugging_face_greedy_generation(hf_gpt2):
    hf, folder = hf_gpt2
    ours = GPT.from_pretrained(str(folder)).eval()
    prompt = torch.randint(0, 101, (1, 5))
    with torch.no_grad():
        expected = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=25,
            min_new_tokens=25,
            pad_token_id=0,
        )
    assert torch.equal(ours.generate(prompt, 25, temperature=0), expected)


def test_from_pretrained_pytorch_bin_and_smaller_block(hf_gpt2, tmp_path):
    hf, folder = hf_gpt2
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    ours = GPT.from_pretrained(str(tmp_path), block_size=16).eval()
    idx = torch.randint(0, 101, (1, 16))
    with torch.no_grad():
        expected = hf(idx).logits
    assert torch.allclose(ours(idx)[0], expected, atol=1e-4)
    with pytest.raises(ValueError, match="larger than the pretrained"):
        GPT.from_pretrained(str(folder), block_size=64)


def test_from_pretrained_offline_name_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="local folder|huggingface_hub"):
        GPT.from_pretrained("gpt2-not-a-real-model-name")


def test_model_file_imports_only_torch_and_the_standard_library(repo_root):
    """model.py is the file people read and fork: torch and the standard library alone at
    the top (a loader imports its library inside). Its length is the formatter's business."""
    path = os.path.join(repo_root, "model.py")
    with open(path) as f:
        source = f.read()
    top = [
        node for node in ast.parse(source).body if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    names = {
        alias.name.split(".")[0]
        for node in top
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    names |= {node.module.split(".")[0] for node in top if isinstance(node, ast.ImportFrom)}
    assert "torch" in names and names - {"torch"} <= set(sys.stdlib_module_names), names


# The places where Part I names what Part II defines below it (model.py says so there)
SEAMS = {
    "MultiHeadAttention.attend": {"windowed_attention", "linear_attend"},
    "GPT.make_kv_cache": {"LinearState", "window_cache"},
}
PART_II = "# Part II:"


def test_model_file_follows_its_outline(repo_root):
    """The numbered outline at the top of model.py is the order of its sections, and a
    name defined at the top level is only used below its definition, except where Part I
    names Part II's at a seam."""
    with open(os.path.join(repo_root, "model.py")) as f:
        source = f.read()
    tree = ast.parse(source)
    outline = re.findall(r"^ +(\d+)\. ", ast.get_docstring(tree), flags=re.M)
    sections = re.findall(r"^ *# (\d+)\. .* -{10}$", source, flags=re.M)
    assert outline == sections == [str(n) for n in range(1, len(outline) + 1)]
    names = top_level_names(tree)
    defined = set()
    for node in tree.body:
        for where, part in named_parts(node):
            used = {n.id for n in ast.walk(part) if isinstance(n, ast.Name)} & names
            assert used <= defined | SEAMS.get(where, set()), (where, used - defined)
        defined |= top_level_names(ast.Module(body=[node], type_ignores=[]))
    # the seams name Part II's definitions only
    part_two_line = source[: source.index(PART_II)].count("\n") + 1
    part_two = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.lineno > part_two_line
    }
    assert set().union(*SEAMS.values()) <= part_two


def named_parts(node):
    """(qualified name, subtree) for a top-level statement: a class's methods one by one."""
    if not isinstance(node, ast.ClassDef):
        yield getattr(node, "name", ""), node
        return
    rest = ast.ClassDef(
        name=node.name,
        bases=node.bases,
        keywords=node.keywords,
        decorator_list=node.decorator_list,
        body=[item for item in node.body if not isinstance(item, ast.FunctionDef)],
    )
    yield node.name, rest
    for item in node.body:
        if isinstance(item, ast.FunctionDef):
            yield f"{node.name}.{item.name}", item


def top_level_names(tree):
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def test_readability_measure_on_a_hand_counted_source():
    from experiments.readability import measure

    source = (
        '"""Doc."""\n'
        "\n"
        "class MultiHeadAttention:\n"
        "    def forward(self, x):\n"
        "        a, b = x, 1  # a tuple to a tuple\n"
        "        if a and b or x:\n"
        "            return [f(y) for y in x]\n"
        "        return a if b else -x[0]\n"
    )
    lines, chars, ops, long_lines, tuples, ifexps, branches = measure(source)
    assert (lines, long_lines, tuples, ifexps) == (8, 0, 1, 1)
    non_blank = [line for line in source.splitlines() if line.strip()]
    assert chars == round(sum(len(line) for line in non_blank) / 7, 1)
    # two BoolOps, the call, the comprehension, the IfExp, the UnaryOp and the Subscript,
    # over the 6 code lines (the docstring and the blank line are not code)
    assert ops == round(7 / 6, 2)
    # 1 + if + and + or + comprehension + conditional expression
    assert branches == 6
