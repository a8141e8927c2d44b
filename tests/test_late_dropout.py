"""Late dropout (late_dropout): every dropout off for the first share of the lr schedule,
the config's after. Oracles: the schedule's numbers; a run with late dropout against one
trained without dropout up to the switch and resumed from its checkpoint with dropout on
(the same steps, loss for loss); the modules' own p and attention's dropout."""

import dataclasses
import json

import pytest
import torch
from conftest import run_in_process, tiny_run, tiny_settings

import train
from model import MultiHeadAttention
from support.optim import late_dropout_on


def test_dropout_comes_on_after_its_share_of_the_schedule():
    by_iters = tiny_settings(late_dropout=0.5, lr_decay_iters=100)
    assert [late_dropout_on(by_iters, it, 0.0) for it in (0, 49, 50, 99, 500)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    # by seconds or by iters, whichever is further along, as the lr decays
    timed = dataclasses.replace(by_iters, lr_decay_iters=10**9, lr_decay_time=10.0)
    assert [late_dropout_on(timed, 0, s) for s in (0.0, 4.9, 5.0, 9.0)] == [
        False,
        False,
        True,
        True,
    ]
    assert late_dropout_on(dataclasses.replace(timed, lr_decay_iters=100), 50, 1.0)
    # 0: dropout on from the first step
    assert late_dropout_on(dataclasses.replace(timed, late_dropout=0.0), 0, 0.0)


def step_losses(out_dir):
    """Each training step's loss in out_dir/log.jsonl, first to last."""
    with open(out_dir / "log.jsonl") as f:
        records = [json.loads(line) for line in f]
    return [r["loss"] for r in records if "loss" in r]


def dropouts(run):
    """The p of each nn.Dropout in the run's model and each attention's dropout."""
    modules = list(run.raw.modules())
    ps = {m.p for m in modules if isinstance(m, torch.nn.Dropout)}
    attn = {m.attn_dropout for m in modules if isinstance(m, MultiHeadAttention)}
    return ps, attn


@pytest.mark.parametrize("attn_dropout, attn_on", [(None, 0.1), (0.0, 0.0), (0.05, 0.05)])
def test_the_switch_sets_every_dropout_and_drops_compiled_graphs_once(
    data_root, tmp_path, monkeypatch, attn_dropout, attn_on
):
    resets = []
    monkeypatch.setattr(torch.compiler, "reset", lambda: resets.append(True))
    argv = tiny_run(
        data_root, tmp_path / "out", "--lr_decay_iters=10", "--late_dropout=0.5", dropout=0.1
    )
    cfg = dataclasses.replace(train.get_config(argv), attn_dropout=attn_dropout, compile=True)
    run = train.setup(cfg)
    # the model is built with the config's dropout; the first step turns it off
    assert dropouts(run) == ({0.1}, {attn_on})
    for it in range(5):
        train.set_late_dropout(run, it)
        assert dropouts(run) == ({0.0}, {0.0})
    assert resets == []
    for it in range(5, 10):
        train.set_late_dropout(run, it)
        assert dropouts(run) == ({0.1}, {attn_on})
    assert resets == [True]


def test_a_late_dropout_run_is_a_run_without_dropout_resumed_with_it(data_root, tmp_path):
    """12 steps with dropout off for the first 6: step for step the losses of 6 steps
    trained with dropout 0, then 6 resumed from that checkpoint with dropout 0.1; and
    not those of 12 steps without dropout, whose last 6 differ."""
    keys = ["--lr_decay_iters=12", "--eval_interval=6"]
    late = tmp_path / "late"
    run_in_process(
        tiny_run(data_root, late, *keys, "--max_iters=12", "--late_dropout=0.5", dropout=0.1)
    )
    split = tmp_path / "split"
    run_in_process(tiny_run(data_root, split, *keys, "--max_iters=6", dropout=0.0))
    resume = ["--max_iters=12", "--init_from=resume"]
    run_in_process(tiny_run(data_root, split, *keys, *resume, dropout=0.1))
    never = tmp_path / "never"
    run_in_process(tiny_run(data_root, never, *keys, "--max_iters=12", dropout=0.0))
    late_losses = step_losses(late)
    split_losses = step_losses(split)
    never_losses = step_losses(never)
    assert len(late_losses) == len(split_losses) == len(never_losses) == 12
    assert late_losses == split_losses
    assert late_losses[:6] == never_losses[:6]
    assert all(a != b for a, b in zip(late_losses[6:], never_losses[6:], strict=True))


def test_late_dropout_without_dropout_is_refused_in_one_line(data_root, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_in_process(tiny_run(data_root, tmp_path / "out", "--late_dropout=0.5"))
    assert stop.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        "error: late_dropout turns dropout on late in the run, and dropout is 0: give "
        "--dropout (e.g. 0.1), or --late_dropout=0"
    ]
