"""heads.py and the pattern classes of attention_maps.py.

Labels are checked on synthetic maps whose answer is known, the induction
probe on maps that do or do not induct, and the ablation and val loss against
computations done another way: c_proj's weight columns zeroed by hand, and
one window at a time.
"""

import copy
import dataclasses
import json
import os
import re
import shutil
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import heads_zeroed

import heads
import train
from data.dataset import load_tokens
from data.text import prepare_text
from data.tokenizer import build_tokenizer
from model import GPT, GPTConfig
from support import attention_maps as am
from support import head_measures
from support.checkpoint import checkpoint_path, save_checkpoint

T = 64
LETTERS = [chr(97 + i % 26) for i in range(T)]  # tokens with no delimiters: no block ends


def causal_uniform(T):
    tri = np.tril(np.ones((T, T)))
    return tri / tri.sum(1, keepdims=True)


def one_key(T, key):
    """Each query i puts all its weight on key(i) (clipped into 0..i)."""
    a = np.zeros((T, T))
    for i in range(T):
        a[i, min(max(key(i), 0), i)] = 1.0
    return a


def near_band(T):
    """Even weight on the 1-3 tokens before the query (on token 0 for query 0)."""
    a = np.zeros((T, T))
    for i in range(T):
        keys = [j for j in (i - 1, i - 2, i - 3) if j >= 0] or [0]
        a[i, keys] = 1.0 / len(keys)
    return a


def lines(first, line, T):
    """T character tokens: a short first line, then repeats of line."""
    return list((first + line * T)[:T])


# -----------------------------------------------------------------------------
# Key classes


def test_token_kinds():
    kinds = {
        "\n": "newline",
        " \n": "newline",
        " ": "space",
        "  ": "space",
        ",": "punct",
        " ,": "punct",
        "?!": "punct",
        "'": "punct",
        "a": None,
        " the": None,
        "3": None,
        "x.": None,
    }
    for token, kind in kinds.items():
        assert am.token_kind(token) == kind, token


def test_key_classes_partition_every_row():
    tokens = list("ab, cd\nef g.hij klm\nn")
    n = len(tokens)
    classes, kinds = am.key_classes(tokens)
    assert ((classes == -1) == np.triu(np.ones((n, n), bool), 1)).all()  # exactly the masked keys
    # a random causal map: on every row the class shares add up to 1
    rng = np.random.default_rng(0)
    a = np.tril(rng.random((n, n)))
    a /= a.sum(1, keepdims=True)
    shares = np.stack([(a * (classes == c)).sum(1) for c in range(len(am.CLASSES))], 1)
    np.testing.assert_allclose(shares.sum(1), 1.0, atol=1e-12)
    # by hand: query 14 ('j', line "ef g.hij klm") -- its clause started after '.' at 11
    C = {name: k for k, name in enumerate(am.CLASSES)}
    row = classes[14]
    assert [j for j in range(15) if row[j] == C["diagonal"]] == [11, 12, 13, 14]
    assert row[0] == C["first"]
    assert [j for j in range(15) if row[j] == C["delimiter"]] == [2, 3, 6, 9]  # ',', ' ', '\n', ' '
    assert [j for j in range(15) if row[j] == C["block"]] == []  # the clause lies inside the band
    assert [j for j in range(15) if row[j] == C["earlier"]] == [1, 4, 5, 7, 8, 10]
    # query 19 ('\n' ending "hij klm"): its block runs from 12, past the band
    assert [j for j in range(20) if classes[19, j] == C["block"]] == [12, 13, 14]
    assert kinds.tolist()[:4] == [-1, -1, 2, 1]


# -----------------------------------------------------------------------------
# Labels of synthetic heads with a known answer


def stats(a, tokens=LETTERS):
    s = am.head_stats(a, tokens)
    assert sum(s["scores"].values()) == pytest.approx(1.0, abs=5 * 5e-5)  # rounded to 4 digits
    return s


def test_previous_and_self_heads():
    prev = stats(one_key(T, lambda i: i - 1))
    assert prev["label"] == "previous" and prev["scores"]["diagonal"] == 1.0
    assert (
        prev["previous_weight"] == 1.0
        and prev["concentration"] == "sparse"
        and prev["entropy"] == 0
    )
    self_ = stats(np.eye(T))
    assert self_["label"] == "self" and self_["self_weight"] == 1.0
    # the band holds 4 of i + 1 keys: lift = 1 / mean over rows of 4 / (i + 1)
    expected = 1.0 / np.mean([4 / (i + 1) for i in range(4, T)])
    assert prev["lift"]["diagonal"] == pytest.approx(expected, abs=1e-3)


def test_band_with_a_thin_even_tail_is_diagonal_not_broad():
    """80% on the 1-3 tokens before, 20% spread evenly: the old summary called it broad."""
    s = stats(0.8 * near_band(T) + 0.2 * causal_uniform(T))
    assert s["label"] == "band" and s["concentration"] == "focused"
    assert s["scores"]["diagonal"] > 0.8 and s["lift"]["diagonal"] > 4
    assert s["previous_weight"] < am.ONE_KEY  # spread over three keys: no single one reaches 0.4


def test_first_token_sink():
    s = stats(one_key(T, lambda i: 0))
    assert s["label"] == "first" and s["scores"]["first"] == 1.0
    assert s["lift"]["first"] == pytest.approx(
        1.0 / np.mean([1 / (i + 1) for i in range(4, T)]), abs=1e-3
    )


def test_newline_delimiter_head():
    tokens = lines("ab\n", "cdefgh\n", T)
    newlines = [j for j, t in enumerate(tokens) if t == "\n"]
    # each query looks at the last newline outside its band
    a = one_key(T, lambda i: max([j for j in newlines if j < i - am.BAND], default=0))
    s = stats(a, tokens)
    assert s["label"] == "newline" and s["scores"]["delimiter"] > 0.9
    assert s["lift"]["delimiter"] > 4


def test_block_head():
    """Even attention over the query's own line, in long lines."""
    n = 128
    tokens = lines("speak\n", "Before we proceed any further hear me speak all speak speak\n", n)
    a = np.zeros((n, n))
    for i in range(n):
        start = max([j + 1 for j in range(i) if tokens[j] == "\n"], default=0)
        a[i, start : i + 1] = 1.0 / (i + 1 - start)
    s = stats(a, tokens)
    assert s["label"] == "block" and s["scores"]["block"] > 0.5
    assert s["lift"]["block"] > am.PREFERRED and s["lift"]["earlier"] == 0


def test_uniform_head_is_broad_with_no_preference():
    tokens = lines("ab\n", "Before we, proceed.\n", T)
    s = stats(causal_uniform(T), tokens)
    assert s["label"] == "broad" and s["concentration"] == "broad"
    assert all(v == pytest.approx(1.0, abs=1e-3) for v in s["lift"].values())
    # a class with no keys has no lift
    assert stats(causal_uniform(T))["lift"]["delimiter"] is None


def test_half_sink_half_previous_is_mixed():
    s = stats(0.5 * one_key(T, lambda i: 0) + 0.5 * one_key(T, lambda i: i - 1))
    assert s["label"] == "mixed: previous+first"
    assert s["scores"]["diagonal"] == s["scores"]["first"] == 0.5


def test_weak_preference_and_nothing_preferred():
    # 30% on the previous token, 70% on one token far back: the diagonal is preferred
    # (lift > 1.5) but holds too little to name the head, and the head is not broad
    weak = stats(0.3 * one_key(T, lambda i: i - 1) + 0.7 * one_key(T, lambda i: i // 2))
    assert weak["label"] == "weak band" and weak["concentration"] == "sparse"
    assert weak["lift"]["diagonal"] > am.PREFERRED and weak["lift"]["block"] < am.PREFERRED
    # each query on one token far back: sparse, in no preferred class
    far = stats(one_key(T, lambda i: i // 2))
    assert far["concentration"] == "sparse"
    assert far["label"] == "other", far


def test_score_std_and_entropy_against_the_scores_themselves():
    """score_std is recovered from the weights alone; the oracle is the scores the
    weights came from, and the entropy written out."""
    rng = np.random.default_rng(3)
    H, T_ = 3, 20
    # scores of three scales: sharp, moderate, near-even attention
    scores = rng.normal(size=(H, T_, T_)) * np.array([4.0, 1.0, 0.1])[:, None, None]
    visible = np.tril(np.ones((T_, T_), dtype=bool))
    masked = np.where(visible, scores, -np.inf)
    weights = np.exp(masked - masked.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    tokens = [chr(97 + i) for i in range(T_)]
    sums = am.pattern_sums(weights, tokens)
    rows = range(am.BAND + 1, T_)
    for h in range(H):
        d = am.describe(sums, h)
        want_std = np.mean([scores[h, i, : i + 1].std() for i in rows])
        assert d["score_std"] == pytest.approx(want_std, abs=1e-3)
        w = [weights[h, i, : i + 1] for i in rows]
        entropy = [-(x * np.log(x)).sum() for x in w]
        assert d["entropy"] == pytest.approx(np.mean(entropy), abs=1e-3)
        ratio = np.mean([e / np.log(i + 1) for e, i in zip(entropy, rows)])
        assert d["entropy_ratio"] == pytest.approx(ratio, abs=1e-3)
    # sharper scores, lower entropy: the lecture's claim in one line
    stats = [am.describe(sums, h) for h in range(H)]
    assert stats[0]["entropy_ratio"] < stats[1]["entropy_ratio"] < stats[2]["entropy_ratio"]


@pytest.mark.parametrize("gain", [False, True])
def test_the_qk_norm_bound_is_reached_by_a_key_equal_to_its_query(gain):
    """With W_K = W_Q and no rotary, each query's score on its own key is |q|^2 / sqrt(d):
    sqrt(d) after QK-norm, the bound, times the gains' product when one gain is spread
    over every dimension; no score exceeds the bound."""
    torch.manual_seed(0)
    config = GPTConfig(
        block_size=16, vocab_size=11, n_layer=1, n_head=2, n_embd=16, bias=False,
        qk_norm=True, qk_gain=gain,
    )  # fmt: skip
    model = GPT(config).eval()
    attn = model.transformer.h[0].attn
    with torch.no_grad():
        C = config.n_embd
        attn.c_attn.weight[C : 2 * C] = attn.c_attn.weight[:C]  # W_K = W_Q
        if gain:
            attn.q_norm.weight.fill_(1.5)
            attn.k_norm.weight.fill_(2.0)
    captured = []

    def recording(q, k, v, mask=None, dropout_p=0.0):
        captured.append(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5)
        return real(q, k, v, mask, dropout_p)

    import model as model_module

    real = model_module.attention
    model_module.attention = recording
    try:
        with torch.no_grad():
            model.attention_maps(torch.randint(0, 11, (2, 16)))
    finally:
        model_module.attention = real
    hs = C // config.n_head
    bound = hs**0.5 * (3.0 if gain else 1.0)
    assert heads.score_bound(model)[0] == pytest.approx(bound, abs=1e-3)  # 3 decimals
    scores = captured[0]
    assert scores.abs().max().item() <= bound * (1 + 1e-5)
    own = torch.diagonal(scores, dim1=-2, dim2=-1)
    assert own.min().item() == pytest.approx(bound, rel=1e-3)  # RMSNorm's eps: a hair below


def test_sample_summary_uses_these_labels(tmp_path):
    """write_all (sample.py's attention files) labels known maps the same way."""
    layer = np.stack(
        [one_key(T, lambda i: i - 1), np.eye(T), one_key(T, lambda i: 0), causal_uniform(T)]
    ).astype(np.float32)
    am.write_all(str(tmp_path), [layer], LETTERS)
    with open(tmp_path / "heads.json", encoding="utf-8") as f:
        saved = json.load(f)
    assert [h["label"] for h in saved["heads"]] == ["previous", "self", "first", "broad"]
    assert saved["heads"] == am.all_head_stats([layer], LETTERS)
    assert saved["classes"] == list(am.CLASSES) and str(am.DOMINANT) in saved["rule"]


def test_windows_add_up():
    """pattern_sums of two windows together: the rows of both, weighted by their number."""
    a, b = one_key(T, lambda i: i - 1), causal_uniform(32)
    both = am.add_sums(am.pattern_sums(a[None], LETTERS), am.pattern_sums(b[None], LETTERS[:32]))
    s = am.describe(both, 0)
    rows_a, rows_b = T - 4, 32 - 4
    uniform_diag = np.mean([4 / (i + 1) for i in range(4, 32)])
    assert s["scores"]["diagonal"] == pytest.approx(
        (rows_a + rows_b * uniform_diag) / (rows_a + rows_b), abs=1e-4
    )


# -----------------------------------------------------------------------------
# The induction probe


def induction_map(L):
    """Every position of the second copy attends to the token after its earlier occurrence."""
    return one_key(2 * L, lambda i: i - L + 1 if i >= L else i)


def test_probe_scores_of_known_maps():
    L = 16
    maps = [
        torch.tensor(
            np.stack(
                [induction_map(L), one_key(2 * L, lambda i: i - 1), one_key(2 * L, lambda i: i - L)]
            )
        )[None].repeat(3, 1, 1, 1)
    ]
    s = head_measures.probe_scores(maps, L)
    np.testing.assert_allclose(s["induction"][0], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(s["previous"][0], [0.0, 1.0, 0.0])
    np.testing.assert_allclose(s["duplicate"][0], [0.0, 0.0, 1.0])


def test_probe_tokens():
    config = GPTConfig(block_size=48, vocab_size=40, n_layer=1, n_head=2, n_embd=8)
    idx, L = head_measures.probe_tokens(config, seed=3)
    assert L == 24 and idx.shape == (head_measures.PROBE_SEQUENCES, 48)
    assert torch.equal(idx[:, :L], idx[:, L:])
    assert all(len(set(row[:L].tolist())) == L for row in idx)  # no repeats within a copy
    assert torch.equal(head_measures.probe_tokens(config, seed=3)[0], idx)
    assert not torch.equal(head_measures.probe_tokens(config, seed=4)[0], idx)
    assert (
        head_measures.probe_tokens(
            GPTConfig(block_size=256, vocab_size=20, n_layer=1, n_head=1, n_embd=8), 0
        )[1]
        == 19
    )
    with pytest.raises(head_measures.HeadsError, match="block_size >= 4"):
        head_measures.probe_tokens(
            GPTConfig(block_size=3, vocab_size=20, n_layer=1, n_head=1, n_embd=8), 0
        )


def test_induction_scores_of_a_model_are_its_maps_scored():
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=50, n_layer=2, n_head=2, n_embd=16)).eval()
    got = head_measures.induction_scores(model, seed=5)
    idx, L = head_measures.probe_tokens(model.config, seed=5)
    with torch.no_grad():
        _, maps = model.attention_maps(idx)
    for layer, m in enumerate(maps):
        for h in range(2):
            expected = np.mean(
                [m[b, h, i, i - L + 1].item() for b in range(len(idx)) for i in range(L, 2 * L)]
            )
            assert got["induction"][layer, h] == pytest.approx(expected, abs=1e-6)


# -----------------------------------------------------------------------------
# Val loss and ablation, against computations done another way


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, corpus_path):
    """A prepared 60k-character dataset and a 2-layer model whose heads matter."""
    root = tmp_path_factory.mktemp("data")
    with open(corpus_path, encoding="utf-8") as f:
        text = f.read()[:60_000]
    prepare_text(text, str(root / "tiny"), "char")
    tok = build_tokenizer("char", text)
    torch.manual_seed(0)
    config = GPTConfig(block_size=32, vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32)
    model = GPT(config)
    with torch.no_grad():  # larger head outputs than at init, so removing one shows
        for block in model.transformer.h:
            block.attn.c_proj.weight.normal_(0.0, 0.3)
            block.attn.c_proj.bias.normal_(0.0, 0.1)
    model.eval()
    data = load_tokens(str(root / "tiny"), "val")
    return {"root": str(root), "model": model, "tok": tok, "data": data, "config": config}


def loss_by_window(model, data, block_size):
    """The val loss of record one window at a time, summed by hand."""
    ids = torch.from_numpy(np.asarray(data, dtype=np.int64))
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, block_size):
            x = ids[s : s + block_size + 1]
            logits, _ = model(x[None, :-1])
            total += F.cross_entropy(logits[0], x[1:], reduction="sum").item()
            count += len(x) - 1
    assert count == len(ids) - 1  # every token with a next one, once
    return total / count


def test_windows():
    spans = head_measures.windows(100, 32)
    assert spans == [(0, 32), (32, 32), (64, 32), (96, 3)]
    some = head_measures.windows(10_001, 100, max_windows=7)
    assert len(some) == 7 and some[0] == (0, 100) and some[-1] == (9900, 100)
    gaps = np.diff([s for s, _ in some])
    assert gaps.max() - gaps.min() <= 100  # evenly spread
    assert head_measures.windows(100, 32, max_windows=50) == spans


def test_val_loss_is_the_loss_of_record(tiny):
    model, data, B = tiny["model"], tiny["data"], tiny["config"].block_size
    got = head_measures.val_loss(model, data, head_measures.windows(len(data), B), batch_size=8)
    assert len(data) % B != 1  # the last window is a short one
    assert got == pytest.approx(loss_by_window(model, data, B), abs=1e-5)
    # and what train.py's final evaluation computes
    r = types.SimpleNamespace(
        splits={"val": torch.from_numpy(np.asarray(data, dtype=np.int64))},
        cfg=train.Settings(batch_size=8, block_size=B),
        raw=copy.deepcopy(model),
        rank=0,
        world=1,
        master=True,
        device=torch.device("cpu"),
        ctx=lambda: torch.no_grad(),
        dp_rank=0,
        dp_world=1,
        split=lambda t: t,
        split_unit=1,
        signals=None,
    )
    assert got == pytest.approx(train.full_val_loss(r), abs=1e-5)


def test_ablation_equals_zeroed_weight_columns(tiny):
    model, data, B = tiny["model"], tiny["data"], tiny["config"].block_size
    spans = head_measures.windows(len(data), B)
    result = head_measures.ablation(model, data, spans, batch_size=16, prune_below=0.05)
    base = loss_by_window(model, data, B)
    assert result["baseline_loss"] == pytest.approx(base, abs=1e-5)
    for layer, head in [(0, 1), (1, 3)]:
        by_hand = loss_by_window(heads_zeroed(model, [(layer, head)]), data, B) - base
        assert abs(by_hand) > 1e-3  # the head matters, so the comparison means something
        assert result["head_nats"][layer, head] == pytest.approx(by_hand, abs=1e-5)
    whole = loss_by_window(heads_zeroed(model, [(1, h) for h in range(4)]), data, B) - base
    assert result["layer_nats"][1] == pytest.approx(whole, abs=1e-5)
    # the pruning candidates, removed together
    assert result["pruned"] == [lh for lh in np.ndindex(2, 4) if result["head_nats"][lh] < 0.05]
    together = loss_by_window(heads_zeroed(model, result["pruned"]), data, B)
    assert result["pruned_loss"] == pytest.approx(together, abs=1e-5)
    # the hooks are gone afterwards
    assert head_measures.val_loss(model, data, spans, 16) == pytest.approx(base, abs=1e-5)


def test_ablation_with_grouped_query_heads(tiny):
    """With shared key/value heads, the slices before c_proj are still one per query head."""
    torch.manual_seed(1)
    model = GPT(dataclasses.replace(tiny["config"], n_kv_head=2)).eval()
    with torch.no_grad():
        model.transformer.h[0].attn.c_proj.weight.normal_(0.0, 0.3)
    data, B = tiny["data"], model.config.block_size
    spans = head_measures.windows(len(data), B, max_windows=20)
    base = head_measures.val_loss(model, data, spans, 8)
    with head_measures.ablated(model, [(0, 3)]):
        got = head_measures.val_loss(model, data, spans, 8) - base
    expected = head_measures.val_loss(heads_zeroed(model, [(0, 3)]), data, spans, 8) - base
    assert abs(expected) > 1e-4 and got == pytest.approx(expected, abs=1e-5)


def test_patterns_over_windows_are_the_sum_of_each_window(tiny):
    """heads.py's patterns are the shared classification summed over the windows."""
    model, tok, data = tiny["model"], tiny["tok"], tiny["data"]
    spans = head_measures.windows(len(data), 32, max_windows=3)
    got = head_measures.patterns(model, tok, data, spans, batch_size=2)
    sums = [None, None]
    for start, length in spans:
        ids = np.asarray(data[start : start + length], dtype=np.int64)
        with torch.no_grad():
            _, maps = model.attention_maps(torch.from_numpy(ids)[None])
        for layer, m in enumerate(maps):
            sums[layer] = am.add_sums(
                sums[layer], am.pattern_sums(m[0].numpy(), tok.token_strings(ids))
            )
    assert got == [[am.describe(s, h) for h in range(4)] for s in sums]


# -----------------------------------------------------------------------------
# The command


@pytest.fixture(scope="module")
def ckpt_dir(tiny, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt")
    save_checkpoint(
        {
            "model": tiny["model"].state_dict(),
            "model_args": dataclasses.asdict(tiny["config"]),
            "iter_num": 0,
            "best_val_loss": 9.9,
            "config": {"data_root": tiny["root"]},
            "tokenizer": tiny["tok"].describe(),
            "dataset": "tiny",
        },
        checkpoint_path(folder),
    )
    return str(folder)


def test_command_writes_the_report(ckpt_dir, tiny, capsys):
    code = heads.run(
        [f"--out_dir={ckpt_dir}", "--max_windows=40", "--prune_below=0.02", "--seed=7"]
    )
    out = capsys.readouterr().out
    assert code == 0
    with open(f"{ckpt_dir}/heads/heads.json", encoding="utf-8") as f:
        rep = json.load(f)
    with open(f"{ckpt_dir}/heads/heads.md", encoding="utf-8") as f:
        assert f.read().strip() in out  # printed as written
    with open(f"{ckpt_dir}/heads/heads.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert rep["windows"] == 40 and rep["seed"] == 7 and rep["dataset"].endswith("tiny")
    spans = head_measures.windows(len(tiny["data"]), 32, 40)
    assert rep["baseline_loss"] == pytest.approx(
        head_measures.val_loss(tiny["model"], tiny["data"], spans, 8), abs=1e-4
    )
    hs = rep["heads"]
    assert [(h["layer"], h["head"]) for h in hs] == list(np.ndindex(2, 4))
    probe = head_measures.induction_scores(tiny["model"], 7)
    names = "|".join(am.NAMES)
    label = re.compile(
        rf"^(({names}|broad|other|induction)|weak ({names})|mixed: ({names})\+({names}))$"
    )
    for h in hs:
        assert label.match(h["label"]), h["label"]
        assert h["label"] == (
            "induction" if h["induction"] >= head_measures.INDUCTION else h["pattern"]
        )
        assert h["induction"] == pytest.approx(probe["induction"][h["layer"], h["head"]], abs=1e-4)
        assert sum(h["scores"].values()) == pytest.approx(1.0, abs=3e-4)
        assert h["prune"] == (h["ablation_nats"] < 0.02)
        assert h["score_std"] > 0 and 0 < h["entropy_ratio"] <= 1
        row = (
            rf"^\| {h['layer']} \| {h['head']} \| {re.escape(h['label'])}( \(prune\))? "
            rf"\| {h['concentration']} \| {h['score_std']:.2f} \| {h['entropy']:.2f} "
            rf"\({h['entropy_ratio']:.2f}\) \|"
        )
        assert re.search(row, out, re.M)
    ranked = sorted(hs, key=lambda h: h["rank"])
    assert [h["rank"] for h in ranked] == list(range(1, 9))
    assert all(a["ablation_nats"] >= b["ablation_nats"] for a, b in zip(ranked, ranked[1:]))
    assert f"{rep['pruned_loss']:.4f}" in out
    assert rep["score_bound"] is None and "QK-norm bounds" not in out  # no QK-norm here
    n_pruned = sum(h["prune"] for h in hs)
    said = re.search(r"Pruning the (\d+) (heads?) whose", out)
    assert said and int(said[1]) == n_pruned and (said[2] == "head") == (n_pruned == 1)


def test_no_checkpoint_and_a_dataset_of_another_tokenizer(ckpt_dir, tiny, tmp_path, capsys):
    assert heads.run([f"--out_dir={tmp_path}/none"]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    prepare_text(
        "just a few other characters here, repeated " * 50, str(tmp_path / "other"), "char"
    )
    assert heads.run([f"--out_dir={ckpt_dir}", "--dataset=other", f"--data_root={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "another tokenizer" in err


def test_a_folder_that_takes_no_file_stops_before_the_measurements(
    ckpt_dir, tmp_path, capsys, monkeypatch
):
    # the report goes to <checkpoint folder>/heads, here a file: nothing to measure for
    shutil.copy(checkpoint_path(ckpt_dir), tmp_path)
    (tmp_path / "heads").write_text("a file, not a folder")
    measured = []
    monkeypatch.setattr(heads, "report", lambda *args: measured.append(args))
    assert heads.run([f"--out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot write into {tmp_path / 'heads'}"), err
    # before, `pass --out_dir=DIR`: the folder the checkpoint is read from, no way out
    assert err.endswith("pass --heads_dir=DIR"), err
    assert len(err.splitlines()) == 1 and measured == []
    monkeypatch.undo()
    elsewhere = tmp_path / "elsewhere"
    assert heads.run([f"--out_dir={tmp_path}", f"--heads_dir={elsewhere}", "--max_windows=2"]) == 0
    assert sorted(os.listdir(elsewhere)) == ["heads.json", "heads.md", "heads.png"]


def test_checkpoint_file_and_a_checkpoint_without_its_dataset(ckpt_dir, tiny, tmp_path, capsys):
    assert (
        heads.run([f"--init_from={ckpt_dir}/ckpt.pt", f"--out_dir={tmp_path}", "--max_windows=5"])
        == 0
    )
    with open(f"{ckpt_dir}/heads/heads.json", encoding="utf-8") as f:
        assert json.load(f)["windows"] == 5  # the val split named in the checkpoint, next to it
    save_checkpoint(
        {
            "model": tiny["model"].state_dict(),
            "model_args": dataclasses.asdict(tiny["config"]),
            "tokenizer": tiny["tok"].describe(),
        },
        checkpoint_path(tmp_path / "bare"),
    )
    capsys.readouterr()
    assert heads.run([f"--out_dir={tmp_path}/bare"]) == 2
    assert "pass --dataset=NAME" in capsys.readouterr().err
    assert (
        heads.run(
            [
                f"--out_dir={tmp_path}/bare",
                "--dataset=tiny",
                f"--data_root={tiny['root']}",
                "--max_windows=5",
            ]
        )
        == 0
    )


def test_a_damaged_record_of_the_dataset_asks_for_it(tiny, tmp_path, capsys):
    # what train.py writes is a dict of settings and a dataset's name: anything else
    # in their place says nothing, and the command asks for the dataset
    save_checkpoint(
        {
            "model": tiny["model"].state_dict(),
            "model_args": dataclasses.asdict(tiny["config"]),
            "tokenizer": tiny["tok"].describe(),
            "config": None,
            "dataset": 5,
        },
        checkpoint_path(tmp_path),
    )
    assert heads.run([f"--out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "pass --dataset=NAME" in err and "\n" not in err, err
    args = [f"--out_dir={tmp_path}", "--dataset=tiny", f"--data_root={tiny['root']}"]
    assert heads.run([*args, "--max_windows=5"]) == 0


def test_a_relative_data_root_asked_for_from_another_folder(tiny, tmp_path, capsys, monkeypatch):
    # a run trained with --data_root=data (relative to where it ran) and measured from
    # another folder: its line asks for the folder, where it looked in the wrong place
    # ("unknown dataset", or tiny Shakespeare prepared a second time beside the user)
    save_checkpoint(
        {
            "model": tiny["model"].state_dict(),
            "model_args": dataclasses.asdict(tiny["config"]),
            "tokenizer": tiny["tok"].describe(),
            "config": {"data_root": os.path.basename(tiny["root"])},
            "dataset": "tiny",
        },
        checkpoint_path(tmp_path / "run"),
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert heads.run([f"--out_dir={tmp_path / 'run'}", "--max_windows=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert f"--data_root={os.path.basename(tiny['root'])}, which is no folder" in err, err
    assert err.endswith("pass --data_root=FOLDER, the folder that holds it"), err
    assert os.listdir(elsewhere) == []  # nothing prepared here
    # the default root ("") and an absolute one are looked for as before (here: not there)
    for root in ("", str(tmp_path / "gone")):
        ckpt = torch.load(checkpoint_path(tmp_path / "run"), weights_only=True)
        ckpt["config"] = {"data_root": root}
        save_checkpoint(ckpt, checkpoint_path(tmp_path / "other"))
        assert heads.run([f"--out_dir={tmp_path / 'other'}", "--max_windows=5"]) == 2
        err = capsys.readouterr().err
        assert "unknown dataset 'tiny'" in err and "no folder from here" not in err, err
    # from the folder it was trained in, the record holds
    monkeypatch.chdir(os.path.dirname(tiny["root"]))
    assert heads.run([f"--out_dir={tmp_path / 'run'}", "--max_windows=5"]) == 0
