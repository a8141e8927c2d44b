"""
Checkpoints, as a run writes them: atomically, so that a crash or a full disk
leaves the previous one whole. Reading one without running any code (and GPT-2's
files): support/loading.py; resuming from one: support/resume.py.

A checkpoint is a dict of tensors and plain Python values:
  model, optimizer, model_args, iter_num, best_val_loss, config   (nanoGPT's keys)
  tokenizer   the tokenizer's description, so sampling needs only the folder
  rng, data   RNG and data-sampling state, so a resumed run repeats exactly

Resuming exactly needs the RNG state saved beside the weights (rng_state, and
set_rng_state to put it back).
"""

import os

import torch

SNAPSHOT_DIR = "snapshots"  # out_dir/snapshots/iter_NNNNNN.pt: --snapshots (support/timeline.py)


class CheckpointError(Exception):
    """A checkpoint that cannot be written or read; the message is for the user."""


def checkpoint_path(out_dir):
    return os.path.join(out_dir, "ckpt.pt")


def what_is_kept(out_dir):
    """The end of a failed run's last line: a run fails before its first save too."""
    if os.path.exists(checkpoint_path(out_dir)):
        return "the last checkpoint is kept"
    return "no checkpoint was saved"


def save_checkpoint(obj, path, kept=None):
    """Write to a temporary file beside path, then rename it over path.

    os.replace is atomic on POSIX and Windows, so a crash, kill or full disk
    during the write leaves the previous checkpoint untouched. kept ends the
    message of a failed write: what is left (by default, path's previous version).
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # a process killed mid-write leaves its temporary file behind; sweep those
    for name in os.listdir(folder):
        if name.startswith(os.path.basename(path) + ".tmp."):
            os.remove(os.path.join(folder, name))
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if kept is None:
            kept = (
                "the previous checkpoint is kept"
                if os.path.exists(path)
                else "no checkpoint was written"
            )
        # torch.save reports a write the disk refused (full, or over a size limit) as
        # a RuntimeError about zip positions; the OSError that caused it is its context
        reason = e.__context__ if isinstance(e.__context__, OSError) else e
        raise CheckpointError(f"could not write checkpoint {path}: {reason}; {kept}") from None


def first_line(e):
    """The gist of an exception in one line, for messages about files that fail
    to load: its first line, or the first detail under a heading like
    "Error(s) in loading state_dict for GPT:"."""
    if isinstance(e, KeyError):
        return f"no entry {e}"
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [type(e).__name__]
    line = lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]
    return line if len(line) <= 200 else line[:200] + "..."


def out_of_memory(e):
    """Whether e is running out of memory, which no damaged file explains."""
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(e)


# -----------------------------------------------------------------------------
# The random state, saved so that a resumed run repeats exactly (support/resume.py)


def rng_state(device):
    rng = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def set_rng_state(rng, device):
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)
