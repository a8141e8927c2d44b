"""GPTConfig.token_shift, token shift on the embeddings (RWKV's time shift, as a learned gain
per channel), against computations done another way: at its initial weights, the plain model
bit for bit; with others, the embedding written out position by position and fed through the
plain model's blocks; on every cache and path (a plain cache, the decode step, a rolling
window, linear attention), the full forward (tests/test_invariants.py's checks); then trained
by train.py, sampled by sample.py, and refused in one line where it cannot go."""

import pytest
import test_invariants as invariants
import torch
from conftest import tiny_run, tiny_settings

import export
import model
import sample
import train
from model import GPT, GPTConfig
from support import context_parallel, export_gguf, export_lens
from support.export_hf import read_model
from support.loading import load_checkpoint
from support.optim import make_optimizers

SIZES = invariants.SIZES
RECIPE = dict(rope=True, qk_norm=True, activation="relu2", bias=False)


@pytest.mark.parametrize("options", [dict(), RECIPE], ids=["gpt2", "recipe"])
def test_it_starts_as_the_plain_model(options):
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**SIZES, **options)).eval()
    shifted = GPT(GPTConfig(**SIZES, **options, token_shift=True)).eval()
    missing, unexpected = shifted.load_state_dict(plain.state_dict(), strict=False)
    assert missing == ["shift_gain"] and not unexpected
    assert shifted.num_params() == plain.num_params() + SIZES["n_embd"]
    idx = invariants.tokens(2)
    torch.testing.assert_close(shifted(idx)[0], plain(idx)[0], rtol=0, atol=0)
    prompt = idx[:, :3]
    assert torch.equal(
        shifted.generate(prompt, 20, temperature=0), plain.generate(prompt, 20, temperature=0)
    )


@pytest.mark.parametrize("options", [dict(), RECIPE], ids=["gpt2", "recipe"])
def test_each_embedding_is_mixed_with_the_one_before_it(options):
    """x_t + g * x_{t-1} with x the token embeddings (nothing before position 0), written
    out a position at a time, then the plain model's own position embedding, blocks and head:
    the same logits as the shifted model's forward."""
    shifted = invariants.build(model, True, dict(options, token_shift=True))
    assert shifted.shift_gain.abs().min() > 0
    idx = invariants.tokens(2)
    wte = shifted.transformer.wte.weight
    g = shifted.shift_gain
    with torch.no_grad():
        x = torch.zeros(2, idx.size(1), SIZES["n_embd"])
        for t in range(idx.size(1)):
            x[:, t] = wte[idx[:, t]]
            if t > 0:
                x[:, t] += g * wte[idx[:, t - 1]]
        rotary = None
        if shifted.config.rope:
            rotary = model.rotary_tables(SIZES["n_embd"] // SIZES["n_head"], torch.arange(16))
        else:
            x = x + shifted.transformer.wpe.weight[: idx.size(1)]
        for block in shifted.transformer.h:
            x = block(x, rotary=rotary)
        expected = shifted.lm_head(shifted.transformer.ln_f(x))
        logits, _ = shifted(idx)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


def test_the_gains_gradient_is_the_previous_embedding_against_the_loss_gradient():
    """At g = 0, dL/dg = sum over batch and positions t >= 1 of dL/dx_t * x_{t-1}, with x
    the token embeddings: the gradient computed by hand from the embeddings."""
    torch.manual_seed(3)
    gpt = GPT(GPTConfig(**SIZES, token_shift=True))
    idx = invariants.tokens(2)
    x = gpt.transformer.wte(idx).detach().requires_grad_()  # the embeddings, to read dL/dx
    gpt.transformer.wte.register_forward_hook(lambda module, args, out: x)
    _, loss = gpt(idx, idx)
    loss.backward()
    by_hand = (x.grad[:, 1:] * x[:, :-1]).sum((0, 1))  # position t sees t - 1's embedding
    assert gpt.shift_gain.grad.abs().sum() > 0
    torch.testing.assert_close(gpt.shift_gain.grad, by_hand)


# the caches a shifted model decodes through: the plain one (and its fixed-shape decode
# step), a rolling window's, linear attention's running sums
CONFIGS = {
    "recipe": dict(RECIPE, token_shift=True),
    "sliding window": dict(token_shift=True, sliding_window=5, rope=True),
    "linear": dict(token_shift=True, attention="linear", n_kv_head=2),
}


@pytest.mark.parametrize("fused", [True, False], ids=["fused=True", "fused=False"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_cache_and_path_keeps_the_invariants(config, fused):
    gpt = invariants.build(model, fused, CONFIGS[config])
    invariants.check_causal(gpt)
    invariants.check_cache(gpt)
    invariants.check_batch(gpt)
    if config == "recipe":
        invariants.check_decode_step(gpt)


def test_the_cache_forgets_the_last_embedding_when_reset():
    """A cache reused from position 0 (generation's window slides that way) mixes nothing
    into the first embedding: its logits are a fresh cache's."""
    gpt = invariants.build(model, True, CONFIGS["recipe"])
    idx = invariants.tokens(2)
    with torch.no_grad():
        fresh, _ = gpt(idx[:, :6], kv_cache=gpt.make_kv_cache(2))
        cache = gpt.make_kv_cache(2)
        gpt(idx[:, 6:], kv_cache=cache)
        cache.reset()
        reused, _ = gpt(idx[:, :6], kv_cache=cache)
    torch.testing.assert_close(reused, fresh, rtol=0, atol=0)


def test_muon_leaves_the_gain_to_adamw():
    gpt = GPT(GPTConfig(**SIZES, token_shift=True))
    muon, adamw = make_optimizers(gpt, tiny_settings(optimizer="muon"), "cpu", "float32")
    in_muon = {id(p) for group in muon.param_groups for p in group["params"]}
    # AdamW's group without weight decay, as for the other gains and biases
    in_adamw = {id(p) for p in adamw.param_groups[1]["params"]}
    assert id(gpt.shift_gain) not in in_muon and id(gpt.shift_gain) in in_adamw


def test_train_py_trains_it_and_sample_py_samples_it(data_root, tmp_path, capsys):
    out = tmp_path / "run"
    argv = tiny_run(data_root, out, "--token_shift=True", "--max_iters=6", "--eval_interval=6")
    train.main(argv + ["--optimizer=muon", "--eval_iters=1"])
    ckpt = load_checkpoint(str(out))
    assert ckpt["model_args"]["token_shift"] is True
    gain = ckpt["model"]["shift_gain"]
    assert gain.shape == (ckpt["model_args"]["n_embd"],) and gain.abs().max() > 0
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


def test_export_py_writes_it_for_transformers_and_the_rest_refuse_it(data_root, tmp_path, capsys):
    """export.py's folder holds the trained gain (tests/test_export.py checks its logits,
    generation and beam search in transformers); GGUF, TransformerLens and context
    parallelism have no place for it, and say so in one line."""
    config = GPTConfig(**SIZES, token_shift=True)
    assert "token shift" in export_lens.refusal(config)
    assert "token shift" in export_gguf.refusal(config, tok=None)
    with pytest.raises(ValueError, match="token shift"):
        context_parallel.check(tiny_settings(token_shift=True, context_parallel=2), 2)
    out = tmp_path / "run"
    train.main(tiny_run(data_root, out, "--token_shift=True", "--max_iters=2", "--eval_iters=1"))
    capsys.readouterr()
    assert export.run([f"--out_dir={out}", f"--to={tmp_path / 'hf'}"]) == 0
    trained = load_checkpoint(str(out))["model"]
    back = read_model(str(tmp_path / "hf")).state_dict()
    assert back["shift_gain"].abs().max() > 0
    for key, t in trained.items():
        assert torch.equal(back[key], t.float()), key
