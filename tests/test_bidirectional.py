"""Same module, different mask (experiments/bidirectional.py and the mask argument of
model.py's Block and MultiHeadAttention): the same weights with the causal mask removed
against the bidirectional forward computed another way (F.scaled_dot_product_attention
with is_causal=False on the weights taken apart by hand), BERT's masking counted, the
neighbour and look-ahead measures by hand, and the command at a tiny size."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

from experiments import bidirectional
from model import GPT, Block, GPTConfig, causal_mask


def tiny_gpt(fused=True, seed=0):
    torch.manual_seed(seed)
    config = GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=8, fused=fused)
    return GPT(config).double().eval()


def by_hand(model, idx, causal):
    """GPT-2's forward written out with the weights taken apart: each layer's heads by
    F.scaled_dot_product_attention, is_causal as given, then W_O, the MLP, the head."""
    B, T = idx.shape
    C = model.config.n_embd
    nh = model.config.n_head
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(T))
    for block in model.transformer.h:
        q, k, v = block.attn.c_attn(block.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, nh, T, hs)
        x = x + block.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + block.mlp(block.ln_2(x))
    return model.lm_head(model.transformer.ln_f(x))


@pytest.mark.parametrize("fused", [True, False])
def test_the_same_weights_without_the_mask_are_the_bidirectional_forward(fused):
    """The two models differ only by the mask: with it, forward() is the GPT's own
    forward; without it, the same weights give the bidirectional forward computed another
    way. (fused=False runs attention(), whose softmax is float32: hence 1e-6.)"""
    model = tiny_gpt(fused)
    idx = torch.randint(0, 11, (3, 12), generator=torch.Generator().manual_seed(1))
    causal = bidirectional.forward(model, idx, causal=True)
    assert torch.allclose(causal, model(idx)[0], atol=1e-12)
    assert torch.allclose(causal, by_hand(model, idx, causal=True), atol=1e-6)
    both_ways = bidirectional.forward(model, idx, causal=False)
    assert torch.allclose(both_ways, by_hand(model, idx, causal=False), atol=1e-6)
    assert not torch.allclose(both_ways, causal, atol=1e-3)


def test_only_the_bidirectional_model_sees_later_characters():
    model = tiny_gpt()
    idx = torch.randint(0, 10, (1, 10), generator=torch.Generator().manual_seed(2))
    later = idx.clone()
    later[0, -1] = (idx[0, -1] + 1) % 10
    for causal in (True, False):
        before = bidirectional.forward(model, idx, causal)[:, :-1]
        after = bidirectional.forward(model, later, causal)[:, :-1]
        assert torch.allclose(before, after, atol=1e-12) == causal


@pytest.mark.parametrize("fused", [True, False])
def test_a_block_given_the_causal_mask_is_the_block_given_none(fused):
    """model.py's mask argument: the causal mask passed in is the default; all True is
    not; the fused kernel and attention() agree on a mask passed in."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=8, fused=fused)
    block = Block(config).double().eval()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    default = block(x)
    assert torch.allclose(block(x, mask=causal_mask(6, 6)), default, atol=1e-12)
    everything = torch.ones(6, 6, dtype=torch.bool)
    assert not torch.allclose(block(x, mask=everything), default, atol=1e-3)
    other = Block(GPTConfig(n_layer=1, n_head=2, n_embd=8, fused=not fused)).double().eval()
    other.load_state_dict(block.state_dict())
    assert torch.allclose(other(x, mask=everything), block(x, mask=everything), atol=1e-6)


def test_mask_characters_hides_fifteen_percent_and_targets_only_those():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 10, (5, 40), generator=gen)
    inputs, targets = bidirectional.mask_characters(x, 10, gen)
    hidden = targets != -1
    assert torch.all(hidden.sum(dim=1) == 6)  # round(0.15 * 40) in each row
    assert torch.all(inputs[hidden] == 10)
    assert torch.equal(inputs[~hidden], x[~hidden])
    assert torch.equal(targets[hidden], x[hidden])


def test_neighbour_weight_by_hand():
    weights = torch.arange(16.0).view(4, 4)
    assert bidirectional.neighbour_weight(weights, 1).tolist() == [1.0, 6.0, 11.0]
    assert bidirectional.neighbour_weight(weights, -1).tolist() == [4.0, 9.0, 14.0]


def write_text(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text("To be, or not to be, that is the question:\nWhether 'tis nobler.\n" * 40)
    return path


def test_bidirectional_command_end_to_end(tmp_path):
    args = [
        f"--input={write_text(tmp_path)}",
        "--steps=3",
        "--eval_windows=4",
        "--block_size=16",
        "--batch_size=4",
        "--n_layer=1",
        "--n_head=2",
        "--n_embd=8",
        "--jobs=1",
        f"--out_dir={tmp_path / 'out'}",
    ]
    assert bidirectional.run(args) == 0
    with open(tmp_path / "out" / "bidirectional.json") as f:
        data = json.load(f)
    causal = data["models"]["causal"]
    both_ways = data["models"]["bidirectional"]
    assert causal["params"] == both_ways["params"]
    for key in ("loss", "accuracy", "loss_at_masked", "accuracy_at_masked"):
        assert isinstance(causal[key], float)
    assert 0.0 <= both_ways["accuracy"] <= 1.0 and both_ways["loss"] > 0
    assert causal["look_ahead"] == [[0.0, 0.0]] and causal["next_character"] == [[0.0, 0.0]]
    assert min(both_ways["look_ahead"][0]) > 0
    assert len(data["example"]["maps"]["bidirectional"]) == 16
    assert data["example"]["text"]["bidirectional"].count(bidirectional.MASK_SIGN) == 2
    for name in ("bidirectional.png", "bidirectional.md"):
        assert os.path.getsize(tmp_path / "out" / name) > 0


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--stepz=3"], "did you mean 'steps'"),
        (["--n_embd=10", "--n_head=4"], "multiple of --n_head"),
        (["--block_size=1"], "at least 2"),
        (["--input=/no/such/file.txt"], "does not exist"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(argv, words, tmp_path, capsys):
    assert bidirectional.run([*argv, f"--out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert words in err


def test_a_text_too_short_to_hold_out_a_window_is_one_line(tmp_path, capsys):
    path = tmp_path / "short.txt"
    path.write_text("abc" * 20)
    assert bidirectional.run([f"--input={path}", f"--out_dir={tmp_path}"]) == 2
    # a line of warning first: the text is not the canonical tiny Shakespeare
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("error:")] == err[-1:]
    assert "held-out tenth" in err[-1]
