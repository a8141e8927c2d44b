"""A training run's timeline: train.py --snapshots and --log_heads (support/timeline.py),
the snapshots loaded by sample.py and served by explore.py as steps, and
experiments/head_timeline.py drawing the log.

The logged induction scores and labels are checked against the probe of heads.py
run on each snapshot, loaded as any checkpoint is; the last snapshot against ckpt.pt.
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

# pytest puts tests/ on the path: train.py's tiny settings and its helpers
from conftest import ctrl_c_reaches_it, read_log, run_in_process, tiny_run

from experiments import head_timeline
from explorer.live import RunLog
from support import head_measures, timeline
from support.loading import load_checkpoint, load_model

EVERY = ["--snapshots=True", "--log_heads=True", "--eval_interval=2"]


@pytest.fixture(scope="module")
def run(data_root, tmp_path_factory):
    """A tiny run evaluated at iters 0, 2, 4 and 6, with snapshots and heads logged."""
    out = tmp_path_factory.mktemp("timeline") / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=6", *EVERY))
    return str(out)


def val_tokens(data_root):
    from data.dataset import load_tokens

    return np.asarray(load_tokens(os.path.join(data_root, "shakespeare_char"), "val"))


def test_a_snapshot_at_every_evaluation_in_ckpt_format(run):
    log = read_log(run)
    assert [rec["iter"] for rec in log] == [0, 2, 4, 6]
    snapshots = timeline.list_snapshots(run)
    assert list(snapshots) == [0, 2, 4, 6]
    assert os.path.basename(snapshots[4]) == "iter_000004.pt"
    ckpt = load_checkpoint(run)
    for iter_num, path in snapshots.items():
        snapshot = load_checkpoint(path)
        assert snapshot["iter_num"] == iter_num
        assert "optimizer" not in snapshot and "rng" not in snapshot
        assert snapshot["model_args"] == ckpt["model_args"]
        assert snapshot["tokenizer"] == ckpt["tokenizer"]
    last = load_checkpoint(snapshots[6])["model"]
    assert last.keys() == ckpt["model"].keys()
    assert all(torch.equal(last[k], ckpt["model"][k]) for k in last)
    # the weights change between evaluations: these are four different models
    first = load_checkpoint(snapshots[0])["model"]
    assert not torch.equal(
        first["transformer.h.0.mlp.c_fc.weight"], last["transformer.h.0.mlp.c_fc.weight"]
    )


def test_logged_heads_equal_the_probe_on_each_snapshot(run, data_root):
    log = read_log(run)
    tokens = val_tokens(data_root)[: timeline.PROBE_WINDOWS * timeline.PROBE_LENGTH + 1]
    for rec, (iter_num, path) in zip(log, timeline.list_snapshots(run).items()):
        assert rec["iter"] == iter_num
        model, tok, _ = load_model(path, run)
        model.eval()
        # heads.py's probe, on the snapshot loaded as any checkpoint is
        probe = head_measures.induction_scores(model, timeline.SEED)["induction"]
        np.testing.assert_allclose(rec["heads"]["induction"], probe, atol=1e-4, rtol=0)
        assert rec["heads"] == timeline.head_probe(model, tok, tokens)
        n_layer, n_head = model.config.n_layer, model.config.n_head
        assert np.shape(rec["heads"]["label"]) == (n_layer, n_head)


def test_snapshots_load_in_sample_and_explore(run, repo_root):
    path = timeline.list_snapshots(run)[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    sample = subprocess.run(
        [sys.executable, "sample.py", f"--init_from={path}", "--num_samples=1",
         "--max_new_tokens=8", "--device=cpu", "--attn_dir="],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert sample.returncode == 0, sample.stderr[-2000:]
    proc = subprocess.Popen(
        [sys.executable, "explore.py", f"--out_dir={run}", "--port=0"],
        cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=ctrl_c_reaches_it,
    )  # fmt: skip
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        port = int(re.search(r"127\.0\.0\.1:(\d+)/", lines[1])[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/api/steps")
        assert json.loads(conn.getresponse().read()) == {"steps": [0, 2, 4, 6], "checkpoint": 6}
        body = json.dumps({"prompt": "ROMEO:", "step": 2, "continuation": 0})
        conn.request("POST", "/api/analyze", body, {"Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        assert answer["step"] == 2 and len(answer["logit_lens"]) == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.communicate()


def test_the_limit_keeps_them_evenly_spread_and_the_newest(data_root, tmp_path):
    assert timeline.kept_snapshots(set(range(0, 17)), 16, 4, 1) == {0, 8, 16}
    assert timeline.kept_snapshots(set(range(0, 17)), 16, 5, 1) == {0, 4, 8, 12, 16}
    assert timeline.kept_snapshots({0, 10, 20, 25}, 25, 3, 10) == {0, 20, 25}
    assert timeline.kept_snapshots({0, 3}, 3, 2, 100) == {0, 3}
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=8", *EVERY[:1], "--eval_interval=1",
                        "--snapshot_limit=3"))  # fmt: skip
    assert [rec["iter"] for rec in read_log(out)] == list(range(9))
    assert list(timeline.list_snapshots(out)) == [0, 4, 8]


def test_a_new_run_drops_the_old_runs_snapshots_and_resume_never_reads_them(data_root, tmp_path):
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=3", *EVERY[:1], "--eval_interval=1"))
    assert list(timeline.list_snapshots(out)) == [0, 1, 2, 3]
    # a fresh run in the same folder, started over as train.py's refusal to replace the
    # checkpoint says: the first run's snapshots are not of this run
    os.remove(out / "ckpt.pt")
    run_in_process(tiny_run(data_root, out, "--max_iters=4", *EVERY[:1], "--eval_interval=2"))
    assert list(timeline.list_snapshots(out)) == [0, 2, 4]
    for path in timeline.list_snapshots(out).values():
        with open(path, "wb") as f:
            f.write(b"not a checkpoint")
    run_in_process(tiny_run(data_root, out, "--max_iters=6", *EVERY[:1], "--eval_interval=2",
                        "--init_from=resume"))  # fmt: skip
    assert [rec["iter"] for rec in read_log(out)] == [0, 2, 4, 6]
    assert load_checkpoint(timeline.list_snapshots(out)[6])["iter_num"] == 6


def test_a_new_run_without_snapshots_drops_the_old_runs_too(data_root, tmp_path):
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=3", *EVERY[:1], "--eval_interval=1"))
    assert list(timeline.list_snapshots(out)) == [0, 1, 2, 3]
    os.remove(out / "ckpt.pt")
    run_in_process(tiny_run(data_root, out, "--max_iters=2"))
    # the explorer's steps: the first run's snapshots, shown beside this run's checkpoint
    assert RunLog(str(out)).steps() == []
    assert not os.path.exists(out / "snapshots")


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(snapshot_limit=1), "snapshot_limit must be 2 or more"),
        (dict(log_heads=True, context_parallel=2), "context_parallel=1"),
    ],
)
def test_bad_timeline_settings_are_refused(changes, words, data_root, tmp_path, capsys):
    """Refused in one line before any work, where the feature they belong to is on
    (train.py's setup, which imports its module only then)."""
    options = [f"--{key}={value}" for key, value in changes.items()]
    with pytest.raises(SystemExit) as stop:
        run_in_process(tiny_run(data_root, tmp_path / "out", "--snapshots=True", *options))
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: ") and words in line
    assert not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# The picture


def test_timeline_command_draws_the_log(run, tmp_path, capsys):
    out = tmp_path / "timeline.png"
    assert head_timeline.run([f"--out_dir={run}", f"--out={out}"]) == 0
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "4 evaluations, iters 0 to 6" in capsys.readouterr().out
    iters, induction, labels = head_timeline.read_timeline(run)
    log = read_log(run)
    assert iters.tolist() == [rec["iter"] for rec in log]
    assert induction.tolist() == [rec["heads"]["induction"] for rec in log]
    assert labels == [rec["heads"]["label"] for rec in log]
    crossings = head_timeline.first_crossings(
        np.array([0, 10, 20]), np.array([[[0.1, 0.5]], [[0.45, 0.2]], [[0.9, 0.9]]])
    )
    assert crossings == {(0, 0): 10, (0, 1): 0}


@pytest.mark.parametrize("where, words", [("nowhere", "cannot read"), ("plain", "no heads")])
def test_timeline_command_bad_input_is_one_line(tmp_path, data_root, capsys, where, words):
    folder = tmp_path / where
    if where == "plain":
        run_in_process(tiny_run(data_root, folder, "--max_iters=2", "--eval_interval=2"))
    capsys.readouterr()
    assert head_timeline.run([f"--out_dir={folder}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and words in err
