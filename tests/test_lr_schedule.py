"""The learning-rate schedule by time (lr_decay_time): the cosine at the fraction of
the seconds, whichever of iters and seconds is further along; a run timed in seconds
ends at min_lr, and a resumed run goes on from the seconds its checkpoint holds."""

import json

import pytest
from conftest import file_hash, run_in_process, tiny_run, tiny_settings

from support.configurator import BAD_INPUT
from support.loading import load_checkpoint
from support.optim import get_lr
from support.run_log import read_evaluations

LR, MIN_LR = 1e-3, 1e-4


def test_the_cosine_at_the_fraction_of_the_seconds():
    cfg = tiny_settings(
        learning_rate=LR, min_lr=MIN_LR, warmup_iters=0, lr_decay_iters=1000, lr_decay_time=10.0
    )
    # cos(pi / 2) = 0: halfway, the lr is halfway between its ends
    assert get_lr(0, cfg, 5.0) == pytest.approx((LR + MIN_LR) / 2)
    # cos(3 pi / 4) = -sqrt(2) / 2
    assert get_lr(0, cfg, 7.5) == pytest.approx(MIN_LR + (LR - MIN_LR) * (1 - 0.5**0.5) / 2)
    assert get_lr(0, cfg, 10.0) == pytest.approx(MIN_LR)
    assert get_lr(0, cfg, 1e6) == pytest.approx(MIN_LR)
    # iters further along than seconds: the iters decide
    assert get_lr(500, cfg, 1.0) == pytest.approx((LR + MIN_LR) / 2)
    assert get_lr(500, cfg, 7.5) == get_lr(0, cfg, 7.5)
    # without lr_decay_time, seconds change nothing
    by_iters = tiny_settings(learning_rate=LR, min_lr=MIN_LR, warmup_iters=0, lr_decay_iters=1000)
    assert get_lr(0, by_iters, 1e6) == LR


def test_warmup_comes_first():
    cfg = tiny_settings(learning_rate=LR, warmup_iters=4, lr_decay_time=1.0)
    assert get_lr(1, cfg, 100.0) == pytest.approx(LR * 2 / 5)


def test_lr_cooldown_holds_the_peak_then_falls_in_a_straight_line():
    cfg = tiny_settings(
        learning_rate=LR, min_lr=MIN_LR, warmup_iters=0, lr_decay_iters=1000, lr_cooldown=0.4
    )
    # the plateau: the peak lr for the first 60% of the schedule
    assert get_lr(0, cfg) == LR
    assert get_lr(600, cfg) == pytest.approx(LR)
    # a quarter of the way into the cooldown, a quarter of the way down
    assert get_lr(700, cfg) == pytest.approx(LR - (LR - MIN_LR) / 4)
    assert get_lr(1000, cfg) == pytest.approx(MIN_LR)
    # by seconds too, whichever is further along: 8 of 10 s is halfway down
    timed = tiny_settings(
        learning_rate=LR,
        min_lr=MIN_LR,
        warmup_iters=0,
        lr_decay_iters=1000,
        lr_decay_time=10.0,
        lr_cooldown=0.4,
    )
    assert get_lr(0, timed, 8.0) == pytest.approx((LR + MIN_LR) / 2)
    # 1.0: one straight line from the warmup's end down to min_lr
    line = tiny_settings(
        learning_rate=LR, min_lr=0.0, warmup_iters=100, lr_decay_iters=1100, lr_cooldown=1.0
    )
    assert get_lr(100, line) == LR
    assert get_lr(600, line) == pytest.approx(LR / 2)
    assert get_lr(850, line) == pytest.approx(LR / 4)


def test_an_lr_cooldown_outside_the_schedule_is_refused_in_one_line(data_root, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        run_in_process(tiny_run(data_root, tmp_path / "out", "--lr_cooldown=1.5"))
    assert stop.value.code == BAD_INPUT
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        "error: lr_cooldown is a share of the lr schedule, in (0, 1]; got 1.5 (0: the cosine)"
    ]


def steps(out_dir):
    """The training steps in out_dir/log.jsonl (the records with an lr and no val loss)."""
    with open(out_dir / "log.jsonl") as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if "loss" in r]


def test_a_run_timed_in_seconds_ends_at_min_lr_and_resumes_from_its_seconds(
    data_root, tmp_path, capsys
):
    out = tmp_path / "out"
    keys = dict(learning_rate=LR, min_lr=MIN_LR, warmup_iters=2, eval_interval=1000000)
    base = tiny_run(
        data_root, out, "--max_iters=1000000", "--lr_decay_iters=1000000", "--lr_decay_time=3.0"
    )
    base = [*base, *[f"--{key}={value}" for key, value in keys.items()]]
    run_in_process([*base, "--max_time=1.5"])
    # its progress bar counts to the seconds that end it, not to the million iters
    said = capsys.readouterr()
    bar = said.err
    assert "/1.5s of training" in bar and "iter " in bar and "/1000000" not in bar
    assert "done at iter" in said.out and " in all" not in said.out  # a run of its own
    first = load_checkpoint(str(out))
    assert first["seconds"] >= 1.5
    cfg = tiny_settings(**first["config"])
    lrs = [s["lr"] for s in steps(out)]
    # after warmup the lr only falls; stopped halfway through the seconds, it is about
    # halfway (each step's lr is from the seconds of the step before it)
    after_warmup = lrs[2:]
    assert after_warmup == sorted(after_warmup, reverse=True)
    assert (LR + MIN_LR) / 2 <= lrs[-1] < get_lr(2, cfg, 1.2)

    # resumed: the lr goes on from the checkpoint's seconds, not from the top, and
    # max_time counts them, as max_iters counts a checkpoint's iters: the run ends at
    # 4.5 s of training in all, not 4.5 s after it resumed
    n_before = len(lrs)
    run_in_process([*base, "--max_time=4.5", "--init_from=resume"])
    said = capsys.readouterr()
    assert "/4.5s of training" in said.err
    resumed = steps(out)[n_before:]
    assert resumed[0]["lr"] == pytest.approx(get_lr(first["iter_num"], cfg, first["seconds"]))
    last = load_checkpoint(str(out))
    assert 4.5 <= last["seconds"] < first["seconds"] + 4.5
    # its last line gives this run's seconds and those in all, as max_time counts them
    done = [line for line in said.out.splitlines() if line.startswith("done at iter")]
    assert len(done) == 1 and "(max_time reached)" in done[0], done
    assert "s of training in this run (" in done[0], done
    assert f"ms/iter), {last['seconds']:.1f}s in all;" in done[0], done
    # past lr_decay_time, the last steps and the final evaluation are at min_lr
    assert resumed[-1]["lr"] == pytest.approx(MIN_LR)
    final = read_evaluations(str(out))[-1]
    assert final["lr"] == pytest.approx(MIN_LR)
    # its log counts the seconds in all too: a curve by training time goes on, not back
    assert final["elapsed_s"] == pytest.approx(last["seconds"], abs=0.1)

    # between log steps too (none here but the last), the checkpoint has every second
    run_in_process([*base, "--max_time=5.5", "--log_interval=1000000", "--init_from=resume"])
    assert load_checkpoint(str(out))["seconds"] >= 5.5

    # a finished run resumed with the same limits: one line that says which to raise,
    # and the checkpoint left as it was
    last = load_checkpoint(str(out))
    saved = file_hash(out / "ckpt.pt")
    # where the lr has decayed to min_lr, the end of its decay must move too
    limits = {
        "--max_time=5.5": "raise --max_time to train further, and --lr_decay_time with it",
        f"--max_time=0 --max_iters={last['iter_num']}": "raise --max_iters to train further\n",
        f"--max_time=0 --max_iters={last['iter_num']} --lr_decay_time=0 "
        f"--lr_decay_iters={last['iter_num']}": "raise --max_iters to train further, and "
        "--lr_decay_iters with it: the lr has reached min_lr (0.0001) and stays there",
    }
    for limit, advice in limits.items():
        with pytest.raises(SystemExit) as stop:
            run_in_process([*base, *limit.split(), "--init_from=resume"])
        assert stop.value.code == BAD_INPUT
        assert advice in capsys.readouterr().err
    assert file_hash(out / "ckpt.pt") == saved
