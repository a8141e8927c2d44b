"""GPTConfig.kv_shift, KV shifting (Xu et al. 2024, arXiv 2411.19574), against computations
done another way: at its initial weights, the plain model bit for bit; with others, the
formula written out position by position and fed to the fused kernel; on every path and
cache (fused, fused=False, a rolling window, linear attention, rotary), the full forward
(tests/test_invariants.py's checks); then trained by train.py, sampled by sample.py, and
refused in one line where it cannot go."""

import pytest
import test_invariants as invariants
import torch
import torch.nn.functional as F
from conftest import tiny_run, tiny_settings

import export
import model
import sample
import train
from model import GPT, GPTConfig, MultiHeadAttention, apply_rotary, rotary_tables
from support import context_parallel, export_gguf, export_lens
from support.loading import load_checkpoint
from support.optim import make_optimizers

SIZES = invariants.SIZES


@pytest.mark.parametrize("fused", [True, False])
def test_it_starts_as_the_plain_model(fused):
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**SIZES, fused=fused)).eval()
    shifted = GPT(GPTConfig(**SIZES, fused=fused, kv_shift=True)).eval()
    missing, unexpected = shifted.load_state_dict(plain.state_dict(), strict=False)
    names = [f"transformer.h.{i}.attn.shift_{w}" for i in range(2) for w in ("now", "prev")]
    assert sorted(missing) == sorted(names) and not unexpected
    # per layer, a1 and b1 of each of the 4 key/value heads, and a2 and b2
    assert shifted.num_params() == plain.num_params() + 2 * 4 * 4
    idx = invariants.tokens(2)
    torch.testing.assert_close(shifted(idx)[0], plain(idx)[0], rtol=0, atol=0)
    prompt = idx[:, :3]
    assert torch.equal(
        shifted.generate(prompt, 20, temperature=0), plain.generate(prompt, 20, temperature=0)
    )


def shifted_by_hand(x, previous_weight, now_weight):
    """now_weight[h] x_i + previous_weight[h] x_{i-1} for x (B, T, nkv, hs), one position
    and one head at a time, with nothing before position 0."""
    out = torch.zeros_like(x)
    for i in range(x.size(1)):
        for h in range(x.size(2)):
            out[:, i, h] = now_weight[h] * x[:, i, h]
            if i > 0:
                out[:, i, h] += previous_weight[h] * x[:, i - 1, h]
    return out


@pytest.mark.parametrize(
    "options", [dict(), dict(n_kv_head=2, qk_norm=True, rope=True)], ids=["plain", "gqa-rope"]
)
def test_each_key_and_value_is_mixed_with_the_one_before_it(options):
    """Xu et al.'s K_i = a1 k_i + a2 k_{i-1}, V_i = b1 v_i + b2 v_{i-1} per key/value head,
    before QK-norm and rotary turn the keys, then causal attention (the fused kernel fed
    the shifted keys and values) and W_O."""
    torch.manual_seed(1)
    config = GPTConfig(**SIZES, kv_shift=True, **options)
    mha = MultiHeadAttention(config).eval()
    nh, nkv, hs = config.n_head, config.n_kv_head, 8
    with torch.no_grad():
        mha.shift_now.uniform_(-1.0, 2.0)
        mha.shift_prev.uniform_(-1.0, 2.0)
    B, T = 2, 7
    x = torch.randn(B, T, 32)
    cos, sin = rotary_tables(hs, torch.arange(T))
    rotary = None
    if config.rope:
        rotary = (cos, sin)
    with torch.no_grad():
        y = mha(x, rotary=rotary)
        q, k, v = mha.c_attn(x).split([32, nkv * hs, nkv * hs], dim=-1)
        a1, b1 = mha.shift_now.split(nkv)
        a2, b2 = mha.shift_prev.split(nkv)
        k = shifted_by_hand(k.view(B, T, nkv, hs), a2, a1).transpose(1, 2)  # (B, nkv, T, hs)
        v = shifted_by_hand(v.view(B, T, nkv, hs), b2, b1).transpose(1, 2)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        if config.qk_norm:
            q = F.rms_norm(q, (hs,))
            k = F.rms_norm(k, (hs,))
        if config.rope:
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        group = nh // nkv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        expected = mha.c_proj(heads.transpose(1, 2).reshape(B, T, 32))
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-5)


# the configurations test_invariants.py leaves out: a rolling window's cache, linear
# attention's running sums (grouped-query, so that the state and the shift differ in heads)
CONFIGS = {
    "sliding window": dict(kv_shift=True, sliding_window=5, rope=True),
    "linear": dict(kv_shift=True, attention="linear", n_kv_head=2),
}


@pytest.mark.parametrize("fused", [True, False], ids=["fused=True", "fused=False"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_cache_and_path_keeps_the_invariants(config, fused):
    gpt = invariants.build(model, fused, CONFIGS[config])
    # the shift is at work: its weights are off (1, 0)
    assert gpt.transformer.h[0].attn.shift_prev.abs().min() > 0
    invariants.check_causal(gpt)
    invariants.check_cache(gpt)
    invariants.check_batch(gpt)
    invariants.check_heads(gpt)


def test_the_cache_forgets_the_last_position_when_reset():
    """A cache reused from position 0 (generation's window slides that way) mixes nothing
    into the first key: its logits are a fresh cache's."""
    gpt = invariants.build(model, True, dict(kv_shift=True))
    idx = invariants.tokens(2)
    with torch.no_grad():
        fresh, _ = gpt(idx[:, :6], kv_cache=gpt.make_kv_cache(2))
        cache = gpt.make_kv_cache(2)
        gpt(idx[:, 6:], kv_cache=cache)
        cache.reset()
        reused, _ = gpt(idx[:, :6], kv_cache=cache)
    torch.testing.assert_close(reused, fresh, rtol=0, atol=0)


def test_muon_leaves_the_shift_weights_to_adamw():
    gpt = GPT(GPTConfig(**SIZES, kv_shift=True))
    muon, adamw = make_optimizers(gpt, tiny_settings(optimizer="muon"), "cpu", "float32")
    shift = {id(p) for name, p in gpt.named_parameters() if ".shift_" in name}
    in_muon = {id(p) for group in muon.param_groups for p in group["params"]}
    # AdamW's group without weight decay, as for the other gains and biases
    in_adamw = {id(p) for p in adamw.param_groups[1]["params"]}
    assert len(shift) == 4 and not shift & in_muon and shift <= in_adamw


def test_train_py_trains_it_and_sample_py_samples_it(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    argv = tiny_run(data_root, out, "--kv_shift=True", "--max_iters=6", "--eval_interval=6")
    train.main(argv + ["--optimizer=muon", "--eval_iters=1"])
    ckpt = load_checkpoint(str(out))
    assert ckpt["model_args"]["kv_shift"] is True
    shift_prev = ckpt["model"]["transformer.h.0.attn.shift_prev"]
    assert shift_prev.shape == (4,) and shift_prev.abs().max() > 0  # trained off 0
    capsys.readouterr()
    # sampled (the same draws from the same seed), through the KV cache and without it
    argv = [f"--out_dir={out}", "--prompt=ROMEO:", "--max_new_tokens=60", "--num_samples=1"]
    argv += ["--temperature=1.0", "--seed=3", "--attn_dir="]
    texts = []
    for extra in ([], ["--no_cache"]):
        assert sample.run(argv + extra) == 0
        texts.append(capsys.readouterr().out.split("\n---")[0])
    assert texts[0] == texts[1] and texts[0].startswith("ROMEO:")
    assert len(set(texts[0])) > 10  # 60 characters drawn, not one repeated


def test_exports_and_context_parallelism_refuse_it_in_one_line(data_root, tmp_path, capsys):
    config = GPTConfig(**SIZES, kv_shift=True)
    assert "KV shifting" in export_lens.refusal(config)
    assert "KV shifting" in export_gguf.refusal(config, tok=None)
    with pytest.raises(ValueError, match="KV shifting"):
        context_parallel.check(tiny_settings(kv_shift=True, context_parallel=2), 2)
    out = tmp_path / "run"
    train.main(tiny_run(data_root, out, "--kv_shift=True", "--max_iters=1", "--eval_iters=1"))
    capsys.readouterr()
    assert export.run([f"--out_dir={out}", f"--to={tmp_path / 'hf'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "KV shifting (kv_shift)" in err[0], err
    assert not (tmp_path / "hf").exists()
