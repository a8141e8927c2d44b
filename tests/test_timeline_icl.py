"""The in-context learning score that train.py --log_heads=True logs (support/timeline.py),
and the induction corpus (data/induction.py) it is meant for.

The logged icl_score is checked against the losses computed another way: each
snapshot loaded as any checkpoint is, and the model's own loss with every target
but one position's ignored.
"""

import json
import os

import numpy as np
import pytest
import torch

# pytest puts tests/ on the path: train.py's tiny settings and its helpers
from conftest import read_log, run_in_process, tiny_run

from data.dataset import ensure_dataset, load_meta, load_tokens
from data.induction import LETTERS, LINE, LONGEST, induction_text
from support import timeline
from support.loading import load_model


@pytest.fixture(scope="module")
def run(data_root, tmp_path_factory):
    """A tiny run evaluated at iters 0, 3 and 6, with snapshots and heads logged."""
    out = tmp_path_factory.mktemp("icl") / "out"
    run_in_process(
        tiny_run(
            data_root, out, "--max_iters=6", "--snapshots=True", "--log_heads=True",
            "--eval_interval=3", block_size=16,
        )
    )  # fmt: skip
    return str(out)


def position_loss(model, x, y, position):
    """The model's own mean loss over the windows with only the targets at position
    (one, or a list) kept."""
    kept = torch.full_like(y, -1)  # -1: ignored by the loss
    kept[:, position] = y[:, position]
    return model(x, kept)[1].item()


def test_positions_are_olssons_scaled_to_the_context():
    assert timeline.icl_positions(512) == (50, 500)
    assert timeline.icl_positions(64) == (6, 62)
    assert timeline.icl_positions(256) == (25, 250)
    assert timeline.icl_positions(8) == (1, 7)


def test_logged_icl_score_equals_the_losses_computed_another_way(run, data_root):
    log = read_log(run)
    assert [rec["iter"] for rec in log] == [0, 3, 6]
    val = np.asarray(load_tokens(os.path.join(data_root, "shakespeare_char"), "val"))
    T = 16
    early, late = timeline.icl_positions(T)
    n = timeline.ICL_WINDOWS
    rows = np.arange(n)[:, None] * T + np.arange(T + 1)  # the first n windows of the val split
    chunk = torch.from_numpy(val[rows].astype(np.int64))
    x, y = chunk[:, :-1], chunk[:, 1:]
    scores = []
    for rec, path in zip(log, timeline.list_snapshots(run).values()):
        model, _, _ = load_model(path, run)
        model.eval()
        with torch.no_grad():
            expected = position_loss(model, x, y, late) - position_loss(model, x, y, early)
        assert isinstance(rec["icl_score"], float)
        assert rec["icl_score"] == pytest.approx(expected, abs=1e-4)
        scores.append(rec["icl_score"])
    # the models differ, and so do their scores: the logged number follows the training
    assert len(set(scores)) == 3


def test_a_model_that_ignores_its_context_scores_zero():
    """All weights 0: the logits are 0 at every position, the loss ln(vocab) at each."""
    from model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=53, n_layer=1, n_head=1, n_embd=8))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # logits all 0: the loss is ln(53) at every position
    tokens = np.random.default_rng(0).integers(0, 53, size=32 * 8 + 1)
    score, windows = timeline.icl_score(model, tokens)
    assert windows == 8
    assert score == pytest.approx(0.0, abs=1e-6)


def test_the_induction_corpus_repeats_a_string_on_each_line(tmp_path):
    text = induction_text(chars=(LINE + 1) * 200, seed=3)
    lines = text.split("\n")
    assert lines[-1] == "" and len(lines) == 201
    for line in lines[:-1]:
        assert len(line) == LINE and set(line) <= set(LETTERS)
        # the line's shortest period: at most the longest string (LINE random letters have none)
        period = next(p for p in range(1, LINE + 1) if line[p:] == line[: LINE - p])
        assert period <= LONGEST
    assert induction_text(chars=(LINE + 1) * 200, seed=3) == text
    assert induction_text(chars=(LINE + 1) * 200, seed=4) != text
    # prepared on first use, like tiny Shakespeare, as a char dataset
    folder = ensure_dataset("induction", str(tmp_path))
    meta = load_meta(folder)
    assert meta["vocab_size"] == len(LETTERS) + 1
    with open(os.path.join(folder, "meta.json")) as f:
        assert json.load(f)["source"] == "data/induction.py"


def test_summarising_a_run_stopped_before_it_logged_heads_is_one_line(
    tmp_path, monkeypatch, capsys
):
    """--train=False over a run's folder whose log has no heads yet (the run was
    stopped early): one line saying why, exit 2, and nothing written."""
    from experiments import shakespeare_induction

    run = tmp_path / "out" / "char_plain"
    run.mkdir(parents=True)
    (run / "log.jsonl").write_text(json.dumps({"iter": 10, "loss": 2.5}) + "\n")
    results = tmp_path / "shakespeare_induction.json"
    results.write_text(json.dumps({"char_plain": {"tokenizer": "char"}}))
    monkeypatch.setattr(shakespeare_induction, "OUT", str(tmp_path / "out"))
    assert shakespeare_induction.run(["--train=False", f"--out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "logs no heads" in err
    assert len(err.strip().splitlines()) == 1
    assert json.loads(results.read_text()) == {"char_plain": {"tokenizer": "char"}}
    assert shakespeare_induction.run(["--threads=0", f"--out_dir={tmp_path}"]) == 2
    assert "--threads must be 1 to" in capsys.readouterr().err


def test_a_runs_summary_reads_its_log_and_its_model(run, data_root):
    from experiments import shakespeare_induction

    found = shakespeare_induction.summary(run)
    log = read_log(run)
    best = [float(np.max(rec["heads"]["induction"])) for rec in log]
    assert found["best_induction_start"] == pytest.approx(best[0], abs=1e-4)
    assert found["best_induction_end"] == pytest.approx(best[-1], abs=1e-4)
    assert found["best_induction_max"] == pytest.approx(max(best), abs=1e-4)
    assert found["icl_end"] == log[-1]["icl_score"]
    assert found["phase_change"] is None  # six iters of a tiny model: no induction head
    # the final model on val passages written twice, with the model's own loss on each copy
    model, _, _ = load_model(run, run)
    model.eval()
    L = model.config.block_size // 2
    val = np.asarray(load_tokens(os.path.join(data_root, "shakespeare_char"), "val"))
    starts = np.linspace(0, len(val) - L - 1, shakespeare_induction.PASSAGES).round().astype(int)
    x = torch.from_numpy(np.stack([val[s : s + L] for s in starts]).astype(np.int64))
    idx = torch.cat([x, x], dim=1)
    with torch.no_grad():
        first = position_loss(model, idx[:, :-1], idx[:, 1:], list(range(L - 1)))
        second = position_loss(model, idx[:, :-1], idx[:, 1:], list(range(L, 2 * L - 1)))
    assert found["passage_first_copy_loss"] == pytest.approx(first, abs=1e-4)
    assert found["passage_second_copy_loss"] == pytest.approx(second, abs=1e-4)
    assert 0 <= found["passage_best_induction"] <= 1
