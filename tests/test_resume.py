"""train.py's checkpoints: what one holds, resuming that repeats the uninterrupted
run exactly, a save or a run that fails leaving the last good one, and stopping by a
signal or max_time at any moment, even inside an evaluation or between micro-steps."""

import copy
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import (
    child_env,
    file_hash,
    losses,
    read_log,
    run_in_process,
    signal_when_training,
    start_training,
    tiny_run,
    tiny_settings,
)

import train
from model import GPT
from support.loading import load_checkpoint

REPO = os.path.dirname(os.path.abspath(train.__file__))


# -----------------------------------------------------------------------------
# Exact resume, and what a checkpoint holds


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_resume_repeats_the_uninterrupted_run(data_root, tmp_path, optimizer):
    common = [
        f"--optimizer={optimizer}",
        "--eval_interval=4",
        "--lr_decay_iters=16",
        "--dropout=0.1",
    ]
    a, b = tmp_path / "a", tmp_path / "b"
    run_in_process(tiny_run(data_root, a, *common, "--max_iters=16"))
    run_in_process(tiny_run(data_root, b, *common, "--max_iters=8"))
    assert load_checkpoint(str(b))["iter_num"] == 8
    run_in_process(tiny_run(data_root, b, *common, "--max_iters=16", "--init_from=resume"))

    log_a, log_b = read_log(a), read_log(b)
    assert [r["iter"] for r in log_a] == [0, 4, 8, 12, 16]
    assert losses(log_a) == losses(log_b)  # exact, not approximate
    ca, cb = load_checkpoint(str(a)), load_checkpoint(str(b))
    assert ca["iter_num"] == cb["iter_num"] == 16
    for key in ca["model"]:
        assert torch.equal(ca["model"][key], cb["model"][key]), key
    assert torch.equal(ca["data"]["generator"], cb["data"]["generator"])
    assert torch.equal(ca["rng"]["cpu"], cb["rng"]["cpu"])


def test_resume_with_other_settings_says_which(data_root, tmp_path, capsys):
    """A resume without the run's settings (its config file left out) trained on with the
    defaults and said nothing; the note names each setting of the run that differs."""
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=2", learning_rate=0.01, eval_interval=2))
    capsys.readouterr()
    run_in_process(tiny_run(data_root, out, "--init_from=resume", learning_rate=0.01, max_iters=4))
    assert "note: the run goes on" not in capsys.readouterr().out  # the same settings
    trained = load_checkpoint(str(out))["config"]
    run_in_process(tiny_run(data_root, out, "--init_from=resume", max_iters=6, batch_size=3))
    notes = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("note: the run goes on")
    ]
    assert len(notes) == 1, notes
    settings = tiny_settings()
    changed = [f"learning_rate={settings.learning_rate!r} (was 0.01)", "batch_size=3 (was 8)"]
    for text in changed:
        assert text in notes[0], notes[0]
    assert trained["max_iters"] == 4 and "max_iters" not in notes[0]  # a limit, not the run
    assert notes[0].count(" (was ") == len(changed), notes[0]


def test_a_run_that_cannot_write_its_folder_is_told_to_resume_a_copy(data_root, tmp_path, capsys):
    """Resuming where out_dir takes no file (here its lock cannot be opened: a folder
    stands in its place, as a read-only disk refuses it): the line said to pass another
    --out_dir, where a resume finds no checkpoint; it says to resume a copy, which does."""
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=2", "--eval_interval=2"))
    os.remove(out / ".lock")
    os.mkdir(out / ".lock")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        run_in_process(tiny_run(data_root, out, "--init_from=resume", "--max_iters=4"))
    assert stop.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.endswith("copy the run's folder where files can be written, and resume the copy")
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(".lock"))
    run_in_process(tiny_run(data_root, copy, "--init_from=resume", "--max_iters=4"))
    assert load_checkpoint(str(copy))["iter_num"] == 4


def test_checkpoint_holds_plain_data_only(data_root, tmp_path):
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=2", "--eval_interval=2"))
    # started over, as the refusal below says: a new run starts the log afresh
    os.remove(out / "ckpt.pt")
    run_in_process(tiny_run(data_root, out, "--max_iters=2", "--eval_interval=2"))
    assert [rec["iter"] for rec in read_log(out)] == [0, 2]
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)  # refuses anything but plain data
    assert {
        "model",
        "optimizer",
        "model_args",
        "iter_num",
        "best_val_loss",
        "config",
        "tokenizer",
        "dataset",
        "rng",
        "data",
    } <= set(ckpt)
    assert ckpt["tokenizer"]["kind"] == "char" and ckpt["dataset"] == "shakespeare_char"
    assert ckpt["config"]["n_embd"] == 32 and ckpt["model_args"]["vocab_size"] == 65
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])

    # --eval_only evaluates the checkpoint (here over the whole val split too) and leaves it alone
    before = file_hash(out / "ckpt.pt")
    run_in_process(
        tiny_run(
            data_root,
            out,
            "--max_iters=2",
            "--init_from=resume",
            "--eval_only=True",
            "--eval_full_val=True",
        )
    )
    last = read_log(out)[-1]
    assert last["iter"] == 2 and last["val_loss_full"] > 0
    assert file_hash(out / "ckpt.pt") == before


def test_a_new_run_never_replaces_an_earlier_runs_checkpoint(data_root, tmp_path, capsys):
    """The same command run twice: the second stops before any work, in one line,
    and the first run's checkpoint and log are left byte for byte; it resumes."""
    out = tmp_path / "out"
    common = ["--eval_interval=2", "--lr_decay_iters=4"]
    run_in_process(tiny_run(data_root, out, *common, "--max_iters=2"))
    kept = {name: file_hash(out / name) for name in ("ckpt.pt", "log.jsonl")}
    capsys.readouterr()
    for again in ([], ["--eval_only=True"], ["--max_iters=4", "--seed=8"]):
        with pytest.raises(SystemExit) as exit_info:
            run_in_process(tiny_run(data_root, out, *common, "--max_iters=2", *again))
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in err, err
        assert lines[0].startswith(f"error: {out} holds an earlier run's checkpoint"), err
        assert "--init_from=resume" in lines[0] and "another --out_dir" in lines[0]
        assert {name: file_hash(out / name) for name in kept} == kept
    run_in_process(tiny_run(data_root, out, *common, "--max_iters=4", "--init_from=resume"))
    assert [rec["iter"] for rec in read_log(out)] == [0, 2, 4]


def test_a_resumed_model_keeps_its_shape_and_says_which_settings_it_ignores(
    data_root, tmp_path, capsys
):
    # a model key given on resume was dropped without a word: the checkpoint's won
    out = tmp_path / "out"
    common = ["--eval_interval=2", "--lr_decay_iters=4"]
    run_in_process(tiny_run(data_root, out, *common, "--max_iters=2"))
    capsys.readouterr()
    changed = ["--block_size=64", "--n_layer=3", "--rope=True", "--dropout=0.1"]
    run_in_process(
        tiny_run(data_root, out, *common, *changed, "--max_iters=4", "--init_from=resume")
    )
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    # dropout is a run's choice, and applies (said as another of the run's settings); the
    # shape is the checkpoint's
    kept = "block_size=32 (not 64), n_layer=2 (not 3), rope=False (not True)"
    assert notes[1:] == [f"note: the model keeps the shape it was trained with: {kept}"]
    assert notes[0].startswith("note: the run goes on with settings other than those it was")
    assert "dropout=0.1 (was 0.0)" in notes[0] and notes[0].count(" (was ") == 1, notes[0]
    ckpt = load_checkpoint(str(out))
    assert ckpt["model_args"]["block_size"] == 32 and ckpt["model_args"]["n_layer"] == 2
    assert ckpt["model_args"]["dropout"] == 0.1 and ckpt["iter_num"] == 4
    again = ["--max_iters=6", "--dropout=0.1", "--init_from=resume"]
    run_in_process(tiny_run(data_root, out, *common, *again))
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]


# -----------------------------------------------------------------------------
# A save cut short or failed, and divergence: the last checkpoint is kept


KILLED_CHILD = """
import os, sys, time
import torch
import train

def stuck_save(obj, f, *args, **kwargs):
    f.write(b"PK\\x03\\x04 a checkpoint that never gets finished")
    f.flush()
    open(sys.argv[1], "w").close()  # tell the parent we are inside the write
    time.sleep(120)

torch.save = stuck_save
train.main(sys.argv[2:])
"""


def test_kill_during_save_keeps_previous_checkpoint(data_root, tmp_path):
    out = tmp_path / "out"
    base = tiny_run(data_root, out, "--eval_interval=2", "--always_save_checkpoint=True")
    run_in_process(base + ["--max_iters=4"])
    before = file_hash(out / "ckpt.pt")

    marker = tmp_path / "writing"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            KILLED_CHILD,
            str(marker),
            *base,
            "--max_iters=8",
            "--init_from=resume",
        ],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 90
        while not marker.exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the child never reached the checkpoint write"
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert file_hash(out / "ckpt.pt") == before
    assert load_checkpoint(str(out))["iter_num"] == 4


def diverging_run(data_root, out, capsys, *extra):
    """The one error line of a run whose loss becomes nan; it exits 1."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_in_process(
            tiny_run(
                data_root,
                out,
                "--max_iters=200",
                "--eval_interval=1000",
                "--learning_rate=1e6",
                "--decay_lr=False",
                "--grad_clip=0",
                *extra,
            )
        )
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    line = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(line) == 1 and "diverged" in line[0] and "learning_rate" in line[0], err
    return line[0]


def test_divergence_stops_without_touching_the_checkpoint(data_root, tmp_path, capsys):
    # before its first save, a run has no checkpoint to keep, and says so
    fresh = tmp_path / "fresh"
    assert diverging_run(data_root, fresh, capsys).endswith("(no checkpoint was saved)")
    assert not (fresh / "ckpt.pt").exists()
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=4", "--eval_interval=2"))
    before = file_hash(out / "ckpt.pt")
    line = diverging_run(data_root, out, capsys, "--init_from=resume")
    assert line.endswith("(the last checkpoint is kept)")
    assert file_hash(out / "ckpt.pt") == before


def with_damaged_optimizer_state(ckpt, value):
    """ckpt with the first tensor of its first optimizer's state replaced by value(it)."""
    optimizers = ckpt["optimizer"]
    first = optimizers[0] if isinstance(optimizers, list) else optimizers
    state = first["state"]
    entry = state[next(iter(state))]
    name = next(key for key, tensor in entry.items() if torch.is_tensor(tensor) and tensor.dim())
    entry[name] = value(entry[name])
    return ckpt


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_damaged_resume_state_is_refused_before_any_step(data_root, tmp_path, capsys, optimizer):
    # load_state_dict checks neither shapes nor values: the first step failed with a
    # traceback on a wrong shape, and a NaN read as a diverged run ("try a lower lr")
    out = tmp_path / "out"
    base = tiny_run(
        data_root, out, "--max_iters=2", "--eval_interval=2", f"--optimizer={optimizer}"
    )
    run_in_process(base)
    good = load_checkpoint(str(out))
    damages = {
        "iter_num entry is out of range (-3)": lambda c: dict(c, iter_num=-3),
        "best_val_loss entry is out of range (nan)": lambda c: dict(c, best_val_loss=float("nan")),
        "seconds entry has the wrong type": lambda c: dict(c, seconds="12"),
        "has shape [3]": lambda c: with_damaged_optimizer_state(c, lambda t: torch.zeros(3)),
        "holds NaN or infinity": lambda c: with_damaged_optimizer_state(
            c, lambda t: torch.full_like(t, float("inf"))
        ),
    }
    for said, damage in damages.items():
        torch.save(damage(copy.deepcopy(good)), out / "damaged.pt")
        os.replace(out / "damaged.pt", out / "ckpt.pt")
        before = file_hash(out / "ckpt.pt")
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            run_in_process([*base, "--max_iters=4", "--init_from=resume"])
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and "\n" not in err, err
        assert err.startswith(f"error: cannot resume from {out / 'ckpt.pt'}") and said in err, err
        assert file_hash(out / "ckpt.pt") == before


def test_a_second_run_into_an_out_dir_being_trained_is_refused(data_root, tmp_path, capsys):
    # before the lock, both trained: their lines interleaved in one log.jsonl, and the
    # one to save last replaced the other's checkpoint
    out = tmp_path / "out"
    # saved at every evaluation: a kill leaves at most one logged past the checkpoint
    base = tiny_run(
        data_root,
        out,
        "--eval_interval=2",
        "--lr_decay_iters=1000",
        "--always_save_checkpoint=True",
    )
    for ending in (signal.SIGTERM, signal.SIGKILL):
        resume = [] if ending == signal.SIGTERM else ["--init_from=resume"]
        log = out / "log.jsonl"
        logged = log.stat().st_size if log.exists() else 0
        child = start_training([*base, "--max_iters=100000", *resume])
        try:
            # training: a checkpoint to resume, and the child's own lines in the log
            deadline = time.time() + 90
            while time.time() < deadline and not (
                (out / "ckpt.pt").exists() and log.exists() and log.stat().st_size > logged
            ):
                time.sleep(0.05)
            capsys.readouterr()
            with pytest.raises(SystemExit) as exit_info:
                # were it not refused, it would stop after 3 s of training
                run_in_process([*base, "--max_iters=100000", "--max_time=3", "--init_from=resume"])
            err = capsys.readouterr().err.strip()
            assert exit_info.value.code == 2 and "\n" not in err, err
            assert err == (
                f"error: another run is training into {out} now; wait for it to end, "
                "or give this one another --out_dir"
            )
            assert child.poll() is None  # the first goes on
            child.send_signal(ending)
            child.communicate(timeout=60)
        finally:
            child.kill()
    # the kernel let go of the lock when the process was killed: the run resumes, and
    # its log goes in order (an evaluation logged just before the kill, past the
    # checkpoint, is logged again by the resumed run: the same figures, as in
    # test_reliability.py's kills)
    stopped = load_checkpoint(str(out))["iter_num"]
    run_in_process([*base, f"--max_iters={stopped + 2}", "--init_from=resume"])
    iters = [record["iter"] for record in read_log(out)]
    assert iters == sorted(iters) and iters[-1] == stopped + 2, iters


# -----------------------------------------------------------------------------
# Stopping: signals and max_time, at any moment, and resuming exactly after


def test_sigterm_saves_and_resume_continues_exactly(data_root, tmp_path):
    out = tmp_path / "out"
    base = tiny_run(data_root, out, "--eval_interval=1000", "--lr_decay_iters=1000")
    child = start_training([*base, "--max_iters=100000"])
    stdout, stderr = signal_when_training(child, out, signal.SIGTERM)
    assert child.returncode == 0, stderr
    stopped = load_checkpoint(str(out))["iter_num"]
    assert stopped >= 1 and f"stopped by SIGTERM at iter {stopped}" in stdout

    run_in_process(base + [f"--max_iters={stopped + 3}", "--init_from=resume"])
    straight = tmp_path / "straight"
    run_in_process(
        tiny_run(
            data_root,
            straight,
            "--eval_interval=1000",
            "--lr_decay_iters=1000",
            f"--max_iters={stopped + 3}",
        )
    )
    resumed, reference = load_checkpoint(str(out)), load_checkpoint(str(straight))
    assert resumed["iter_num"] == reference["iter_num"] == stopped + 3
    for key in reference["model"]:
        assert torch.equal(resumed["model"][key], reference["model"][key]), key


def test_max_time_stops_evaluates_and_saves(data_root, tmp_path, capsys):
    out = tmp_path / "out"
    run_in_process(
        tiny_run(data_root, out, "--max_iters=1000000", "--eval_interval=1000000", "--max_time=1.0")
    )
    last = read_log(out)[-1]
    ckpt = load_checkpoint(str(out))
    assert 0 < ckpt["iter_num"] == last["iter"] < 1000000
    assert last["elapsed_s"] >= 1.0
    assert "max_time" in capsys.readouterr().out


def test_stop_during_a_later_evaluation_saves_and_resumes_exactly(
    data_root, tmp_path, monkeypatch, capsys
):
    base = ["--eval_interval=5", "--lr_decay_iters=20", "--dropout=0.1"]
    straight = tmp_path / "straight"
    run_in_process(tiny_run(data_root, straight, *base, "--max_iters=15"))
    evaluate = train.estimate_loss

    def signal_in_the_evaluation_at_iter_10(r, seed):
        if seed == r.cfg.seed + 10:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this main thread
        return evaluate(r, seed)

    monkeypatch.setattr(train, "estimate_loss", signal_in_the_evaluation_at_iter_10)
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, *base, "--max_iters=15"))
    assert "stopped by SIGTERM at iter 10; saved" in capsys.readouterr().out
    assert load_checkpoint(str(out))["iter_num"] == 10 and [r["iter"] for r in read_log(out)] == [
        0,
        5,
    ]
    monkeypatch.setattr(train, "estimate_loss", evaluate)
    run_in_process(tiny_run(data_root, out, *base, "--max_iters=15", "--init_from=resume"))
    assert losses(read_log(out)) == losses(read_log(straight))  # the iter-10 evaluation was redone
    a, b = load_checkpoint(str(out)), load_checkpoint(str(straight))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_stop_during_eval_only_leaves_everything_as_it_was(
    data_root, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, "--max_iters=4", "--eval_interval=2"))
    before = file_hash(out / "ckpt.pt"), (out / "log.jsonl").read_text()
    evaluate = train.estimate_loss

    def signal_in_the_evaluation(r, seed):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this main thread
        return evaluate(r, seed)

    monkeypatch.setattr(train, "estimate_loss", signal_in_the_evaluation)
    run_in_process(tiny_run(data_root, out, "--init_from=resume", "--eval_only=True"))
    assert "stopped by SIGTERM during the evaluation; nothing was saved" in capsys.readouterr().out
    assert (file_hash(out / "ckpt.pt"), (out / "log.jsonl").read_text()) == before


def test_stop_between_micro_steps_undoes_the_step(data_root, tmp_path, monkeypatch, capsys):
    base = [
        "--gradient_accumulation_steps=4",
        "--eval_interval=100",
        "--lr_decay_iters=20",
        "--dropout=0.1",
    ]
    straight = tmp_path / "straight"
    run_in_process(tiny_run(data_root, straight, *base, "--max_iters=6"))
    forward, calls = GPT.forward, []

    def signal_in_the_second_micro_step_of_iter_3(model, *a, **kw):
        if model.training:
            calls.append(1)
            if len(calls) == 3 * 4 + 2:
                os.kill(os.getpid(), signal.SIGTERM)
        return forward(model, *a, **kw)

    monkeypatch.setattr(GPT, "forward", signal_in_the_second_micro_step_of_iter_3)
    out = tmp_path / "out"
    run_in_process(tiny_run(data_root, out, *base, "--max_iters=6"))
    assert "stopped by SIGTERM at iter 3; saved" in capsys.readouterr().out
    monkeypatch.setattr(GPT, "forward", forward)
    assert load_checkpoint(str(out))["iter_num"] == 3
    run_in_process(tiny_run(data_root, out, *base, "--max_iters=6", "--init_from=resume"))
    a, b = load_checkpoint(str(out)), load_checkpoint(str(straight))
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["data"]["generator"], b["data"]["generator"])
