"""The 15-minute recipe and its benchmark at a tiny size: the config trains through
train.py, and `python -m bench.recipes --minutes` gives each recipe the same training
time, reads its curve and draws it."""

import os
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest
import torch

from bench import recipes
from data.dataset import load_meta
from support.configurator import parse_settings
from support.loading import load_checkpoint
from support.run_log import read_evaluations
from support.settings import Settings

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=32", "--batch_size=64"]


def test_the_recipe_trains_at_a_tiny_size(repo_root, data_root, tmp_path):
    """Every key of the config is one train.py knows; scaled down, it trains and logs
    the whole-split val loss its benchmark reads."""
    config = os.path.join(repo_root, "config", "shakespeare_cpu_15min.py")
    cfg = parse_settings(Settings, [config], allow_files=True)
    assert cfg.block_size == 256 and cfg.dtype == "auto" and cfg.eval_full_val
    # trained by the clock: the lr reaches its floor when the 15 minutes end
    assert cfg.max_time == cfg.lr_decay_time == 900
    assert recipes.schedule_args(config, 10) == ["--lr_decay_time=600"]
    assert recipes.schedule_args("config/shakespeare_classic.py", 10) == []
    out = tmp_path / "run"
    args = ["--max_iters=4", "--lr_decay_iters=4", "--eval_interval=4", "--eval_iters=1"]
    # not compiled: some 20 s of inductor that tests nothing of the recipe here (a compiled
    # run's training is test_gpu_path.py's, one process and two)
    args += ["--compile=False"]
    proc = subprocess.run(
        [sys.executable, "train.py", "config/shakespeare_cpu_15min.py", *TINY, *args]
        + [f"--out_dir={out}", f"--data_root={data_root}", "--dtype=float32"],
        cwd=repo_root,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = recipes.read_evaluations(str(out))[-1]
    assert last["iter"] == 4 and 0 < last["val_loss_full"] < 5
    # QK-norm's gains: the recipe's, saved, and trained (AdamW steps them, not Muon)
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["model_args"]["qk_gain"] is True
    gain = ckpt["model"]["transformer.h.0.attn.q_norm.weight"]
    assert gain.shape == (8,) and not torch.equal(gain, torch.ones(8))
    # token shift's gain, saved and moved off its 0
    assert ckpt["model_args"]["token_shift"] is True
    assert ckpt["model"]["shift_gain"].abs().max() > 0


def test_the_10_minute_recipe_is_the_15_minute_one_cut_to_its_time(repo_root):
    """config/shakespeare_cpu_10min.py, which the main command trains without a GPU: the
    15-minute recipe read whole, its clock and lr schedule at 600 s, late dropout halved,
    its own out_dir; nothing else differs."""
    ten = parse_settings(
        Settings, [os.path.join(repo_root, "config", "shakespeare_cpu_10min.py")], allow_files=True
    )
    fifteen = parse_settings(
        Settings, [os.path.join(repo_root, "config", "shakespeare_cpu_15min.py")], allow_files=True
    )
    differ = {key for key in vars(ten) if getattr(ten, key) != getattr(fifteen, key)}
    assert differ == {"out_dir", "max_time", "lr_decay_time", "dropout"}
    assert ten.max_time == ten.lr_decay_time == 600 and fifteen.max_time == 900
    assert (ten.dropout, fifteen.dropout) == (0.05, 0.1)
    assert ten.out_dir == "out-shakespeare-char-10min" and ten.late_dropout == 0.5
    assert recipes.schedule_args(
        os.path.join(repo_root, "config", "shakespeare_cpu_10min.py"), 5
    ) == ["--lr_decay_time=300"]


def test_loss_at_reads_the_last_evaluation_by_then():
    curve = [[0.0, 4.2], [60.0, 2.5], [125.5, 2.0]]
    assert recipes.loss_at(curve, 59.9) == 4.2
    assert recipes.loss_at(curve, 60.0) == 2.5
    assert recipes.loss_at(curve, 900) == 2.0
    assert recipes.loss_at(curve[1:], 30) is None


def test_same_minutes_of_training_each(tmp_path, data_root, monkeypatch):
    """Two tiny recipes stopped by max_time alone (their max_iters out of reach): each
    trains at least the minutes given, and its curve, table row and figure follow. Run
    from another folder than the repository's, with --keep a path from there."""
    monkeypatch.chdir(tmp_path)
    tiny = "".join(f"{a[2:].replace('=', ' = ')}\n" for a in TINY)
    configs = []
    for name, schedule in (("slow", ""), ("fast", "lr_decay_time = 60\nwarmup_iters = 0\n")):
        path = tmp_path / f"{name}.py"
        path.write_text(
            tiny
            + schedule
            + "max_iters = 1000000\neval_interval = 20\ngradient_accumulation_steps = 1\n"
        )
        configs.append((name, str(path), []))
    minutes = 0.03  # 1.8 s
    keep = "runs"
    rows = recipes.bench_budget(lambda msg: None, minutes, configs, data_root, keep)
    assert [r["recipe"] for r in rows] == ["slow", "fast"]
    for r in rows:
        assert 0 < r["iters"] < 1000000
        assert r["training_s"] >= 60 * minutes
        times = [t for t, _ in r["curve"]]
        assert times == sorted(times) and len(times) >= 2
        assert r["device"].startswith("cpu, float32")
        assert os.path.isfile(os.path.join(keep, r["recipe"], "ckpt.pt"))  # kept, to sample from
        assert recipes.loss_at(r["curve"], r["training_s"]) == r["curve"][-1][1]
    # "fast" decays its lr by seconds: over the 1.8 s given, not the 60 s it names
    final = read_evaluations(os.path.join(keep, "fast"))[-1]
    assert final["lr"] == pytest.approx(Settings.min_lr)
    table = recipes.budget_table(rows, minutes)
    assert "val at 0.03 min" in table and f"**{rows[1]['val_loss_full']:.4f}**" in table
    assert "val at 5 min | val at 10 min | val at 15 min" in recipes.budget_table(rows, 15)
    png = tmp_path / "curves.png"
    recipes.plot_budget(rows, str(png))
    assert matplotlib.image.imread(png).shape[:2] == (462, 770)  # 7 x 4.2 in at 110 dpi


@pytest.mark.parametrize(
    "args, message",
    [
        (["--minutes=-1"], "--minutes must be 0 or more, got -1"),
        (["--minutes=1", "--png=/nonexistent/c.png"], "cannot write --png=/nonexistent/c.png"),
        (["--minutes=1", "--keep=/proc/runs"], "cannot make --keep=/proc/runs"),
    ],
)
def test_bad_minutes_are_one_line(repo_root, args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "bench.recipes", *args],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2  # bad input, as in every command
    assert len(lines) == 1 and lines[0].startswith(f"bench.recipes: {message}")


def test_the_holdout_split_is_cut_from_train_and_trains(repo_root, data_root, tmp_path):
    """bench.holdout: the recipe's settings are chosen on the end of the train split;
    its two files are exactly the train split cut in two, and train.py reads them."""
    from bench import holdout

    source = os.path.join(data_root, "shakespeare_char")
    rc = holdout.main(["--out_root", str(tmp_path / "held"), "--dataset", "nope"])
    assert rc == 1
    out_dir = holdout.write_holdout(source, str(tmp_path / "held"))
    assert os.path.basename(out_dir) == "shakespeare_char_holdout"
    train = np.fromfile(os.path.join(source, "train.bin"), dtype=np.uint16)
    held_train = np.fromfile(os.path.join(out_dir, "train.bin"), dtype=np.uint16)
    held_val = np.fromfile(os.path.join(out_dir, "val.bin"), dtype=np.uint16)
    assert np.array_equal(np.concatenate([held_train, held_val]), train)
    assert len(held_val) == len(train) - int(len(train) * 0.9)
    meta = load_meta(out_dir)
    assert (meta["train_tokens"], meta["val_tokens"]) == (len(held_train), len(held_val))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", "config/shakespeare_cpu_15min.py", *TINY]
        + ["--max_iters=2", "--eval_interval=2", "--eval_iters=1", "--dtype=float32"]
        + ["--compile=False"]
        + [f"--out_dir={out}", f"--data_root={tmp_path / 'held'}"]
        + ["--dataset=shakespeare_char_holdout"],
        cwd=repo_root,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "shakespeare_char_holdout" in proc.stdout
