"""The induction circuit's measurements: knock-outs on the induction probe
(support/head_measures.py), the path-by-path cut of what K-composition is about,
the circuit in heads.py's report, and the phase change of experiments/head_timeline.py.

Checked against computations done another way: a head removed by zeroing its
columns of c_proj's weight in a copy of the model, the losses with every target
but a span's ignored, and a model whose MLP is zeroed, where the direct path is
the only path and cutting it into all three inputs is removing the head.
"""

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import heads_zeroed

import heads
from data.text import prepare_text
from data.tokenizer import build_tokenizer
from experiments import head_timeline
from model import GPT, GPTConfig
from support import head_measures
from support.checkpoint import checkpoint_path, save_checkpoint
from support.composition import composition_scores

SEED = 5


def tiny_model(**overrides):
    torch.manual_seed(0)
    args = dict(block_size=16, vocab_size=20, n_layer=2, n_head=4, n_embd=32, bias=False)
    args.update(overrides)
    model = GPT(GPTConfig(**args))
    with torch.no_grad():  # larger head outputs than at init, so that removing one shows
        for block in model.transformer.h:
            block.attn.c_proj.weight.normal_(0.0, 0.3)
    return model.eval()


def test_copy_losses_are_the_model_losses_on_each_half():
    model = tiny_model()
    idx, L = head_measures.probe_tokens(model.config, SEED)
    first, repeated = head_measures.copy_losses(model, SEED)
    x, y = idx[:, :-1], idx[:, 1:]
    halves = {}
    for name, span in (("first", range(0, L - 1)), ("repeated", range(L, 2 * L - 1))):
        kept = torch.full_like(y, -1)  # ignored by the loss
        kept[:, list(span)] = y[:, list(span)]
        with torch.no_grad():
            halves[name] = model(x, kept)[1].item()
    assert first == pytest.approx(halves["first"], abs=1e-5)
    assert repeated == pytest.approx(halves["repeated"], abs=1e-5)


def test_knockouts_equal_the_head_removed_by_editing_weights():
    model = tiny_model()
    found = head_measures.knockouts(model, SEED)
    base = head_measures.induction_scores(model, SEED)["induction"]
    np.testing.assert_allclose(found["baseline"]["induction"], base)
    for layer, head in [(0, 1), (1, 3)]:
        edited = heads_zeroed(model, [(layer, head)])
        scores = head_measures.induction_scores(edited, SEED)["induction"]
        np.testing.assert_allclose(found["induction"][layer, head], scores, atol=1e-6)
        repeated = head_measures.copy_losses(edited, SEED)[1]
        assert found["copy_loss"][layer, head] == pytest.approx(repeated, abs=1e-5)
    # removing a layer-1 head leaves layer 0 as it was
    np.testing.assert_allclose(found["induction"][1, 3][0], base[0], atol=1e-6)


def layer_1_projections(model, idx, context):
    """Layer 1's c_attn output (queries, keys, values side by side) under the context;
    the hook that reads it comes after the context's own, so it sees what they made."""
    seen = {}
    with context, torch.no_grad():
        hook = model.transformer.h[1].attn.c_attn.register_forward_hook(
            lambda module, args, output: seen.setdefault("out", output.detach().clone())
        )
        try:
            model(idx)
        finally:
            hook.remove()
    return seen["out"]


def test_cutting_every_path_is_removing_the_head_when_there_is_no_other_path():
    model = tiny_model()
    with torch.no_grad():
        model.transformer.h[0].mlp.c_proj.weight.zero_()  # layer 0's MLP adds nothing
    idx, _ = head_measures.probe_tokens(model.config, SEED)
    writers = [(0, 1), (0, 2)]
    whole = layer_1_projections(model, idx, head_measures.ablated(model, writers))
    nothing = layer_1_projections(model, idx, torch.no_grad())
    C = model.config.n_embd
    for paths in (("q", "k", "v"), ("k",), ("q", "v")):
        cut = layer_1_projections(model, idx, head_measures.path_ablated(model, writers, 1, paths))
        for k, name in enumerate(("q", "k", "v")):
            columns = slice(k * C, (k + 1) * C)
            expected = whole if name in paths else nothing
            torch.testing.assert_close(cut[..., columns], expected[..., columns])
    assert not torch.allclose(whole, nothing)  # the heads mattered


def test_a_cut_value_path_leaves_the_attention_alone():
    model = tiny_model()
    idx, _ = head_measures.probe_tokens(model.config, SEED)
    with torch.no_grad():
        _, maps = model.attention_maps(idx)
        with head_measures.path_ablated(model, [(0, 0)], 1, ("v",)):
            logits_cut, maps_cut = model.attention_maps(idx)
        with head_measures.path_ablated(model, [(0, 0)], 1, ("k",)):
            _, maps_k = model.attention_maps(idx)
    torch.testing.assert_close(maps_cut[1], maps[1])
    assert not torch.allclose(maps_k[1], maps[1])
    with pytest.raises(ValueError):
        with head_measures.path_ablated(model, [(1, 0)], 1, ("k",)):
            pass


def test_heads_report_holds_the_circuit(tmp_path, corpus_path):
    with open(corpus_path, encoding="utf-8") as f:
        text = f.read()[:20_000]
    prepare_text(text, str(tmp_path / "data" / "tiny"), "char")
    tok = build_tokenizer("char", text)
    model = tiny_model(vocab_size=tok.vocab_size)
    save_checkpoint(
        {
            "model": model.state_dict(),
            "model_args": dataclasses.asdict(model.config),
            "iter_num": 0,
            "config": {"data_root": str(tmp_path / "data")},
            "tokenizer": tok.describe(),
            "dataset": "tiny",
        },
        checkpoint_path(tmp_path),
    )
    assert heads.run([f"--out_dir={tmp_path}", "--max_windows=5", f"--seed={SEED}"]) == 0
    with open(tmp_path / "heads" / "heads.json", encoding="utf-8") as f:
        rep = json.load(f)
    found = composition_scores(model)
    for name in ("q", "k", "v"):
        logged = np.array(rep["composition"][name], dtype=float)  # None -> nan
        np.testing.assert_allclose(logged, found[name].numpy(), atol=1e-4)
    knock = head_measures.knockouts(model, SEED)
    for h in rep["heads"]:
        layer, head = h["layer"], h["head"]
        assert h["knockout_copy_loss"] == pytest.approx(knock["copy_loss"][layer, head], abs=1e-4)
        assert (h["composition_from"]["k"] is None) == (layer == 0)
        if layer == 1:
            (l1, h1), score = h["composition_from"]["k"]
            column = found["k"][0, :, 1, head]
            assert (l1, h1) == (0, int(torch.argmax(column)))
            assert score == pytest.approx(float(column.max()), abs=1e-6)
    assert rep["copy_loss"]["copy_loss"] == pytest.approx(knock["baseline"]["copy_loss"], abs=1e-4)
    with open(tmp_path / "heads" / "heads.md", encoding="utf-8") as f:
        assert "| 1 | 0 |" in f.read().split("Composition")[1]


def test_phase_change_is_the_rise_of_the_best_head():
    iters = np.array([0, 10, 20, 30, 40])
    best = [0.02, 0.05, 0.2, 0.45, 0.6]
    induction = np.zeros((5, 2, 2))
    induction[:, 1, 0] = best
    assert head_timeline.phase_change(iters, induction) == (1, 3)
    assert head_timeline.phase_change(iters, induction * 0.5) is None  # never reaches 0.4
    induction[0, 1, 0] = 0.3  # already past 0.1 at the start, and never below it before 0.4
    induction[1, 1, 0] = 0.3
    assert head_timeline.phase_change(iters, induction) is None
    losses = (np.array([4.0, 3.9, 3.5, 2.5, 2.0]), np.array([0.0, -0.1, -0.8, -2.0, -2.5]))
    induction[:, 1, 0] = best
    line = head_timeline.describe_phase_change(iters, induction, losses)
    assert "iters 10 and 30 (20 iters, 50% of the run)" in line
    assert "0.050 -> 0.450" in line and "-0.100 -> -2.000" in line
