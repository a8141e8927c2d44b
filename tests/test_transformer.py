"""experiments/transformer.py, the encoder-decoder of model.py's parts, against oracles
computed another way: cross-attention against F.scaled_dot_product_attention head by
head, the position encoding against the paper's formula, a sentence alone against it
padded in a batch, the fused path against attention() as written, greedy decoding against
its own teacher-forced run; and the three attentions' masks, by changing a word and seeing
which outputs move."""

import math

import pytest
import torch
import torch.nn.functional as F

from experiments import toy_translation as task
from experiments.transformer import (
    CrossAttention,
    Transformer,
    TransformerConfig,
    look_ahead,
    sinusoid,
    target_input,
)
from model import GPTConfig


def tiny(seed=0, fused=True):
    torch.manual_seed(seed)
    config = TransformerConfig(
        task.SRC_VOCAB, task.TGT_VOCAB, n_layer=2, n_head=2, n_embd=8, fused=fused
    )
    return Transformer(config).double().eval()


def sentences(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    src, y_in, y_out, align = task.batch(lengths, gen)
    return src, lengths, y_in


def test_cross_attention_is_each_head_over_the_encoder_then_w_o():
    """Queries from x, keys and values from the memory, per head, the padding masked: the
    oracle is F.scaled_dot_product_attention on the projections taken apart by hand."""
    torch.manual_seed(0)
    C, nh, B, T, S = 8, 2, 2, 3, 5
    cross = CrossAttention(GPTConfig(n_embd=C, n_head=nh)).double()
    x = torch.randn(B, T, C, dtype=torch.float64)
    memory = torch.randn(B, S, C, dtype=torch.float64)
    real = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    mask = real[:, None, None, :]  # (B, 1, 1, S)
    W_q, W_kv = cross.c_q.weight, cross.c_kv.weight
    q = x @ W_q.T + cross.c_q.bias  # (B, T, C)
    kv = memory @ W_kv.T + cross.c_kv.bias  # (B, S, 2 C)
    k, v = kv[..., :C], kv[..., C:]
    heads = []
    for h in range(nh):
        part = slice(h * C // nh, (h + 1) * C // nh)
        heads.append(
            F.scaled_dot_product_attention(
                q[:, None, :, part], k[:, None, :, part], v[:, None, :, part], attn_mask=mask
            )[:, 0]
        )
    expected = cross.c_proj(torch.cat(heads, dim=-1))
    assert torch.allclose(cross(x, memory, mask), expected, atol=1e-12)
    # and the padding's keys and values change nothing
    other = memory.clone()
    other[0, 3:] = 100.0
    assert torch.allclose(cross(x, other, mask), expected, atol=1e-12)


def test_sinusoid_is_the_papers_formula_and_its_products_depend_only_on_the_offset():
    T, C = 12, 8
    pe = sinusoid(T, C)
    for pos in (0, 5, 11):
        for i in range(C // 2):
            angle = pos / 10000 ** (2 * i / C)
            assert math.isclose(pe[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-6)
            assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-6)
    products = pe @ pe.T  # (T, T)
    for offset in (0, 1, 4):
        diagonal = torch.diagonal(products, offset=offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5)


def test_the_encoder_sees_later_words_and_the_decoder_does_not():
    """The encoder has no causal mask: a change to the last source word moves the first
    word's encoder output. The decoder's self-attention has one: a change to target input
    t moves the logits from t on and none before."""
    model = tiny()
    src, lengths, y_in = sentences([6])
    memory, mask = model.encode(src, lengths)
    other = src.clone()
    other[0, 5] = 1 + (src[0, 5] % 90)
    assert not torch.allclose(model.encode(other, lengths)[0][:, 0], memory[:, 0])
    logits = model.decode(y_in, memory, mask)
    changed = y_in.clone()
    changed[0, 4] = 3 + (y_in[0, 4] % 90)
    moved = model.decode(changed, memory, mask)
    assert torch.allclose(moved[:, :4], logits[:, :4], atol=1e-12)
    assert not torch.allclose(moved[:, 4:], logits[:, 4:])


@pytest.mark.parametrize("fused", [True, False])
def test_a_sentence_alone_equals_it_padded_in_a_batch(fused):
    """The padding mask in the encoder and in cross-attention: a short sentence beside a
    long one gets the logits it gets alone, whatever stands in its padding."""
    model = tiny(fused=fused)
    src, lengths, y_in = sentences([3, 7])
    logits = model(src, lengths, y_in)
    alone = model(src[:1, :3], lengths[:1], y_in[:1])
    assert torch.allclose(logits[:1], alone, atol=1e-10)
    other = src.clone()
    other[0, 3:] = 5
    assert torch.allclose(model(other, lengths, y_in), logits, atol=1e-10)
    maps = model.attention_maps(src, lengths, y_in)
    for weights in maps["cross"] + maps["encoder"]:
        assert torch.all(weights[0, :, :, 3:] == 0)


def test_the_fused_kernel_and_attention_as_written_agree():
    """GPTConfig.fused=False runs attention() with the padding mask where fused=True runs
    F.scaled_dot_product_attention with it: the same weights give the same logits (to
    float32's precision: attention() takes its softmax in float32)."""
    fused = tiny(fused=True)
    written = tiny(fused=False)
    written.load_state_dict(fused.state_dict())
    src, lengths, y_in = sentences([4, 6])
    assert torch.allclose(fused(src, lengths, y_in), written(src, lengths, y_in), atol=1e-6)


def test_greedy_is_the_argmax_of_its_own_teacher_forced_run():
    model = tiny(3)
    src, lengths, _ = sentences([5, 4], seed=2)
    tokens = model.greedy(src, lengths, 5)
    logits = model(src, lengths, target_input(tokens))
    assert torch.equal(logits.argmax(-1), tokens)


def test_the_three_attentions_and_their_masks():
    """Each map's rows sum to 1; the decoder's upper triangle is exactly 0, so its
    look-ahead is 0; the encoder's is not."""
    model = tiny(1)
    src, lengths, y_in = sentences([6])
    maps = model.attention_maps(src, lengths, y_in)
    shapes = dict(encoder=(1, 2, 6, 6), decoder=(1, 2, 7, 7), cross=(1, 2, 7, 6))
    for kind, layers in maps.items():
        assert len(layers) == 2
        for weights in layers:
            assert weights.shape == shapes[kind]
            assert torch.allclose(
                weights.sum(-1), torch.ones(shapes[kind][:-1], dtype=weights.dtype)
            )
    for weights in maps["decoder"]:
        assert torch.all(weights.triu(1) == 0)
        assert torch.all(look_ahead(weights) == 0)
    for weights in maps["encoder"]:
        assert look_ahead(weights)[..., :-1].min() > 0  # the last word has none after it


def test_look_ahead_by_hand():
    """Uniform weights over T keys put (T - 1 - i) / T ahead of query i."""
    T = 5
    uniform = torch.full((T, T), 1 / T)
    expected = torch.tensor([(T - 1 - i) / T for i in range(T)])
    assert torch.allclose(look_ahead(uniform), expected)
    assert torch.all(look_ahead(torch.eye(T)) == 0)
