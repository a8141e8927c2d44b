"""Linear attention (GPTConfig.attention = "linear") against independent oracles:
the step-by-step recurrence written out here, full re-scoring with the no-cache
forward, and the implied weights multiplied back onto the values."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from data.tokenizer import get_tokenizer
from model import GPT, GPTConfig, linear_attention
from support import engine
from support.engine import generate_compiled


def recurrence(q, k, v, S=None, z=None):
    """y_t = phi(q_t) S_t / phi(q_t) . z_t, one position at a time, float64."""
    q, k, v = (t.double() for t in (q, k, v))
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    B, nh, T, hs = q.shape
    S = torch.zeros(B, nh, hs, v.size(-1), dtype=torch.float64) if S is None else S.double()
    z = torch.zeros(B, nh, hs, dtype=torch.float64) if z is None else z.double()
    ys = []
    for t in range(T):
        S = S + phi_k[:, :, t, :, None] * v[:, :, t, None, :]  # outer product phi(k_t) v_t^T
        z = z + phi_k[:, :, t]
        num = torch.einsum("bhd,bhde->bhe", phi_q[:, :, t], S)
        den = torch.einsum("bhd,bhd->bh", phi_q[:, :, t], z)
        ys.append(num / den[..., None])
    return torch.stack(ys, dim=2), S, z


def qkv(T, B=2, nh=3, hs=8, hv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, nh, T, hs, generator=g),
        torch.randn(B, nh, T, hs, generator=g),
        torch.randn(B, nh, T, hv, generator=g),
    )


@pytest.mark.parametrize("T, chunk", [(150, 64), (7, 4), (64, 64), (1, 64)])
def test_chunked_form_equals_the_recurrence(T, chunk):
    q, k, v = qkv(T)
    y, _ = linear_attention(q, k, v, chunk=chunk)
    expected, _, _ = recurrence(q, k, v)
    assert y.dtype == torch.float32
    assert (y.double() - expected).abs().max() < 1e-5


def test_state_carries_the_past_and_is_updated_in_place():
    q, k, v = qkv(150)
    S, z = torch.zeros(2, 3, 8, 6), torch.zeros(2, 3, 8)
    state = [S, z]
    first, _ = linear_attention(q[:, :, :70], k[:, :, :70], v[:, :, :70], state, chunk=32)
    rest = [
        linear_attention(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state)[0]
        for t in range(70, 150)
    ]  # one token at a time, as in decoding
    expected, S_ref, z_ref = recurrence(q, k, v)
    got = torch.cat([first] + rest, dim=2)
    assert (got.double() - expected).abs().max() < 1e-5
    assert state[0] is S and state[1] is z  # the same tensors, brought up to date
    assert torch.allclose(S.double(), S_ref, rtol=1e-5, atol=1e-4) and torch.allclose(
        z.double(), z_ref, rtol=1e-5
    )


def test_implied_weights_reproduce_the_output():
    q, k, v = qkv(20)
    y, w = linear_attention(q, k, v, return_attention=True)
    assert w.shape == (2, 3, 20, 20)
    torch.testing.assert_close(w @ v, y, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 20), atol=1e-6, rtol=0)
    assert (w >= 0).all() and (w.triu(1) == 0).all()
    # the weights are phi(q_i).phi(k_j) / phi(q_i).z_i, written out
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    i, j = 11, 4
    expected = (phi_q[..., i, :] * phi_k[..., j, :]).sum(-1) / (
        phi_q[..., i, :] * phi_k[..., : i + 1, :].sum(2)
    ).sum(-1)
    torch.testing.assert_close(w[..., i, j], expected)


def tiny_model(seed=0, **changes):
    torch.manual_seed(seed)
    config = dict(
        block_size=16, vocab_size=40, n_layer=2, n_head=4, n_embd=32, attention="linear", rope=True
    )
    model = GPT(GPTConfig(**(config | changes)))
    with torch.no_grad():  # weights larger than at init, so the attention shapes the tokens
        for block in model.transformer.h:
            block.attn.c_attn.weight.normal_(0.0, 0.3)
    return model.eval()


@pytest.mark.parametrize("changes", [{}, {"n_kv_head": 2}, {"rope": False}])
def test_state_generation_equals_no_cache_forward(changes):
    """Within block_size: the same greedy tokens with and without the state."""
    model = tiny_model(**changes)
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    with_state = model.generate(prompt, 11, temperature=0)
    assert torch.equal(
        with_state, engine.generate(model, prompt, 11, temperature=0, use_cache=False)
    )
    assert type(model.make_kv_cache(2)).__name__ == "LinearState"


def test_state_goes_on_past_block_size_and_matches_full_rescoring():
    """A rope model keeps its state past block_size, never sliding; the oracle is the
    same weights with a longer block_size, scoring the whole text in one forward."""
    model = tiny_model()
    long = GPT(dataclasses.replace(model.config, block_size=256))  # its rotary table is built whole
    long.load_state_dict(model.state_dict())
    long.eval()
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(2))
    state = model.make_kv_cache(2)
    nbytes = state.nbytes
    logprobs, idx = [], prompt
    with torch.no_grad():
        logits, _ = model(prompt, kv_cache=state)
        for _ in range(155):  # to 10 x block_size
            logprobs.append(torch.log_softmax(logits[:, -1], dim=-1))
            token = logits[:, -1].argmax(-1, keepdim=True)
            idx = torch.cat([idx, token], dim=1)
            logits, _ = model(token, kv_cache=state)
        full, _ = long(idx)
        same, _ = model(idx)  # the no-cache forward goes past block_size too
    assert state.pos == 160 and state.nbytes == nbytes == 2 * 2 * 4 * (8 * 8 + 8) * 4  # fixed size
    expected = torch.log_softmax(full[:, 4:-1], dim=-1)
    assert (torch.stack(logprobs, dim=1) - expected).abs().max() < 1e-4
    assert torch.equal(idx[:, 5:], full[:, 4:-1].argmax(-1))
    torch.testing.assert_close(same, full, atol=1e-5, rtol=1e-5)
    # generate does the same: greedy tokens past block_size, with and without the state
    assert torch.equal(model.generate(prompt, 155, temperature=0), idx)
    assert torch.equal(
        engine.generate(model, prompt, 40, temperature=0, use_cache=False), idx[:, :45]
    )


def test_learned_positions_slide_as_softmax_does():
    model = tiny_model(rope=False)
    state = model.make_kv_cache(1)
    assert state.block_size == 16
    prompt = torch.tensor([[1, 2, 3]])
    assert torch.equal(
        model.generate(prompt, 40, temperature=0),
        engine.generate(model, prompt, 40, temperature=0, use_cache=False),
    )


def test_return_attention_on_a_linear_model():
    model = tiny_model()
    idx = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, maps = model.attention_maps(idx)
        plain, _ = model(idx)
    torch.testing.assert_close(logits, plain, atol=1e-5, rtol=1e-5)
    assert len(maps) == 2 and maps[0].shape == (2, 4, 12, 12)
    torch.testing.assert_close(maps[1].sum(-1), torch.ones(2, 4, 12))


def test_training_gradients_flow():
    model = tiny_model()
    model.train()
    idx = torch.randint(0, 40, (4, 16))
    _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and all(
        p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters()
    )


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="attention must be 'softmax' or 'linear'"):
        GPTConfig(attention="flash")
    with pytest.raises(ValueError, match="softmax attention"):
        GPT.from_pretrained("gpt2", attention="linear")  # refused before any file is read
    with pytest.raises(ValueError, match="compiled decoding runs softmax attention"):
        generate_compiled(tiny_model(), torch.tensor([[1, 2]]), 3)


def test_softmax_stays_the_default():
    config = GPTConfig(block_size=16, vocab_size=40, n_layer=1, n_head=2, n_embd=16, rope=True)
    assert config.attention == "softmax" and config.context == 16
    assert type(GPT(config).make_kv_cache(1)).__name__ == "KVCache"


def test_train_sample_and_heads_on_a_linear_checkpoint(data_root, tmp_path, capsys):
    """--attention=linear is a config key; the checkpoint carries it, and sample.py
    (with its attention maps) and heads.py load the model from it."""
    import numpy as np

    import heads
    import sample
    import train
    from support.loading import load_checkpoint

    out = str(tmp_path / "out")
    train.main(
        [
            "--dataset=shakespeare_char",
            f"--data_root={data_root}",
            f"--out_dir={out}",
            "--n_layer=2",
            "--n_head=2",
            "--n_embd=32",
            "--block_size=32",
            "--batch_size=8",
            "--gradient_accumulation_steps=1",
            "--device=cpu",
            "--compile=False",
            "--dtype=float32",
            "--eval_iters=2",
            "--max_iters=20",
            "--eval_interval=20",
            "--warmup_iters=2",
            "--learning_rate=3e-3",
            "--rope=True",
            "--attention=linear",
        ]
    )
    ckpt = load_checkpoint(out)
    assert ckpt["model_args"]["attention"] == "linear" and ckpt["config"]["attention"] == "linear"
    capsys.readouterr()
    assert (
        sample.run(
            [
                f"--out_dir={out}",
                "--prompt=ROMEO:",
                "--num_samples=1",
                "--max_new_tokens=40",
                "--temperature=0",
                "--seed=1",
                "--attn_span=all",  # the whole text, past the block
            ]
        )
        == 0
    )
    text = capsys.readouterr().out.split("\n" + "-" * 40 + "\n")[0]
    assert (
        text.startswith("ROMEO:") and len(text) == 46
    )  # 6 + 40 characters, past the 32-token block
    z = np.load(f"{out}/attention/attention.npz")
    assert z["layer_0"].shape == (2, 46, 46)  # every token: rope lets a linear model see them all
    np.testing.assert_allclose(z["layer_1"].sum(-1), 1.0, atol=1e-5)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    tok = get_tokenizer(ckpt["tokenizer"])
    expected = model.eval().generate(torch.tensor([tok.encode("ROMEO:")]), 40, temperature=0)
    assert tok.decode(expected[0].tolist()) == text  # the same text as generating with the state
    assert heads.run([f"--out_dir={out}", "--max_windows=4", "--seed=7"]) == 0
    assert "layer" in capsys.readouterr().out
    assert sample.run([f"--out_dir={out}", "--prompt=ROMEO:", "--compile", "--attn_dir="]) == 2
    assert capsys.readouterr().err.strip().endswith("drop it for this linear-attention model")
    # a window has no cache to shape here: it was ignored, and the summary named one
    assert sample.run([f"--out_dir={out}", "--window=8", "--sinks=2", "--attn_dir="]) == 2
    printed, err = capsys.readouterr()
    assert printed == "" and err.strip() == (
        "error: --window and --sinks shape a softmax model's KV cache; this linear-attention "
        "model keeps a fixed-size state instead: drop them"
    )


def test_gpt2_weights_with_linear_attention_is_refused(data_root, tmp_path, capsys):
    import train

    with pytest.raises(SystemExit):
        train.main(
            [
                f"--data_root={data_root}",
                f"--out_dir={tmp_path}",
                "--init_from=gpt2",
                "--dataset=shakespeare_char",
                "--attention=linear",
                "--device=cpu",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "softmax attention" in err, err
