"""Sequence-length warmup (seq_warmup): the same tokens as more, shorter sequences in the
first half of lr_decay_time, checked against the batch drawn without it, and a real timed
run through all three shapes."""

import dataclasses
import json

import torch
from conftest import run_in_process, tiny_run

import train
from support.optim import seq_warmup_cut
from support.settings import Settings


def test_the_cut_goes_by_quarters_of_lr_decay_time():
    cfg = Settings(seq_warmup=True, lr_decay_time=100.0)
    cuts = [seq_warmup_cut(cfg, s) for s in (0.0, 24.9, 25.0, 49.9, 50.0, 99.0, 500.0)]
    assert cuts == [4, 4, 2, 2, 1, 1, 1]
    off = dataclasses.replace(cfg, seq_warmup=False)
    assert [seq_warmup_cut(off, s) for s in (0.0, 30.0, 60.0)] == [1, 1, 1]


def test_a_warm_batch_is_the_plain_batch_cut_into_shorter_sequences(data_root, tmp_path):
    """At each quarter's bounds the batch is the one a run without seq_warmup draws from
    the same generator state, reshaped: the same tokens, each piece's targets its inputs
    shifted by one."""
    argv = tiny_run(
        data_root,
        tmp_path / "out",
        "--lr_decay_time=100",
        "--block_size=16",
        "--gradient_accumulation_steps=2",
    )
    cfg = train.get_config(argv)
    warm = train.setup(dataclasses.replace(cfg, seq_warmup=True))
    plain = train.setup(dataclasses.replace(cfg, out_dir=str(tmp_path / "plain")))
    for seconds, cut in [(0.0, 4), (24.9, 4), (25.0, 2), (49.9, 2), (50.0, 1), (99.0, 1)]:
        warm.seconds = seconds
        plain.seconds = seconds
        plain.data_gen.set_state(warm.data_gen.get_state())
        x, y = train.next_batch(warm)
        x_plain, y_plain = train.next_batch(plain)
        assert x_plain.shape == (2, 8, 16)
        assert x.shape == y.shape == (2, 8 * cut, 16 // cut)
        assert torch.equal(x.reshape(x_plain.shape), x_plain)
        assert torch.equal(y.reshape(y_plain.shape), y_plain)
        assert torch.equal(y[..., :-1], x[..., 1:])


def test_a_timed_run_trains_through_all_three_shapes(data_root, tmp_path, monkeypatch):
    """train.py with seq_warmup for 3 s: the shapes its steps trained on are the three,
    in order (quarter, half, whole context), and it ends with a finite loss."""
    shapes = []
    next_batch = train.next_batch

    def recording(run):
        x, y = next_batch(run)
        if not shapes or shapes[-1] != tuple(x.shape):
            shapes.append(tuple(x.shape))
        return x, y

    monkeypatch.setattr(train, "next_batch", recording)
    out = tmp_path / "out"
    argv = tiny_run(
        data_root,
        out,
        "--seq_warmup=True",
        "--max_time=3",
        "--lr_decay_time=3",
        "--max_iters=100000",
        "--lr_decay_iters=100000",
        "--eval_interval=100000",
        "--block_size=16",
    )
    run_in_process(argv)
    assert shapes == [(1, 32, 4), (1, 16, 8), (1, 8, 16)]
    with open(out / "log.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    assert last["val_loss"] < 10
