"""docs/hacks.md's driver (experiments/hacks_gallery.py): each edit row's patch applies to HEAD's
model.py and changes only the functions its row names, the command sees those that only the
written-out attention runs, an edit to attention() computes what F.scaled_dot_product_attention
does at the scale it says; and the page shows what a real compare.json holds, its interval, p
and step ratio checked against scipy's paired t test."""

import ast
import copy
import importlib.util
import json
import math
import os
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT
from scipy import stats

from experiments import hacks_gallery
from support import arms

EDITS = [hack for hack in hacks_gallery.ROWS if hack.patch]
# a real `python compare.py` of tiny settings (1 layer, 32 wide, 8 iters, 3 pairs) after
# experiments/hacks/scores_over_d.patch, in a clone: its compare.json and its output
STORED = os.path.join(ROOT, "tests", "data", "hacks_tiny_compare.json")
STORED_OUTPUT = os.path.join(ROOT, "tests", "data", "hacks_tiny_compare.txt")


def functions(path):
    """({qualified name: code} of the module's functions and methods, the module's code with
    every such function's body emptied: all that lies outside them)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = {}
    skeleton = copy.deepcopy(tree)
    for original, hollow in zip(tree.body, skeleton.body):
        pairs = [(original, hollow, original.name if hasattr(original, "name") else "")]
        if isinstance(original, ast.ClassDef):
            pairs = [
                (inner, empty, f"{original.name}.{getattr(inner, 'name', '')}")
                for inner, empty in zip(original.body, hollow.body)
            ]
        for node, empty, name in pairs:
            if isinstance(node, ast.FunctionDef):
                found[name] = ast.dump(node)
                empty.body = [ast.Pass()]
    return found, ast.dump(skeleton)


@pytest.fixture(scope="module")
def head_model(tmp_path_factory):
    """A folder holding HEAD's model.py, as git has it."""
    folder = tmp_path_factory.mktemp("head")
    text = subprocess.run(
        ["git", "-C", ROOT, "show", "HEAD:model.py"], capture_output=True, check=True
    ).stdout
    (folder / "model.py").write_bytes(text)
    return folder


def patched(head_model, tmp_path, hack):
    """A copy of HEAD's model.py with the row's patch applied by git, checked first."""
    (tmp_path / "model.py").write_bytes((head_model / "model.py").read_bytes())
    apply_patch(tmp_path, hack.patch)
    return tmp_path


def apply_patch(folder, name):
    """experiments/hacks/<name> applied by git in folder, checked first."""
    patch = os.path.join(ROOT, hacks_gallery.PATCHES, name)
    for args in (["--check"], []):
        done = subprocess.run(
            ["git", "apply", *args, patch], cwd=folder, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("hack", EDITS, ids=[hack.name for hack in EDITS])
def test_each_patch_applies_to_head_and_changes_only_its_rows_functions(head_model, tmp_path, hack):
    folder = patched(head_model, tmp_path, hack)
    before, outside_before = functions(head_model / "model.py")
    after, outside_after = functions(folder / "model.py")
    assert set(after) == set(before)
    assert [name for name in before if before[name] != after[name]] == list(hack.touches)
    assert outside_after == outside_before
    # what the command sees: an edit where only the written-out attention runs, and so
    # both arms trained with --fused=False
    written_out = [name for name in arms.WRITTEN_OUT if name in hack.touches]
    assert arms.written_out_edits(str(head_model), str(folder)) == written_out


def load(folder, name):
    spec = importlib.util.spec_from_file_location(name, folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name, power, causal",
    [("scores_over_d", 1, True), ("scores_unscaled", 0, True), ("no_causal_mask", 0.5, False)],
)
def test_the_attention_edits_compute_what_their_rows_say(head_model, tmp_path, name, power, causal):
    """attention() with causal_mask() after the patch, against the fused kernel told the
    scale (scores divided by d ** power) and the masking directly."""
    hack = next(h for h in EDITS if h.name == name)
    model = load(patched(head_model, tmp_path, hack), f"model_{name}")
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 7, 16, generator=gen, dtype=torch.float64)
    factor = q.size(-1) ** -power
    out, weights = model.attention(q, k, v, model.causal_mask(7, 7))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=factor)
    # attention() takes its softmax in float32 whatever the inputs; the scales differ by far more
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert bool((weights[..., 0, 1:] > 0).all()) == (not causal)


# -----------------------------------------------------------------------------
# The page, from a stored compare.json


@pytest.fixture(scope="module")
def stored():
    with open(STORED) as f:
        report = json.load(f)
    with open(STORED_OUTPUT) as f:
        output = f.read()
    hack = next(h for h in EDITS if h.name == "scores_over_d")
    row = hacks_gallery.row_result(hack, report, output)
    row.update(first_wall_s=12.0, date="2026-12-03")
    result = dict(commit="f" * 40, machine="a test machine", date=row["date"], rows=[row])
    return report, output, row, hacks_gallery.page(result)


def test_a_row_is_the_paired_t_test_of_its_runs(stored):
    report, output, row, _ = stored
    a = [pair["A"]["val_loss"] for pair in report["runs"]]
    b = [pair["B"]["val_loss"] for pair in report["runs"]]
    oracle = stats.ttest_rel(b, a)
    interval = oracle.confidence_interval(0.95)
    assert row["loss"] == {"A": a, "B": b}
    assert row["difference"]["mean"] == pytest.approx(np.mean(np.subtract(b, a)), rel=1e-12)
    assert row["difference"]["p"] == pytest.approx(oracle.pvalue, rel=1e-9)
    assert row["difference"]["low"] == pytest.approx(interval.low, rel=1e-9)
    assert row["difference"]["high"] == pytest.approx(interval.high, rel=1e-9)
    # the step ratio: the pairs' ratios of the median step, their geometric mean and interval
    logs = [
        math.log(pair["B"]["ms_per_iter"] / pair["A"]["ms_per_iter"]) for pair in report["runs"]
    ]
    ratio = stats.ttest_1samp(logs, 0.0).confidence_interval(0.95)
    assert row["step_ratio"]["ratio"] == pytest.approx(math.exp(np.mean(logs)), rel=1e-9)
    assert row["step_ratio"]["low"] == pytest.approx(math.exp(ratio.low), rel=1e-9)
    assert row["step_ratio"]["high"] == pytest.approx(math.exp(ratio.high), rel=1e-9)
    # the edit inside attention(): both arms written out, as the command's first line said
    assert row["written_out"]
    assert row["first_line"] == output.splitlines()[0]
    assert row["first_line"].startswith("attention() differs between the arms")


def test_the_page_shows_the_command_the_edit_and_the_verdict_as_printed(stored):
    report, output, row, text = stored
    # the verdict as the command printed it
    verdict = report["statistics"]["verdict"]
    assert f"verdict: {verdict}\n" in output
    assert f"```\nverdict: {verdict}\n```" in text
    assert "git apply experiments/hacks/scores_over_d.patch && python compare.py\n" in text
    with open(os.path.join(ROOT, "experiments", "hacks", "scores_over_d.patch")) as f:
        assert f"```diff\n{f.read().rstrip()}\n```" in text
    d = row["difference"]
    cells = f"{d['mean']:+.4f} ({d['low']:+.4f} to {d['high']:+.4f})"
    params = report["statistics"]["params"]
    line = next(line for line in text.splitlines() if line.startswith("| [scores_over_d]"))
    assert cells in line and f"{params['A']:,} both" in line
    assert f"| {row['step_ratio']['ratio']:.2f}x ({row['step_ratio']['low']:.2f} to " in line
    assert f"> {row['first_line']}" in text
    assert "--out_dir=docs --commit=" + "f" * 40 in text


def shipped():
    with open(os.path.join(ROOT, "docs", "hacks.json")) as f:
        return json.load(f)


def test_the_shipped_page_is_written_from_its_rows():
    # docs/hacks.md is the driver's page of docs/hacks.json, not text edited by hand
    with open(os.path.join(ROOT, "docs", "hacks.md")) as f:
        assert f.read() == hacks_gallery.page(shipped())


def test_each_shipped_row_is_the_paired_t_test_of_its_losses():
    result = shipped()
    assert {row["name"] for row in result["rows"]} == {hack.name for hack in hacks_gallery.ROWS}
    for row in result["rows"]:
        a, b = row["loss"]["A"], row["loss"]["B"]
        oracle = stats.ttest_rel(b, a)
        interval = oracle.confidence_interval(0.95)
        d = row["difference"]
        assert d["mean"] == pytest.approx(np.mean(np.subtract(b, a)), rel=1e-9), row["name"]
        assert d["p"] == pytest.approx(oracle.pvalue, rel=1e-6), row["name"]
        assert (d["low"], d["high"]) == pytest.approx((interval.low, interval.high), rel=1e-6)
        # a claim only where the interval leaves 0 out, with the sign of the difference
        if d["p"] < 0.05:
            assert row["verdict"].startswith("B is better" if d["mean"] < 0 else "B is worse")
        else:
            assert row["verdict"].startswith("no difference detected")


def test_what_the_runs_showed_is_shown_only_with_the_commit_they_ran_at():
    result = shipped()
    assert result["commit"] == hacks_gallery.FOUND_AT
    text = hacks_gallery.page(result)
    assert set(hacks_gallery.FOUND) <= {row["name"] for row in result["rows"]}
    for reading in hacks_gallery.FOUND.values():
        assert reading in text
    other = dict(result, commit="0" * 40)
    text = hacks_gallery.page(other)
    for reading in hacks_gallery.FOUND.values():
        assert reading not in text


# -----------------------------------------------------------------------------
# The recipe's trial patches (docs/benchmarks.md, ideas for a ten-minute recipe)


def built_alike(head_model, folder, name, **extra):
    """HEAD's GPT and the patched one, built from one seed with token shift (a small model
    for the recipe's trial patches); a patch that draws nothing more from the RNG leaves it
    where HEAD's build left it."""
    plain, patched_model = load(head_model, f"plain_{name}"), load(folder, f"patched_{name}")
    kw = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
    kw.update(rope=True, qk_norm=True, token_shift=True, **extra)
    torch.manual_seed(3)
    a = plain.GPT(plain.GPTConfig(**kw))
    after_a = torch.randn(4)
    torch.manual_seed(3)
    b = patched_model.GPT(patched_model.GPTConfig(**kw))
    after_b = torch.randn(4)
    assert torch.equal(after_a, after_b)
    return a, b


def test_value_embeddings_patch_starts_as_the_plain_model_and_learns_each_tokens_row(
    head_model, tmp_path
):
    """experiments/hacks/value_embeds.patch applies to HEAD and touches the attention's,
    the block's and the model's forward and GPT.__init__ alone. Its tables start at zeros,
    drawing nothing from the RNG: the model is HEAD's bit for bit (the same loss, the same
    RNG state after it is built). A table row's gradient is the sum of the values' gradients
    at the positions holding that token (a scatter done by hand from c_attn's output), and
    with tables that are not zero, decoding through the KV cache gives the full forward's
    logits."""
    hack = hacks_gallery.Hack("value_embeds", "", patch="value_embeds.patch")
    folder = patched(head_model, tmp_path, hack)
    before, outside_before = functions(head_model / "model.py")
    after, outside_after = functions(folder / "model.py")
    changed = [name for name in before if before[name] != after[name]]
    assert changed == ["MultiHeadAttention.forward", "Block.forward", "GPT.__init__", "GPT.forward"]
    # outside the bodies, two signatures gain a last argument, ve=None, and nothing else changes
    assert outside_after != outside_before
    assert outside_after == outside_before.replace(
        "arg(arg='mask')], kwonlyargs=[], kw_defaults=[], defaults=[Constant(value=None), "
        "Constant(value=0), Constant(value=None), Constant(value=None), Constant(value=None)]",
        "arg(arg='mask'), arg(arg='ve')], kwonlyargs=[], kw_defaults=[], defaults=["
        "Constant(value=None), Constant(value=0), Constant(value=None), Constant(value=None), "
        "Constant(value=None), Constant(value=None)]",
    )
    a, b = built_alike(head_model, folder, "value_embeds", n_kv_head=2)
    idx = torch.randint(0, 37, (2, 16))
    loss_a = a(idx, idx)[1]
    # the values' gradient: the last n_kv_head * head_size columns of c_attn's output
    outputs = []

    def keep_with_its_grad(module, args, out):
        out.retain_grad()
        outputs.append(out)

    hook = b.transformer.h[1].attn.c_attn.register_forward_hook(keep_with_its_grad)
    loss_b = b(idx, idx)[1]
    hook.remove()
    assert torch.equal(loss_a, loss_b)
    loss_b.backward()
    dv = outputs[0].grad[..., -16:]  # (B, T, nkv hs): 2 key/value heads of 8
    by_hand = torch.zeros(37, 16).index_add_(0, idx.flatten(), dv.reshape(-1, 16))
    torch.testing.assert_close(b.value_embeds[1].weight.grad, by_hand)
    assert by_hand.abs().sum() > 0
    b.eval()
    with torch.no_grad():
        for table in b.value_embeds:
            table.weight.normal_(generator=torch.Generator().manual_seed(5))
        full = b(idx)[0]
        cache = b.make_kv_cache(2)
        first = b(idx[:, :11], kv_cache=cache)[0]
        rest = b(idx[:, 11:], kv_cache=cache)[0]
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full)
    assert not torch.allclose(full, a.eval()(idx)[0])


def test_smear_gate_patch_starts_as_token_shift_and_gates_by_the_token(head_model, tmp_path):
    """experiments/hacks/smear_gate.patch applies to HEAD and touches GPT.__init__ and
    GPT.token_shift alone. Its gate starts at w = 0, a factor 2 sigmoid(0) = 1, drawing nothing
    from the RNG: the model is HEAD's bit for bit. With w and the gain not zero, the shift is
    x_t + g * 2 sigmoid(w . x_t) * x_(t-1), written out position by position here, w's gradient
    is the chain rule's sum done by hand, and decoding through the KV cache gives the full
    forward's logits."""
    hack = hacks_gallery.Hack("smear_gate", "", patch="smear_gate.patch")
    folder = patched(head_model, tmp_path, hack)
    before, outside_before = functions(head_model / "model.py")
    after, outside_after = functions(folder / "model.py")
    assert [name for name in before if before[name] != after[name]] == [
        "GPT.__init__",
        "GPT.token_shift",
    ]
    assert outside_after == outside_before
    a, b = built_alike(head_model, folder, "smear_gate")
    idx = torch.randint(0, 37, (2, 16))
    assert torch.equal(a(idx, idx)[1], b(idx, idx)[1])

    g = torch.randn(32, generator=torch.Generator().manual_seed(6))
    w = torch.randn(32, generator=torch.Generator().manual_seed(7)) / 4
    with torch.no_grad():
        b.shift_gain.copy_(g)
        b.shift_gate.copy_(w)
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(8))
    y = b.token_shift(x)
    for t in range(16):
        previous = x[:, t - 1] if t > 0 else torch.zeros(2, 32)
        gate = 2 * torch.sigmoid(x[:, t] @ w)  # (B,)
        torch.testing.assert_close(y[:, t], x[:, t] + g * gate[:, None] * previous)
    r = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(9))
    (y * r).sum().backward()
    s = torch.sigmoid(x @ w)  # (B, T)
    previous = torch.cat([torch.zeros(2, 1, 32), x[:, :-1]], dim=1)
    # d/dw of sum_t r_t . (g 2 s_t x_(t-1)) = sum_t (r_t . g x_(t-1)) 2 s_t (1 - s_t) x_t
    by_hand = (((r * g * previous).sum(-1) * 2 * s * (1 - s))[..., None] * x).sum((0, 1))
    torch.testing.assert_close(b.shift_gate.grad, by_hand)
    assert by_hand.abs().sum() > 0
    b.eval()
    with torch.no_grad():
        full = b(idx)[0]
        cache = b.make_kv_cache(2)
        first = b(idx[:, :11], kv_cache=cache)[0]
        rest = b(idx[:, 11:], kv_cache=cache)[0]
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full)
    assert not torch.allclose(full, a.eval()(idx)[0])
