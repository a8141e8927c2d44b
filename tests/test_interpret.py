"""explorer/interpret.py: the logit lens, direct logit attribution and activation patching.

Each is checked against the model computed another way: the lens against copies of
the model cut after each block (their own forward gives ln_f and lm_head of that
residual), the attribution against its parts rebuilt from c_proj called on one head's
slice and the residual read at ln_f's input by a hook of the test's own, patching
against one full forward per head with the test's own hook.
"""

import copy

import pytest
import torch
import torch.nn as nn

from explorer import interpret
from model import GPT, GPTConfig
from support import head_measures

T = 12
SHAPES = {
    # GPT-2's architecture: biases, learned positions, GELU
    "gpt2": dict(n_layer=3, n_head=4, n_embd=32, bias=True),
    # the CPU recipe's: no biases, rotary positions, normed queries and keys, ReLU squared
    "recipe": dict(n_layer=3, n_head=4, n_embd=32, bias=False, rope=True, qk_norm=True,
                   activation="relu2"),
}  # fmt: skip


def make_model(shape, seed=0):
    """A small random model whose every parameter (biases and LayerNorm gains included)
    is away from its initial value, so no part of a sum is zero by accident."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=16, vocab_size=50, **SHAPES[shape]))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def prompt(seed, vocab=50):
    return torch.randint(vocab, (1, T), generator=torch.Generator().manual_seed(seed))


def cut_after(model, n_blocks):
    """A copy of model with only its first n_blocks blocks: its logits are ln_f and
    lm_head applied to the residual stream after block n_blocks - 1."""
    out = copy.deepcopy(model)
    out.transformer.h = nn.ModuleList(list(out.transformer.h)[:n_blocks])
    return out


# -----------------------------------------------------------------------------
# The logit lens


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_lens_equals_the_model_cut_after_each_block(shape):
    model = make_model(shape)
    idx = prompt(1)
    with torch.no_grad(), interpret.recording(model) as trace:
        logits = model(idx)[0]
    probs, ids = interpret.logit_lens(model, trace)
    assert probs.shape == ids.shape == (model.config.n_layer + 1, T, 5)
    for point in range(model.config.n_layer + 1):
        with torch.no_grad():
            cut = torch.softmax(cut_after(model, point)(idx)[0][0], dim=-1)  # (T, vocab)
        top = torch.topk(cut, 5, dim=-1)
        torch.testing.assert_close(probs[point], top.values, atol=1e-5, rtol=0)
        assert torch.equal(ids[point], top.indices)
    # the last point is the model's own prediction
    assert torch.equal(ids[-1, :, 0], logits[0].argmax(dim=-1))
    torch.testing.assert_close(probs[-1, :, 0], torch.softmax(logits[0], -1).max(-1).values)


# -----------------------------------------------------------------------------
# Direct logit attribution


@torch.no_grad()
def final_residual_and_heads(model, idx):
    """The residual at ln_f's input (T, C) and each layer's c_proj input (T, nh hs),
    read by hooks of the test's own."""
    seen = {}
    handles = [
        model.transformer.ln_f.register_forward_pre_hook(
            lambda m, args: seen.__setitem__("x", args[0][0])
        )
    ]
    for layer, block in enumerate(model.transformer.h):
        handles.append(
            block.attn.c_proj.register_forward_pre_hook(
                lambda m, args, layer=layer: seen.__setitem__(layer, args[0][0])
            )
        )
    logits = model(idx)[0][0]
    for h in handles:
        h.remove()
    return logits, seen


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_attribution_sums_to_the_logit_and_each_head_is_its_w_o_slice(shape):
    model = make_model(shape, seed=2)
    c = model.config
    hs = c.n_embd // c.n_head
    idx = prompt(3)
    positions = torch.arange(T)
    tokens = torch.randint(c.vocab_size, (T,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), interpret.recording(model) as trace:
        model(idx)
    parts = interpret.attribution(model, trace, positions, tokens)
    logits, seen = final_residual_and_heads(model, idx)
    want = logits[positions, tokens]  # (T,) the model's own logits
    total = parts["embed"] + parts["heads"].sum((1, 2)) + parts["mlp"].sum(1) + parts["bias"]
    torch.testing.assert_close(total, want, atol=1e-4, rtol=0)
    # each head: its slice of the heads' output through c_proj (the module itself, its
    # bias taken off), centred, over ln_f's scale of the whole residual, read by w_u
    ln = model.transformer.ln_f
    x = seen["x"]  # (T, C)
    scale = torch.sqrt(x.var(-1, unbiased=False) + ln.eps)  # (T,)
    w_u = model.lm_head.weight[tokens]  # (T, C)
    for layer, block in enumerate(model.transformer.h):
        for head in range(c.n_head):
            z = torch.zeros_like(seen[layer])
            z[:, head * hs : (head + 1) * hs] = seen[layer][:, head * hs : (head + 1) * hs]
            with torch.no_grad():
                out = block.attn.c_proj(z)  # (T, C)
            if block.attn.c_proj.bias is not None:
                out = out - block.attn.c_proj.bias
            out = out - out.mean(-1, keepdim=True)
            got = ((out * ln.weight / scale[:, None]) * w_u).sum(-1)
            torch.testing.assert_close(parts["heads"][:, layer, head], got, atol=1e-5, rtol=0)


# -----------------------------------------------------------------------------
# Activation patching


@torch.no_grad()
def one_head_patched(model, clean, corrupt, layer, head, target, foil):
    """The corrupt run with one head's output taken from the clean run: two full
    forwards and a hook of the test's own."""
    hs = model.config.n_embd // model.config.n_head
    cut = slice(head * hs, (head + 1) * hs)
    c_proj = model.transformer.h[layer].attn.c_proj
    seen = {}
    handle = c_proj.register_forward_pre_hook(lambda m, args: seen.__setitem__("z", args[0]))
    model(clean)
    handle.remove()

    def swap(module, args):
        z = args[0].clone()
        z[..., cut] = seen["z"][..., cut]
        return (z,)

    handle = c_proj.register_forward_pre_hook(swap)
    logits = model(corrupt)[0][0, -1]
    handle.remove()
    return (logits[target] - logits[foil]).item()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_patching_equals_one_full_forward_per_head(shape):
    model = make_model(shape, seed=5)
    clean, corrupt = prompt(6), prompt(7)
    got = interpret.patch_heads(model, clean, corrupt, target=3, foil=9)
    for layer in range(model.config.n_layer):
        for head in range(model.config.n_head):
            want = one_head_patched(model, clean, corrupt, layer, head, 3, 9)
            assert got["patched"][layer, head].item() == pytest.approx(want, abs=1e-5)
    assert got["clean_diff"] != pytest.approx(got["corrupt_diff"], abs=1e-3)


def test_patching_a_head_with_itself_changes_nothing():
    model = make_model("recipe", seed=8)
    idx = prompt(9)
    got = interpret.patch_heads(model, idx, idx, target=1, foil=2)
    assert got["clean_diff"] == got["corrupt_diff"]
    torch.testing.assert_close(
        got["patched"], torch.full_like(got["patched"], got["corrupt_diff"]), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_patching_every_head_and_the_embeddings_gives_the_clean_run(shape):
    """The residual stream is the embeddings, the heads through W_O, biases and MLPs of
    it: with every head's recorded output and the embeddings from the clean run, the
    corrupt prompt's forward is the clean one."""
    model = make_model(shape, seed=10)
    clean, corrupt = prompt(11), prompt(12)
    with torch.no_grad(), interpret.recording(model) as trace:
        clean_logits = model(clean)[0]
    handles = [model.transformer.drop.register_forward_hook(lambda m, a, out: trace.embed)]
    for layer, block in enumerate(model.transformer.h):
        handles.append(
            block.attn.c_proj.register_forward_pre_hook(
                lambda m, args, layer=layer: (trace.z[layer],)
            )
        )
    with torch.no_grad():
        patched_logits = model(corrupt)[0]
    for h in handles:
        h.remove()
    torch.testing.assert_close(patched_logits, clean_logits, atol=1e-5, rtol=0)
    # without the embeddings it is not: the MLPs and ln_1 read the corrupt tokens
    with torch.no_grad():
        corrupt_logits = model(corrupt)[0]
    assert not torch.allclose(corrupt_logits, clean_logits, atol=1e-3)


def test_patching_with_heads_switched_off():
    """Under head_measures.ablated the switched-off heads stay off in every run: patching
    one of them changes nothing, and the others equal the ablated model's full forwards."""
    model = make_model("gpt2", seed=13)
    clean, corrupt = prompt(14), prompt(15)
    with head_measures.ablated(model, [(1, 2)]):
        got = interpret.patch_heads(model, clean, corrupt, target=4, foil=5)
        want = one_head_patched(model, clean, corrupt, 2, 1, 4, 5)
    assert got["patched"][1, 2].item() == pytest.approx(got["corrupt_diff"], abs=1e-5)
    assert got["patched"][2, 1].item() == pytest.approx(want, abs=1e-5)
