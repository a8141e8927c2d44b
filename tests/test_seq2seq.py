"""The lectures' story before GPT (experiments/seq2seq.py, toy_translation.py,
explicit_attention.py and the commands bottleneck, why_sqrt_d, path_length) against
independent oracles: each score written out another way, one sentence alone against the
same sentence padded in a batch, a step loop against one GRU call, closed-form gradients,
and the GPT's own logits."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from experiments import bottleneck, path_length, why_sqrt_d
from experiments import toy_translation as task
from experiments.explicit_attention import explicit_attention
from experiments.seq2seq import (
    BOS,
    PAD,
    AdditiveScore,
    ConcatScore,
    DotScore,
    GeneralScore,
    Memory,
    Seq2Seq,
    Seq2SeqConfig,
    make_score,
    masked_softmax,
)
from model import GPT, GPTConfig, attention
from support import cli

D = 6  # decoder and encoder width in the score tests
A = 5  # the additive and concat scores' inner width


def tiny_seq2seq(kind, seed=0):
    torch.manual_seed(seed)
    config = Seq2SeqConfig(
        task.SRC_VOCAB, task.TGT_VOCAB, attention=kind, emb_size=8, hidden_size=4, attn_size=5
    )
    return Seq2Seq(config).double().eval()


def states(seed=0, B=2, T=3, S=4):
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    h = torch.randn(B, S, D, generator=gen, dtype=torch.float64)
    return s, h


# ---------------------------------------------------------------------------
# the score functions, each against its formula computed one pair at a time


def pairwise(fn, s, h):
    """e[b, t, i] = fn(s[b, t], h[b, i]) in plain loops: the oracle."""
    B, T, _ = s.shape
    S = h.size(1)
    e = torch.empty(B, T, S, dtype=s.dtype)
    for b in range(B):
        for t in range(T):
            for i in range(S):
                e[b, t, i] = fn(s[b, t], h[b, i])
    return e


def test_additive_score_is_v_tanh_Ws_plus_Uh():
    torch.manual_seed(0)
    score = AdditiveScore(D, D, A).double()
    s, h = states()
    W = score.W.weight  # (A, D)
    U = score.U.weight  # (A, D)
    v = score.v.weight[0]  # (A,)
    expected = pairwise(lambda si, hi: v @ torch.tanh(W @ si + U @ hi), s, h)
    assert torch.allclose(score(s, score.keys(h)), expected, atol=1e-12)


def test_dot_score_is_s_dot_h():
    s, h = states(1)
    expected = pairwise(lambda si, hi: (si * hi).sum(), s, h)
    score = DotScore()
    assert torch.allclose(score(s, score.keys(h)), expected, atol=1e-12)


def test_general_score_is_s_W_h():
    torch.manual_seed(1)
    score = GeneralScore(D, D).double()
    s, h = states(2)
    W = score.W.weight  # (D, D): e = s^T W h
    expected = pairwise(lambda si, hi: si @ W @ hi, s, h)
    assert torch.allclose(score(s, score.keys(h)), expected, atol=1e-12)
    assert not torch.allclose(expected, pairwise(lambda si, hi: (si * hi).sum(), s, h))


def test_concat_score_is_v_tanh_W_of_the_concatenation():
    torch.manual_seed(2)
    score = ConcatScore(D, D, A).double()
    s, h = states(3)
    W = score.W.weight  # (A, 2 D), applied to [s; h] as one vector
    v = score.v.weight[0]
    expected = pairwise(lambda si, hi: v @ torch.tanh(W @ torch.cat([si, hi])), s, h)
    assert torch.allclose(score(s, score.keys(h)), expected, atol=1e-12)


def test_make_score_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="equal widths"):
        make_score("dot", 4, 6, 3)
    with pytest.raises(ValueError, match="unknown score"):
        make_score("cosine", 4, 4, 3)
    with pytest.raises(ValueError, match="attention must be one of"):
        Seq2SeqConfig(10, 10, attention="multiplicative")


# ---------------------------------------------------------------------------
# masks


def test_padding_receives_exactly_no_weight():
    scores = torch.randn(2, 3, 5) * 50
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    weights = masked_softmax(scores, mask)
    assert torch.all(weights[0, :, 3:] == 0)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3))
    # the oracle: a softmax over the real positions alone
    assert torch.allclose(weights[0, :, :3], torch.softmax(scores[0, :, :3], dim=-1))


@pytest.mark.parametrize("kind", ["none", "additive", "dot", "general", "concat"])
def test_a_sentence_alone_equals_it_padded_in_a_batch(kind):
    """Packing and masking: a short sentence beside a long one gets the logits it gets
    alone, and what sits in its padding changes nothing."""
    model = tiny_seq2seq(kind)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 7])
    src, y_in, _, _ = task.batch(lengths, gen)
    logits, weights = model(src, lengths, y_in)
    alone, alone_weights = model(src[:1, :3], lengths[:1], y_in[:1])
    assert torch.allclose(logits[:1], alone, atol=1e-10)
    other = src.clone()
    other[0, 3:] = 5  # a real word where the padding was, the length unchanged
    assert torch.allclose(model(other, lengths, y_in)[0], logits, atol=1e-10)
    if weights is not None:
        assert torch.all(weights[0, :, 3:] == 0)
        assert torch.allclose(weights[:1, :, :3], alone_weights, atol=1e-10)


@pytest.mark.parametrize("rope", [False, True])
def test_explicit_attention_is_the_gpts_own_and_never_sees_the_future(rope):
    torch.manual_seed(0)
    config = GPTConfig(block_size=12, vocab_size=23, n_layer=2, n_head=2, n_embd=16, rope=rope)
    model = GPT(config).eval()
    with torch.no_grad():  # larger than GPT-2's init: sharp weights, where a wrong turn shows
        for block in model.transformer.h:
            block.attn.c_attn.weight.normal_(0.0, 0.5)
    idx = torch.randint(0, 23, (3, 12))
    expected, _ = model(idx)
    hooks = explicit_attention(model)
    logits, _ = model(idx)
    assert torch.allclose(logits, expected, atol=1e-5)
    for hook in hooks:
        future = torch.ones(12, 12, dtype=torch.bool).triu(1)
        assert torch.all(hook.weights[..., future] == 0)
        assert torch.allclose(hook.weights.sum(-1), torch.ones(3, 2, 12), atol=1e-6)
        hook.remove()
    # changing the last token changes no earlier position's logits
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 23
    assert torch.allclose(model(changed)[0][:, :-1], expected[:, :-1], atol=1e-6)


def test_explicit_attention_scale_changes_only_the_factor():
    torch.manual_seed(1)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=1, n_embd=8)).eval()
    idx = torch.randint(0, 11, (2, 8))
    hook = explicit_attention(model, scale=1.0)[0]
    model(idx)
    q, k = hook.q, hook.k  # (B, 1, T, hs)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    _, oracle = attention(q * math.sqrt(8), k, torch.zeros_like(k), mask)  # q . k, unscaled
    assert torch.allclose(hook.weights, oracle, atol=1e-6)


# ---------------------------------------------------------------------------
# the encoder and the decoders


def test_encoder_shapes_and_summary():
    model = tiny_seq2seq("dot")
    lengths = torch.tensor([2, 5, 4])
    src, y_in, _, _ = task.batch(lengths, torch.Generator().manual_seed(1))
    h, summary = model.encoder(src, lengths)
    H = 4
    assert h.shape == (3, 5, 2 * H)
    assert summary.shape == (3, 2 * H)
    assert torch.all(h[0, 2:] == 0)  # nothing at the padding
    for b, n in enumerate(lengths.tolist()):
        # the forward direction's last state, the backward direction's first
        assert torch.allclose(summary[b, :H], h[b, n - 1, :H])
        assert torch.allclose(summary[b, H:], h[b, 0, H:])
    logits, weights = model(src, lengths, y_in)
    assert logits.shape == (3, 6, task.TGT_VOCAB)
    assert weights.shape == (3, 6, 5)


def test_a_left_to_right_encoder_state_knows_only_the_words_before_it():
    config = Seq2SeqConfig(task.SRC_VOCAB, task.TGT_VOCAB, "additive", 8, 4, 8, bidirectional=False)
    encoder = Seq2Seq(config).encoder
    lengths = torch.tensor([6])
    src, _, _, _ = task.batch(lengths, torch.Generator().manual_seed(3))
    h, summary = encoder(src, lengths)
    assert h.shape == (1, 6, 8)
    assert torch.allclose(summary[0], h[0, 5])  # the last state is the summary
    changed = src.clone()
    changed[0, 3] = src[0, 3] % (task.SRC_VOCAB - 1) + 1  # another word at position 3
    h_changed, _ = encoder(changed, lengths)
    assert torch.equal(h_changed[:, :3], h[:, :3])  # the states before it do not see it
    assert not torch.allclose(h_changed[:, 3:], h[:, 3:])
    both_ways = Seq2Seq(Seq2SeqConfig(task.SRC_VOCAB, task.TGT_VOCAB, "additive", 8, 4, 8))
    h_both, _ = both_ways.encoder(src, lengths)
    h_both_changed, _ = both_ways.encoder(changed, lengths)
    assert not torch.allclose(h_both_changed[:, :3], h_both[:, :3])  # the backward GRU sees it


def test_bottleneck_decoder_reads_only_the_summary():
    model = tiny_seq2seq("none")
    lengths = torch.tensor([6])
    src, y_in, _, _ = task.batch(lengths, torch.Generator().manual_seed(2))
    memory, state = model.start(src, lengths)
    logits, _, _ = model.decoder(y_in, memory, state)
    scrambled = Memory(
        h=torch.randn_like(memory.h), mask=memory.mask, keys=None, summary=memory.summary
    )
    assert torch.equal(model.decoder(y_in, scrambled, state)[0], logits)


@pytest.mark.parametrize("kind", ["additive", "dot", "general", "concat"])
def test_attention_decoder_reads_every_encoder_state(kind):
    """Pull, not push: changing any one encoder state changes what the decoder writes."""
    model = tiny_seq2seq(kind)
    lengths = torch.tensor([6])
    src, y_in, _, _ = task.batch(lengths, torch.Generator().manual_seed(2))
    memory, state = model.start(src, lengths)
    logits, _, _ = model.decoder(y_in, memory, state)
    for i in range(6):
        h = memory.h.clone()
        h[0, i] += 1.0
        changed = Memory(
            h=h, mask=memory.mask, keys=model.decoder.score.keys(h), summary=memory.summary
        )
        assert not torch.allclose(model.decoder(y_in, changed, state)[0], logits)


@pytest.mark.parametrize("kind", ["dot", "general", "concat", "none"])
def test_one_gru_call_equals_the_step_loop(kind):
    """Luong's decoder (and the bottleneck's) runs the target in one nn.GRU call; fed one
    token at a time, as greedy decoding feeds it, it must give the same logits."""
    model = tiny_seq2seq(kind)
    lengths = torch.tensor([5, 3])
    src, y_in, _, _ = task.batch(lengths, torch.Generator().manual_seed(3))
    memory, state = model.start(src, lengths)
    logits, weights, _ = model.decoder(y_in, memory, state)
    for t in range(y_in.size(1)):
        step_logits, step_weights, state = model.decoder(y_in[:, t : t + 1], memory, state)
        assert torch.allclose(step_logits[:, 0], logits[:, t], atol=1e-10)
        if weights is not None:
            assert torch.allclose(step_weights[:, 0], weights[:, t], atol=1e-10)


@pytest.mark.parametrize("kind", ["none", "additive", "dot"])
def test_greedy_is_the_argmax_of_its_own_teacher_forced_run(kind):
    model = tiny_seq2seq(kind)
    lengths = torch.tensor([4, 6])
    src, _, _, _ = task.batch(lengths, torch.Generator().manual_seed(4))
    tokens, weights = model.greedy(src, lengths, 6)
    y_in = torch.cat([torch.full((2, 1), BOS), tokens[:, :-1]], dim=1)
    logits, forced_weights = model(src, lengths, y_in)
    assert torch.equal(logits.argmax(-1), tokens)
    if weights is not None:
        assert torch.allclose(weights, forced_weights, atol=1e-10)


def test_bahdanau_scores_use_the_previous_state():
    """Step t's weights come from s_{t-1}: the first step's from s_0 alone, before any
    target word, so they do not depend on the first input token."""
    model = tiny_seq2seq("additive")
    lengths = torch.tensor([5])
    src, y_in, _, _ = task.batch(lengths, torch.Generator().manual_seed(5))
    _, weights = model(src, lengths, y_in)
    other = y_in.clone()
    other[0, 0] = 7
    _, other_weights = model(src, lengths, other)
    assert torch.allclose(other_weights[:, 0], weights[:, 0])
    assert not torch.allclose(other_weights[:, 1], weights[:, 1])


# ---------------------------------------------------------------------------
# the toy translation


def test_translation_by_hand():
    a = task.N_NOUNS  # adjective k is token a + k
    src = torch.tensor([[a + 3, 7, 2, a + 1, a + 2, 5, PAD]])  # a3 n7 n2 a1 a2 n5
    tgt, align = task.translate(src)
    assert align.tolist() == [[1, 0, 2, 3, 5, 4, -1]]
    names = [task.target_name(t) for t in tgt[0, :6].tolist()]
    assert names == ["N7", "A3", "N2", "A1", "N5", "A2"]
    assert tgt[0, 6] == PAD


def test_translation_is_the_dictionary_along_the_alignment():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 30, (50,))
    src, y_in, y_out, align = task.batch(lengths, gen)
    for b, n in enumerate(lengths.tolist()):
        assert sorted(align[b, :n].tolist()) == list(range(n))  # a permutation
        assert torch.all((align[b, :n] - torch.arange(n)).abs() <= 1)  # local swaps only
        assert torch.equal(y_out[b, :n], src[b, align[b, :n]] + 2)
        assert y_out[b, n] == 2  # EOS
    assert (align[:, :-1] != torch.arange(align.size(1) - 1)).any()  # not the identity


def test_gpt_layout_puts_target_word_j_a_fixed_distance_after_source_word_j():
    lengths = torch.tensor([3, 5])
    src, _, y_out, _ = task.batch(lengths, torch.Generator().manual_seed(1))
    s_max = 8
    idx, targets = task.gpt_layout(src, y_out, s_max)
    assert torch.equal(idx[:, : s_max + 1], task.gpt_prompt(src, s_max))
    assert torch.all(idx[:, s_max] == task.SEP)
    for b, n in enumerate(lengths.tolist()):
        predicted = targets[b][targets[b] != -1]
        assert torch.equal(predicted[:n], y_out[b, :n] + task.SRC_VOCAB)
        assert predicted[n] == task.GPT_EOS
        assert len(predicted) == n + 1  # nothing else is scored
        # the target word j is predicted at position s_max + j, source word j sits at j
        assert torch.equal(targets[b, s_max : s_max + n], y_out[b, :n] + task.SRC_VOCAB)


def test_alignment_masses_of_attention_on_the_alignment_and_on_the_diagonal():
    align = torch.tensor([[1, 0, 2, 4, 3]])  # two swapped pairs: four moved words
    following = torch.eye(5)[align[0]][None, None]  # (1, 1, T, S): one-hot on the truth
    sums, swapped = bottleneck.alignment_masses(following, align)
    assert swapped == 4
    assert sums["aligned"].item() == 5 and sums["near"].item() == 5
    assert sums["at_swaps"].item() == 4 and sums["diagonal_at_swaps"].item() == 0
    diagonal = torch.eye(5)[None, None]  # reads source word j at step j
    sums, _ = bottleneck.alignment_masses(diagonal, align)
    assert sums["aligned"].item() == 1 and sums["near"].item() == 5
    assert sums["at_swaps"].item() == 0 and sums["diagonal_at_swaps"].item() == 4


# ---------------------------------------------------------------------------
# why sqrt(d)


def test_score_gradient_matches_the_closed_form():
    """For L = sum_i alpha_i u_i, dL/ds_i = alpha_i (u_i - L): autograd against that."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(4, 8, 16, generator=gen, dtype=torch.float64)
    u = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    for scaled in (False, True):
        m = why_sqrt_d.softmax_measures(q, k, u, scaled)
        s = (k @ q[:, :, None]).squeeze(-1)
        if scaled:
            s = s / 4.0
        alpha = torch.softmax(s, dim=-1)
        L = (alpha * u).sum(-1, keepdim=True)
        grad = alpha * (u - L)  # (4, 8)
        assert torch.allclose(m["grad"], grad.norm(dim=-1))
        grad_q = (grad[:, :, None] * k).sum(1)  # dL/dq = sum_i dL/ds_i k_i (/ sqrt(d))
        if scaled:
            grad_q = grad_q / 4.0
        assert torch.allclose(m["grad_q"], grad_q.norm(dim=-1))
        assert torch.allclose(m["max_weight"], alpha.amax(-1))


def test_score_variance_is_d_unscaled_and_1_scaled():
    gen = torch.Generator().manual_seed(0)
    row = why_sqrt_d.random_attention(256, 16, 400, gen)
    assert row["var_unscaled"] == pytest.approx(256, rel=0.1)
    assert row["var_scaled"] == pytest.approx(1, rel=0.1)
    assert row["max_weight_unscaled"] > row["max_weight_scaled"]


# ---------------------------------------------------------------------------
# the claims that need no training


def test_attention_is_differentiable():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)

    # attention() runs its softmax in float32, so the finite differences take a wider step
    # and a float32 tolerance
    def output(q, k, v):
        return attention(q, k, v)[0]

    assert torch.autograd.gradcheck(output, (q, k, v), eps=1e-3, atol=1e-3, rtol=1e-2)


def test_attention_is_a_soft_dictionary_lookup():
    """A query matching one key far better than the rest returns that key's value, as a
    dictionary would; a query matching none equally returns the mean of the values."""
    keys = torch.eye(4) * 40.0  # (4, 4)
    values = torch.arange(8.0).view(4, 2)  # (4, 2)
    out, _ = attention(keys[2:3], keys, values)
    assert torch.allclose(out, values[2:3], atol=1e-4)
    out, weights = attention(torch.zeros(1, 4), keys, values)
    assert torch.allclose(weights, torch.full((1, 4), 0.25))
    assert torch.allclose(out, values.mean(0, keepdim=True))


def test_keys_decide_the_weights_and_values_the_content():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, generator=gen)
    k = torch.randn(5, 4, generator=gen)
    v = torch.randn(5, 2, generator=gen)
    out, weights = attention(q, k, v)
    other_out, other_weights = attention(q, k, v * 2 + 1)
    assert torch.equal(other_weights, weights)  # new values: the same weights
    assert torch.allclose(other_out, out * 2 + 1, atol=1e-6)  # the same mix of the new content
    _, moved = attention(q, k.flip(0), v)
    assert not torch.allclose(moved, weights)  # new keys: new weights


def test_attention_weights_depend_on_the_input():
    """Unlike a fully connected layer's fixed weights, the same trained weights route
    differently for different inputs."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=1, n_embd=8)).eval()
    hook = explicit_attention(model)[0]
    model(torch.tensor([[1, 2, 3, 4, 5, 6]]))
    first = hook.weights.clone()
    model(torch.tensor([[6, 5, 4, 3, 2, 1]]))
    assert not torch.allclose(first, hook.weights, atol=1e-4)


def test_more_heads_cost_no_more_parameters():
    sizes = dict(block_size=8, vocab_size=11, n_layer=2, n_embd=32)
    one = GPT(GPTConfig(n_head=1, **sizes))
    eight = GPT(GPTConfig(n_head=8, **sizes))
    assert one.num_params() == eight.num_params()


# ---------------------------------------------------------------------------
# the commands: plumbing at a tiny size, not the claims


def test_bottleneck_command_end_to_end(tmp_path, repo_root):
    out = tmp_path / "out"
    args = [
        "--steps=3",
        "--lengths=(3, 5)",
        "--eval_sentences=4",
        "--hidden_size=4",
        "--gpt_embd=8",
        "--gpt_heads=2",
        "--gpt_layers=1",
        "--transformer_embd=8",
        "--transformer_heads=2",
        "--transformer_layers=1",
        "--batch_size=4",
        "--jobs=2",
        f"--out_dir={out}",
    ]
    cmd = [sys.executable, "-m", "experiments.bottleneck", *args]
    proc = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    with open(out / "bottleneck.json") as f:
        data = json.load(f)
    assert data["lengths"] == [3, 5]
    assert set(data["models"]) == set(bottleneck.MODELS)
    for m in data["models"].values():
        assert set(m["accuracy"]) == {"3", "5"}
        assert all(0.0 <= a <= 1.0 for a in m["accuracy"].values())
        assert isinstance(m["params"], int) and m["params"] > 0
        assert isinstance(m["train_seconds"], float)
    assert set(data["alignment"]) == {"additive", "dot", "general", "concat", "transformer", "gpt"}
    for a in data["alignment"].values():
        assert 0.0 <= a["aligned_mass"] <= a["near_mass"] + 1e-6
        assert a["near_mass"] <= 1.0 + 1e-6
        assert 0.0 <= a["mass_at_swaps"] <= 1.0 + 1e-6
        assert 0.0 <= a["diagonal_at_swaps"] <= 1.0 + 1e-6
    for name in ("transformer", "gpt"):
        assert (
            data["alignment"][name]["layer"] == 0 and len(data["alignment"][name]["by_head"]) == 2
        )
    attentions = data["examples"]["transformer"]["attentions"]
    assert attentions["decoder"]["look_ahead_by_head"] == [0.0, 0.0]
    assert min(attentions["encoder"]["look_ahead_by_head"]) > 0
    assert len(attentions["cross"]["weights"]) == 5  # the example: min(16, the longest)
    names = ("bottleneck.png", "bottleneck_alignment.png", "bottleneck_transformer.png")
    for name in (*names, "bottleneck.md"):
        assert os.path.getsize(out / name) > 0


def test_why_sqrt_d_command_end_to_end(tmp_path):
    args = [
        "--d_max=16",
        "--n_keys=4",
        "--samples=8",
        "--head_size=8",
        "--n_layer=1",
        "--steps=2",
        "--batch_size=4",
        "--longest=4",
        f"--out_dir={tmp_path}",
    ]
    assert why_sqrt_d.run(args) == 0
    with open(tmp_path / "why_sqrt_d.json") as f:
        data = json.load(f)
    assert data["d"] == [4, 8, 16]
    keys = ["var", "max_weight", "grad"]
    for key in [f"{k}_{s}" for k in keys for s in ("unscaled", "scaled")]:
        assert len(data[key]) == 3
    assert set(data["gpt"]) == {"gpt2_scaled", "gpt2_unscaled", "unit_scaled", "unit_unscaled"}
    assert os.path.getsize(tmp_path / "why_sqrt_d.png") > 0


def test_path_length_command_end_to_end(tmp_path):
    args = ["--distances=(2, 3)", "--steps=2", "--lengths=(4, 8)", "--repeats=1"]
    assert path_length.run([*args, f"--out_dir={tmp_path}"]) == 0
    with open(tmp_path / "path_length.json") as f:
        data = json.load(f)
    assert set(data["recall"]) == {"rnn", "gru", "attention"}
    assert len(data["recall"]["gru"]) == 2
    assert len(data["timing"]["attention_seconds"]) == 2


@pytest.mark.parametrize(
    "command,argv,words",
    [
        (bottleneck, ["--stepz=3"], "did you mean 'steps'"),
        (bottleneck, ["--lengths=(1, 5)"], "at least 3"),
        (bottleneck, ["--models=('none', 'lstm')"], "choose from"),
        (bottleneck, ["--models=none"], "models expects tuple"),
        (bottleneck, ["--jobs=0"], "at least 1"),
        (bottleneck, ["--transformer_embd=12", "--transformer_heads=4"], "even head size"),
        (bottleneck, ["--gpt_embd=6", "--gpt_heads=2"], "even head size"),
        (bottleneck, ["extra"], "unexpected argument"),
        (why_sqrt_d, ["--d_max=2"], "at least 4"),
        (why_sqrt_d, ["--steps=many"], "steps expects int"),
        (path_length, ["--distances=(0, 4)"], "at least 1"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(command, argv, words, capsys):
    assert command.run(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert words in err


@pytest.mark.parametrize("command", [bottleneck, why_sqrt_d, path_length])
def test_an_output_folder_that_cannot_be_made_is_one_line_and_no_work(command, tmp_path, capsys):
    """A file where the folder should be: exit 2 and the option to change, before any
    training (a training run would take seconds even at the default sizes' first step)."""
    (tmp_path / "file").write_text("")
    out_dir = tmp_path / "file" / "results"
    assert command.run([f"--out_dir={out_dir}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"cannot write into {out_dir}" in err and "pass --out_dir=DIR" in err


def test_a_write_that_fails_mid_run_is_one_line_and_exit_1(tmp_path, capsys):
    """An OSError after the work started (here the figure's folder removed under the
    run) is the run failing: one line naming the file, exit 1 (support/cli.py)."""

    @dataclasses.dataclass
    class Settings:
        out_dir: str = str(tmp_path / "gone")

    def main(cfg):
        os.rmdir(cfg.out_dir)
        with open(os.path.join(cfg.out_dir, "result.json"), "w") as f:
            f.write("{}")

    (tmp_path / "gone").mkdir()
    assert cli.run(main, [], "doc", Settings) == 1
    assert os.path.isdir(tmp_path) and not (tmp_path / "gone").exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "cannot read or write" in err and "result.json" in err
