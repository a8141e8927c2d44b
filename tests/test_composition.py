"""support/composition.py: Elhage et al.'s Q-, K- and V-composition scores.

Checked against TransformerLens 3.9.0 (HookedTransformer.all_composition_scores)
on the same weights, loaded into a HookedTransformer whose forward gives our
logits, with LayerNorm folded and the writing weights centred; against the
formula with the (C, C) matrices formed densely; and on weights built so that
the answer is known.
"""

import math

import pytest
import torch

from model import GPT, GPTConfig
from support.composition import composition_scores, head_weights, strongest


def tiny(**overrides):
    torch.manual_seed(0)
    args = dict(block_size=16, vocab_size=11, n_layer=3, n_head=2, n_embd=16, bias=True)
    args.update(overrides)
    model = GPT(GPTConfig(**args))
    # a trained model's LayerNorm gains are not all 1: make them differ, so folding matters
    with torch.no_grad():
        for block in model.transformer.h:
            block.ln_1.weight.uniform_(0.5, 1.5)
            block.ln_2.weight.uniform_(0.5, 1.5)
    return model


def hooked(model):
    """A HookedTransformer holding model's weights (learned positions, GELU, LayerNorm)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    c = model.config
    hs = c.n_embd // c.n_head
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_head=hs,
        d_mlp=4 * c.n_embd,
        d_vocab=c.vocab_size,
        n_ctx=c.block_size,
        act_fn="gelu_new",
        normalization_type="LN",
        default_prepend_bos=False,
    )
    sd = {
        "embed.W_E": model.transformer.wte.weight,
        "pos_embed.W_pos": model.transformer.wpe.weight,
        "ln_final.w": model.transformer.ln_f.weight,
        "ln_final.b": model.transformer.ln_f.bias,
        "unembed.W_U": model.lm_head.weight.T,
        "unembed.b_U": torch.zeros(c.vocab_size),
    }
    for layer, block in enumerate(model.transformer.h):
        w_q, w_k, w_v = block.attn.c_attn.weight.split(c.n_embd, dim=0)  # (C out, C in) each
        b_q, b_k, b_v = block.attn.c_attn.bias.split(c.n_embd)
        p = f"blocks.{layer}."
        for name, w, b in (("Q", w_q, b_q), ("K", w_k, b_k), ("V", w_v, b_v)):
            sd[p + f"attn.W_{name}"] = w.T.reshape(c.n_embd, c.n_head, hs).transpose(0, 1)
            sd[p + f"attn.b_{name}"] = b.reshape(c.n_head, hs)
        sd[p + "attn.W_O"] = block.attn.c_proj.weight.T.reshape(c.n_head, hs, c.n_embd)
        sd[p + "attn.b_O"] = block.attn.c_proj.bias
        sd[p + "ln1.w"] = block.ln_1.weight
        sd[p + "ln1.b"] = block.ln_1.bias
        sd[p + "ln2.w"] = block.ln_2.weight
        sd[p + "ln2.b"] = block.ln_2.bias
        sd[p + "mlp.W_in"] = block.mlp.c_fc.weight.T
        sd[p + "mlp.b_in"] = block.mlp.c_fc.bias
        sd[p + "mlp.W_out"] = block.mlp.c_proj.weight.T
        sd[p + "mlp.b_out"] = block.mlp.c_proj.bias
    tl = HookedTransformer(cfg)
    sd = {k: v.detach().clone() for k, v in sd.items()}
    tl.load_and_process_state_dict(sd, fold_ln=True, center_writing_weights=True)
    return tl.eval()


# 3.9.0 warns that HookedTransformer goes in 4.0: the oracle is pinned to 3.9.0
@pytest.mark.filterwarnings("ignore:HookedTransformer is deprecated:DeprecationWarning")
def test_transformer_lens_agrees():
    pytest.importorskip("transformer_lens")  # requirements-dev.txt pins it
    model = tiny().eval()
    tl = hooked(model)
    idx = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = torch.log_softmax(model(idx)[0], -1)
        theirs = torch.log_softmax(tl(idx), -1)
    # the same weights: the same model (TransformerLens centres the unembedding, so log-probs)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    found = composition_scores(model)
    L = model.config.n_layer
    later = torch.arange(L)[:, None, None, None] < torch.arange(L)[None, None, :, None]
    later = later.expand_as(found["q"])
    for name in ("q", "k", "v"):
        expected = tl.all_composition_scores(name.upper())
        assert found[name].shape == (L, 2, L, 2)
        torch.testing.assert_close(found[name][later], expected[later], atol=1e-5, rtol=1e-4)
        assert torch.isnan(found[name][~later]).all()


def dense(model):
    """Every head's W_OV and W_QK as (C, C) matrices, LayerNorm's gain and centring folded
    by hand, one head at a time: {(layer, head): matrix} twice."""
    c = model.config
    C, hs = c.n_embd, c.n_embd // c.n_head
    centre = torch.eye(C) - 1.0 / C
    ov, qk = {}, {}
    for layer, block in enumerate(model.transformer.h):
        fold = centre @ torch.diag(block.ln_1.weight.detach())
        w = block.attn.c_attn.weight.detach()  # (C + 2 nkv hs, C): rows of W_Q, W_K, W_V
        for h in range(c.n_head):
            g = h // (c.n_head // c.n_kv_head)  # the key/value head that query head h reads
            w_q = fold @ w[h * hs : (h + 1) * hs].T  # (C, hs)
            w_k = fold @ w[C + g * hs : C + (g + 1) * hs].T
            v_start = C + c.n_kv_head * hs + g * hs
            w_v = fold @ w[v_start : v_start + hs].T
            w_o = block.attn.c_proj.weight.detach()[:, h * hs : (h + 1) * hs].T @ centre  # (hs, C)
            ov[layer, h] = w_v @ w_o
            qk[layer, h] = w_q @ w_k.T
    return ov, qk


def test_dense_formula_agrees_with_grouped_query_attention():
    model = tiny(n_head=4, n_kv_head=2, n_embd=16, bias=False, rope=True, qk_norm=True)
    ov, qk = dense(model)
    found = composition_scores(model)

    def ratio(a, b):
        return torch.linalg.matrix_norm(a @ b) / (
            torch.linalg.matrix_norm(a) * torch.linalg.matrix_norm(b)
        )

    for (l1, h1), w_ov in ov.items():
        for (l2, h2), w_qk in qk.items():
            if l2 <= l1:
                continue
            want = {
                "q": ratio(w_ov, w_qk),
                "k": ratio(w_ov, w_qk.T),
                "v": ratio(w_ov, ov[l2, h2]),
            }
            for name, value in want.items():
                assert math.isclose(found[name][l1, h1, l2, h2], value, rel_tol=1e-4), name


def test_known_k_composition():
    """Head (0, 0) writes only into the directions head (1, 0)'s key reads, head (0, 1)
    only into directions no later head reads: K-composition 1 against (near) 0."""
    model = tiny(n_layer=2, n_head=2, n_embd=16, bias=False)
    C, hs = 16, 8
    # orthonormal directions orthogonal to the all-ones vector, which LayerNorm's centring removes
    columns = torch.cat(
        [torch.ones(C, 1), torch.randn(C, C - 1, generator=torch.Generator().manual_seed(3))], 1
    )
    basis = torch.linalg.qr(columns)[0][:, 1:]  # (C, C - 1)
    read, unread = basis[:, :4], basis[:, 4:8]  # (C, 4) each
    with torch.no_grad():
        for block in model.transformer.h:
            block.ln_1.weight.fill_(1.0)
        attn0 = model.transformer.h[0].attn
        attn1 = model.transformer.h[1].attn
        w_o = torch.zeros(C, C)  # c_proj.weight: out x in
        w_o[:, :4] = read  # head 0's first 4 channels write `read`
        w_o[:, hs : hs + 4] = unread  # head 1's write `unread`
        attn0.c_proj.weight.copy_(w_o)
        w = attn1.c_attn.weight  # (3C, C): rows W_Q, W_K, W_V
        w.zero_()
        w[C : C + 4] = read.T  # head (1, 0)'s key reads `read`
        w[0:4] = read.T  # and its query too (so W_QK is not zero)
        w[C + hs : C + hs + 4] = basis[:, 8:12].T  # head (1, 1) reads elsewhere
        w[hs : hs + 4] = basis[:, 8:12].T
    k = composition_scores(model)["k"]
    # W_OV W_QK^T = W_OV P with P = read read^T a projector that keeps all of W_OV: |P| = 2
    assert math.isclose(k[0, 0, 1, 0], 0.5, rel_tol=1e-5)
    assert k[0, 1, 1, 0] < 1e-5
    assert k[0, 0, 1, 1] < 1e-5
    assert strongest(k, 1, 0)[0] == (0, 0)
    assert strongest(k, 0, 0) is None


def test_head_weights_shapes():
    model = tiny(n_head=4, n_kv_head=1, n_embd=16, bias=False)
    w_q, w_k, w_v, w_o = head_weights(model)
    assert w_q.shape == w_k.shape == w_v.shape == (3, 4, 16, 4)
    assert w_o.shape == (3, 4, 4, 16)
    # one key/value head serves all four query heads
    assert torch.equal(w_k[:, 0], w_k[:, 3])
