"""
Where a training run records its evaluations and its steps' measurements: one
JSON line each in out_dir/log.jsonl, and in wandb when wandb_log is on. An
evaluation's line has a val_loss; a step's (every log_interval) has none. And the
progress bar on the terminal, which shows the same measurements.
"""

import dataclasses
import json
import os
import shutil

from tqdm import tqdm

try:
    import fcntl
except ImportError:  # not a Unix: out_dir goes unlocked
    fcntl = None

from support.checkpoint import SNAPSHOT_DIR, first_line, what_is_kept


class LogError(Exception):
    """The log cannot be written; the message is for the user."""


def start_wandb(cfg):
    """The wandb module, its run started; a ValueError before any work if it cannot start."""
    try:
        import wandb  # here only: a slow import that most runs do not need
    except ImportError:
        raise ValueError("wandb_log=True needs wandb: pip install wandb") from None
    try:
        wandb.init(
            project=cfg.wandb_project, name=cfg.wandb_run_name, config=dataclasses.asdict(cfg)
        )
    except wandb.errors.UsageError as e:
        # no API key, and no terminal to ask for one: say so before any work starts
        raise ValueError(
            f"wandb_log=True, but wandb cannot start ({first_line(e)}): run `wandb login` "
            "once, or set WANDB_MODE=offline to log locally and `wandb sync` later"
        ) from None
    except wandb.errors.Error as e:
        # a key, but no answer from its server (no network, a server down, a bad key)
        raise ValueError(
            f"wandb_log=True, but wandb cannot start ({first_line(e)}); set "
            "WANDB_MODE=offline to log locally and `wandb sync` later"
        ) from None
    return wandb


def start_log(out_dir, resumed):
    """Create out_dir and lock it; a new run starts a new log, without the snapshots of
    the run before it, a resumed run goes on with its own. Returns the lock: out_dir's
    .lock file, open, which the run keeps until it ends. A second run into the same
    out_dir would write its log between this one's lines and its checkpoint over this
    one's: it is refused here."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = open(os.path.join(out_dir, ".lock"), "a")
        # flock: the kernel lets go when the process ends, however it ends
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not resumed:
            open(os.path.join(out_dir, "log.jsonl"), "w").close()
            # an earlier run's snapshots go with its log: the explorer would show them as
            # this run's steps, beside this run's checkpoint
            shutil.rmtree(os.path.join(out_dir, SNAPSHOT_DIR), ignore_errors=True)
    except BlockingIOError:
        raise ValueError(
            f"another run is training into {out_dir} now; wait for it to end, "
            "or give this one another --out_dir"
        ) from None
    except OSError as e:
        # a resumed run trains on in its own folder: a copy of it is where it can go on
        advice = "pass an --out_dir that can be created and written"
        if resumed:
            advice = "copy the run's folder where files can be written, and resume the copy"
        raise ValueError(
            f"cannot write into out_dir {out_dir!r} ({e.strerror or e}); {advice}"
        ) from None
    return lock


def log_evaluation(rec, out_dir, wandb):
    """Print the evaluation rec, and log it as log_record does."""
    line = f"iter {rec['iter']}: train loss {rec['train_loss']:.4f}, val loss {rec['val_loss']:.4f}"
    if "val_loss_full" in rec:
        line += f", whole val split {rec['val_loss_full']:.4f}"
    tqdm.write(line)
    log_record(rec, out_dir, wandb)


def log_record(rec, out_dir, wandb):
    """One JSON line more in out_dir/log.jsonl (a step's measurements, or an
    evaluation), and the same to wandb if it is not None."""
    path = os.path.join(out_dir, "log.jsonl")
    try:
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    except OSError as e:
        raise LogError(
            f"cannot write {path} ({e.strerror or e}); {what_is_kept(out_dir)}"
        ) from None
    if wandb is not None:
        wandb.log(rec, step=rec["iter"])


def read_log(out_dir):
    """(records, skipped): the complete lines of out_dir/log.jsonl as dicts, and how
    many lines were left out: a last line without its newline yet (train.py may be
    writing it), or one that is not a record. OSError if there is no log."""
    with open(os.path.join(out_dir, "log.jsonl"), "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    partial = lines.pop()  # b"" when the file ends in a newline
    skipped = 0
    if partial.strip():
        skipped = 1
    records = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("iter"), int):
            records.append(record)
        else:
            skipped += 1
    return records, skipped


def is_evaluation(record):
    """An evaluation's line has a val_loss; a training step's has none."""
    return "val_loss" in record


def read_evaluations(out_dir):
    """The evaluations in out_dir/log.jsonl, first to last. OSError if there is no log."""
    records, _ = read_log(out_dir)
    return [record for record in records if is_evaluation(record)]


def read_evaluations_or_fail(out_dir, error, advice):
    """read_evaluations for a command that reads another run's log: a log that is
    missing or cannot be read raises error, one line that names it, then advice."""
    try:
        return read_evaluations(out_dir)
    except (OSError, ValueError) as e:
        path = os.path.join(out_dir, "log.jsonl")
        raise error(f"cannot read {path} ({type(e).__name__}); {advice}") from None


# -----------------------------------------------------------------------------
# The progress bar: what a step's measurements look like on the terminal


def progress_bar(cfg, iter_num, seconds, master):
    """The bar to what ends the run: max_iters, or the seconds of max_time where it is
    set, since a timed run's max_iters is only a bound and an ETA for it would be
    wrong. Either starts where a resumed run stood. The timed bar's ETA is in wall
    time, evaluations included."""
    if cfg.max_time > 0:
        # it counts the seconds of training (evaluations are off the clock)
        timed_bar = "{l_bar}{bar}| {n:.0f}/{total:g}s of training [{elapsed}<{remaining}{postfix}]"
        return tqdm(
            total=cfg.max_time,
            initial=min(seconds, cfg.max_time),
            bar_format=timed_bar,
            dynamic_ncols=True,
            disable=not master,
        )
    return tqdm(total=cfg.max_iters, initial=iter_num, dynamic_ncols=True, disable=not master)


def advance(bar, cfg, seconds):
    """The bar after one more iter: one iter, or up to the seconds of training."""
    if cfg.max_time > 0:
        bar.update(min(seconds, cfg.max_time) - bar.n)
    else:
        bar.update()


# how the progress bar writes a measurement; any other shows 4 significant digits
FORMATS = dict(iter="d", loss=".4f", lr=".2e", grad_norm=".2f", tok_per_s=",.0f", mfu=".1%")


def progress(step, timed=False):
    """The progress bar's text: every measurement of the step but its iter, which the
    bar counts; a timed bar counts seconds, so its text begins with the iter (the
    step's first key)."""
    shown = {key: value for key, value in step.items() if timed or key != "iter"}
    return ", ".join(f"{key} {value:{FORMATS.get(key, '.4g')}}" for key, value in shown.items())
