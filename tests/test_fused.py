"""GPTConfig.fused: the attention a learner reads in model.py is the one that trains.

fused=True runs softmax attention in F.scaled_dot_product_attention; fused=False runs
model.attention() and model.causal_mask() as written, on every path: training, a cache,
a sliding window, sinks, StreamingLLM's rolling cache. The two agree in float32 to
rounding, and an edit to attention() reaches the training loss only when fused=False."""

import math

import pytest
import torch
from conftest import read_log, tiny_run

import model
import train
from model import GPT, GPTConfig
from support import engine

OPTIONS = [
    dict(),
    dict(n_kv_head=2),
    dict(rope=True, qk_norm=True),
    dict(sliding_window=5),
    dict(sliding_window=5, sink_tokens=2, rope=True),
]


def twins(seed=0, **options):
    """The same weights, once fused and once through attention() as written."""
    args = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
    torch.manual_seed(seed)
    fused = GPT(GPTConfig(**args, **options)).eval()
    written = GPT(GPTConfig(**args, **options, fused=False)).eval()
    written.load_state_dict(fused.state_dict())
    return fused, written


def count_calls(monkeypatch):
    """Count the calls of model.attention (what the explicit path runs)."""
    calls = []
    original = model.attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "attention", counted)
    return calls


@pytest.mark.stock_formula
@pytest.mark.parametrize("options", OPTIONS)
def test_written_attention_gives_the_fused_numbers_on_every_path(options, monkeypatch):
    fused, written = twins(**options)
    idx = torch.randint(0, 37, (2, 16))
    targets = torch.randint(0, 37, (2, 16))
    calls = count_calls(monkeypatch)
    # the training forward, with its loss
    logits_f, loss_f = fused(idx, targets)
    assert calls == []  # the fused model never runs attention()
    logits_w, loss_w = written(idx, targets)
    assert len(calls) == 2  # once per layer
    assert torch.allclose(logits_w, logits_f, atol=1e-5)
    assert math.isclose(loss_w.item(), loss_f.item(), rel_tol=1e-6)
    # through the cache, a chunk at a time (a rolling cache with a window)
    cache = written.make_kv_cache(2)
    chunks = [written(idx[:, :7], kv_cache=cache)[0], written(idx[:, 7:], kv_cache=cache)[0]]
    assert torch.allclose(torch.cat(chunks, dim=1), logits_f, atol=1e-5)
    # generation past the context: the same greedy tokens
    prompt = idx[:, :3]
    n = 24
    assert torch.equal(
        written.generate(prompt, n, temperature=0), fused.generate(prompt, n, temperature=0)
    )


@pytest.mark.stock_formula
def test_streaming_cache_with_sinks_goes_through_attention(monkeypatch):
    fused, written = twins(seed=1, rope=True)
    prompt = torch.randint(0, 37, (1, 4))
    calls = count_calls(monkeypatch)
    got = engine.generate(written, prompt, 30, temperature=0, window=8, sinks=2)
    assert len(calls) > 0
    want = engine.generate(fused, prompt, 30, temperature=0, window=8, sinks=2)
    assert torch.equal(got, want)


def unscaled_attention(q, k, v, mask=None, dropout_p=0.0):
    """The lectures' question answered by an edit: attention() without the / sqrt(d)."""
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return weights @ v, weights


def train_losses(data_root, out_dir, *extra):
    train.main(tiny_run(data_root, out_dir, "--max_iters=20", "--eval_interval=10", *extra))
    return [(rec["iter"], rec["train_loss"], rec["val_loss"]) for rec in read_log(out_dir)]


@pytest.mark.stock_formula
def test_an_edit_to_attention_trains_only_with_fused_false(data_root, tmp_path, monkeypatch):
    # n_embd 64 over 2 heads: head size 32, where the missing / sqrt(d) is a 5.7x sharper softmax
    size = ("--n_head=2", "--n_embd=64")
    as_written = train_losses(data_root, tmp_path / "a", "--fused=False", *size)
    fused = train_losses(data_root, tmp_path / "b", "--fused=True", *size)
    # unedited, the two kernels train alike (float32: not bit for bit)
    for (_, train_a, val_a), (_, train_b, val_b) in zip(as_written, fused):
        assert math.isclose(train_a, train_b, rel_tol=1e-4)
        assert math.isclose(val_a, val_b, rel_tol=1e-4)
    monkeypatch.setattr(model, "attention", unscaled_attention)
    edited_written = train_losses(data_root, tmp_path / "c", "--fused=False", *size)
    edited_fused = train_losses(data_root, tmp_path / "d", "--fused=True", *size)
    # fused=True never runs attention(): the edit changes nothing, bit for bit
    assert edited_fused == fused
    # fused=False trains the edited function. At initialisation the scores are near 0
    # either way (weights of std 0.02), so the runs part as the weights grow
    _, train_a, val_a = as_written[-1]
    _, train_c, val_c = edited_written[-1]
    assert abs(train_c - train_a) > 1e-2
    assert abs(val_c - val_a) > 1e-2


def test_context_parallelism_refuses_written_attention():
    _, written = twins()
    with pytest.raises(ValueError, match="fused=True"):
        written.split_context(object())
