"""The explorer's training timeline: GET /api/timeline over a run's folder (explorer/live.py),
through a real server, and explore.py opening a run that has no ckpt.pt yet.

The oracles: the log read another way (conftest.read_log, and experiments/head_timeline's
reader of the heads), the label changes found by numpy over those arrays, and the
snapshot loaded directly. The runs are real train.py runs (--snapshots, --log_heads);
a later evaluation with a label change is added by hand to a copy of the log, since a
run this small changes no label.
"""

import json
import os
import shutil

import numpy as np
import pytest
import torch

# pytest puts tests/ on the path: train.py's tiny settings, the server helpers
from conftest import read_log, run_in_process, tiny_run
from test_explore import request, serve

from experiments import head_timeline
from explorer.live import open_model
from explorer.server import Explorer
from support import head_measures, timeline
from support.checkpoint import save_checkpoint
from support.loading import load_checkpoint, load_model


@pytest.fixture(scope="module")
def run(data_root, tmp_path_factory):
    """A tiny run evaluated at iters 0, 2, 4 and 6, with snapshots and heads logged."""
    out = tmp_path_factory.mktemp("live") / "out"
    extra = ("--max_iters=6", "--eval_interval=2", "--snapshots=True", "--log_heads=True")
    run_in_process(tiny_run(data_root, out, *extra))
    return str(out)


@pytest.fixture
def folder(run, tmp_path):
    """A copy of the run, for a test to change."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return str(copy)


@pytest.fixture
def server(folder):
    model, tok, _ = load_model("", folder)
    server, guard = serve(Explorer(model.eval(), tok, folder, step=6))
    yield server
    guard.cancel()
    server.shutdown()
    server.server_close()


def timeline_of(server, since=None):
    path = "/api/timeline" if since is None else f"/api/timeline?since={since}"
    status, answer = request(server, "GET", path)
    assert status == 200, answer
    return answer


def append(folder, text):
    with open(os.path.join(folder, "log.jsonl"), "a") as f:
        f.write(text)


def later_evaluation(folder):
    """The log's last line moved on to iter 8, with an in-context learning score and
    L1 H0's label changed, as a line of a longer run would be."""
    last = read_log(folder)[-1]
    line = dict(last, iter=8, icl_score=-0.25)
    line["heads"] = json.loads(json.dumps(last["heads"]))
    line["heads"]["label"][1][0] = "induction"
    line["heads"]["induction"][1][0] = 0.5
    return line


def test_the_timeline_is_the_log(server, folder):
    append(folder, json.dumps(later_evaluation(folder)) + "\n")
    answer = timeline_of(server)
    log = read_log(folder)
    got = answer["evaluations"]
    assert [e["iter"] for e in got] == [0, 2, 4, 6, 8]
    assert [e["val_loss"] for e in got] == [r["val_loss"] for r in log]
    assert [e["train_loss"] for e in got] == [r["train_loss"] for r in log]
    # the in-context learning score, as train.py logged it with the heads
    assert [e["icl_score"] for e in got] == [r["icl_score"] for r in log]
    assert got[-1]["icl_score"] == -0.25
    iters, induction, labels = head_timeline.read_timeline(folder)
    assert [e["iter"] for e in got] == iters.tolist()
    np.testing.assert_array_equal(np.array([e["induction"] for e in got]), induction)
    assert [e["label"] for e in got] == labels
    # every change of a head's label, found by numpy over the same arrays
    names = np.array(labels)  # (E, n_layer, n_head)
    want = [
        {"iter": int(iters[e]), "layer": int(layer), "head": int(head)}
        for e, layer, head in np.argwhere(names[1:] != names[:-1]) + [1, 0, 0]
    ]
    assert [{k: c[k] for k in ("iter", "layer", "head")} for c in answer["label_changes"]] == want
    assert {"iter": 8, "layer": 1, "head": 0, "to": "induction"}.items() <= answer["label_changes"][
        -1
    ].items()
    assert answer["steps"] == [0, 2, 4, 6] and answer["checkpoint"] == 6
    assert answer["opened"] == "ckpt.pt"
    assert answer["induction_threshold"] == head_measures.INDUCTION
    assert answer["skipped_lines"] == 0 and answer["run"] is True


def test_a_line_being_written_is_skipped_until_it_is_whole(server, folder):
    before = timeline_of(server)
    line = json.dumps(later_evaluation(folder)) + "\n"
    append(folder, line[:40])  # train.py mid-write: no newline yet
    partial = timeline_of(server)
    assert partial["evaluations"] == before["evaluations"]
    assert partial["skipped_lines"] == 1
    append(folder, line[40:])
    whole = timeline_of(server)
    assert whole["evaluations"][:-1] == before["evaluations"]
    assert whole["evaluations"][-1]["iter"] == 8 and whole["skipped_lines"] == 0
    # a line that is not JSON (a run killed mid-write, then resumed) is skipped, not fatal
    append(folder, '{"iter": 10, "val_lo\n')
    assert timeline_of(server)["skipped_lines"] == 1


def test_since_says_unchanged_until_a_snapshot_or_an_evaluation_comes(server, folder):
    first = timeline_of(server)
    assert timeline_of(server, first["version"]) == {
        "version": first["version"],
        "changed": False,
    }
    # a snapshot, written as train.py writes one: the slider's new stop
    snapshot = load_checkpoint(timeline.snapshot_path(folder, 6))
    save_checkpoint(dict(snapshot, iter_num=8), timeline.snapshot_path(folder, 8))
    with_snapshot = timeline_of(server, first["version"])
    assert with_snapshot["changed"] and with_snapshot["steps"] == [0, 2, 4, 6, 8]
    assert timeline_of(server, with_snapshot["version"])["changed"] is False
    append(folder, json.dumps(later_evaluation(folder)) + "\n")
    with_line = timeline_of(server, with_snapshot["version"])
    assert with_line["changed"] and with_line["evaluations"][-1]["iter"] == 8
    # a new run in the folder starts a new log: the timeline starts again with it
    open(os.path.join(folder, "log.jsonl"), "w").close()
    restarted = timeline_of(server, with_line["version"])
    assert restarted["changed"] and restarted["evaluations"] == []


def test_a_log_without_heads_draws_its_losses(data_root, tmp_path):
    """A run trained without --log_heads: its losses, and no heads, no label changes."""
    out = str(tmp_path / "plain")
    run_in_process(tiny_run(data_root, out, "--max_iters=2", "--eval_interval=1"))
    model, tok, _ = load_model("", out)
    explorer = Explorer(model.eval(), tok, out, step=2)
    answer = explorer.timeline()
    assert [e["val_loss"] for e in answer["evaluations"]] == [r["val_loss"] for r in read_log(out)]
    # an older log's lines, or a run's without --log_heads: no score, no heads
    assert all(set(e) == {"iter", "train_loss", "val_loss"} for e in answer["evaluations"])
    assert answer["label_changes"] == [] and answer["steps"] == []
    # one model, no run: nothing to follow
    alone = Explorer(model.eval(), tok).timeline()
    assert alone["run"] is False and alone["evaluations"] == []


def test_a_run_without_ckpt_opens_at_its_newest_snapshot(folder):
    """train.py saves ckpt.pt from its second evaluation on; before that, explore.py
    opens the newest snapshot, and says so."""
    os.remove(os.path.join(folder, "ckpt.pt"))
    model, tok, run_dir, step, opened = open_model("", folder)
    assert (run_dir, step, opened) == (folder, 6, "snapshot")
    want = load_checkpoint(timeline.snapshot_path(folder, 6))["model"]
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=0)
    explorer = Explorer(model.eval(), tok, run_dir, step=step, opened=opened)
    answer = explorer.timeline()
    assert (answer["steps"], answer["checkpoint"], answer["opened"]) == (
        [0, 2, 4, 6],
        6,
        "snapshot",
    )
    # with ckpt.pt there, it is ckpt.pt's
    shutil.copy(timeline.snapshot_path(folder, 4), os.path.join(folder, "ckpt.pt"))
    *_, step, opened = open_model("", folder)
    assert (step, opened) == (4, "ckpt.pt")
