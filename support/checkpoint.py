"""
Checkpoints: written atomically and read without running any code; the same
reading for GPT-2's files in Hugging Face format (read_gpt2_files, for
model.from_pretrained). Resuming from one: support/resume.py.

A checkpoint is a dict of tensors and plain Python values:
  model, optimizer, model_args, iter_num, best_val_loss, config   (nanoGPT's keys)
  tokenizer   the tokenizer's description, so sampling needs only the folder
  rng, data   RNG and data-sampling state, so a resumed run repeats exactly

Resuming exactly needs the RNG state saved beside the weights (rng_state, and
set_rng_state to put it back).
"""

import json
import os
import pickle
import re
import zipfile
import zlib

import torch

CKPT_NAME = "ckpt.pt"
# What loading a damaged (but unpicklable) checkpoint or weights file raises.
LOAD_ERRORS = (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError, EOFError)


class CheckpointError(Exception):
    """A checkpoint that cannot be written or read; the message is for the user."""


def checkpoint_path(out_dir):
    return os.path.join(out_dir, CKPT_NAME)


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


def not_loadable(path, problem):
    """CheckpointError for a file that does not load. A .pt file (ckpt.pt, a snapshot)
    is a damaged checkpoint, to delete; any other file was given in a checkpoint's
    place (a README, model.safetensors, an exported .gguf), and is the user's to keep."""
    if path.endswith(".pt"):
        return CheckpointError(
            f"{path} is {problem}; delete it and train again or resume from another copy"
        )
    folder = os.path.dirname(path) or "."
    what = (
        "a checkpoint (ckpt.pt, a snapshot's .pt) or its folder, "
        "or a Hugging Face GPT-2 folder (with config.json)"
    )
    if os.path.isfile(os.path.join(folder, "config.json")):
        what = f"its folder, {folder}, which holds a Hugging Face config.json"
    return CheckpointError(f"{path} is not a checkpoint; pass {what}")


def load_checkpoint(path, map_location="cpu"):
    """Load a checkpoint with weights_only=True: tensors and plain data only, so a
    file holding a pickled object that would run code is refused, not executed."""
    if os.path.isdir(path):
        path = checkpoint_path(path)
    if not os.path.exists(path):
        import glob  # here only: a missing checkpoint

        # the folders beside it that hold one (another recipe's out_dir, say), as given
        folder = os.path.dirname(path) if path.endswith(".pt") else path
        beside = os.path.join(glob.escape(os.path.dirname(os.path.normpath(folder))), "*")
        found = sorted(os.path.dirname(f) for f in glob.glob(checkpoint_path(beside)))[:3]
        hint = "point --out_dir at one"
        if len(found) == 1:
            hint = f"{found[0]} holds one: --out_dir={found[0]}"
        elif found:
            hint = f"{', '.join(found)} hold one: --out_dir={found[0]}"
        raise CheckpointError(
            f"no checkpoint at {path}; {hint}, or train one with "
            "`python train.py config/shakespeare.py`"
        )
    # torch.save writes a zip archive; anything else (random bytes, a cut-off
    # file whose central directory is gone) is not worth unpickling at all
    if not zipfile.is_zipfile(path):
        raise not_loadable(path, "truncated or not a checkpoint (not a PyTorch zip archive)")
    # torch.load does not check the CRC-32 each member carries, so flipped
    # bytes in the weights would load silently: check them first (one more read)
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        problem = None if bad is None else f"{bad} fails its CRC check"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error) as e:
        problem = type(e).__name__
    if problem:
        raise not_loadable(path, f"truncated or corrupt ({problem})")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"(?:unsupported|Unsupported global:) (?:GLOBAL )?([\w.]+)", str(e))
        what = found.group(1) if found else "a non-data object"
        raise CheckpointError(
            f"refused to load {path}: it holds {what}, which could run code when "
            "unpickled; only load checkpoints you trust, made by this project"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, KeyError) as e:
        raise not_loadable(path, f"truncated or not a checkpoint ({type(e).__name__})") from None
    if not isinstance(ckpt, dict) or not {"model", "model_args"} <= set(ckpt):
        raise CheckpointError(
            f"{path} is not a checkpoint of this project (missing 'model' or 'model_args')"
        )
    return ckpt


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


# -----------------------------------------------------------------------------
# GPT-2's files


def read_gpt2_files(path_or_name):
    """(config.json's sizes, state dict) of a Hugging Face GPT-2: a local folder
    (config.json plus model.safetensors, else pytorch_model.bin, read with
    weights_only so it runs no code), or a hub name ('gpt2', 'gpt2-medium', ...)
    fetched with huggingface_hub. Any failure is one ValueError naming the file."""
    folder = path_or_name
    if not os.path.isdir(folder):
        try:
            from huggingface_hub import snapshot_download

            folder = snapshot_download(
                path_or_name, allow_patterns=["config.json", "*.safetensors"]
            )
        except Exception as e:  # ImportError, or any failure to download
            raise ValueError(
                f"{path_or_name!r} is not a folder and could not be downloaded "
                f"({type(e).__name__}); "
                "pass a local folder with config.json and model.safetensors"
            ) from None
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            hf = json.load(f)
        hf = {
            key: int(hf[key])
            for key in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd")
        } | {"activation_function": hf.get("activation_function", "gelu_new")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path} is missing or not a GPT-2 config ({type(e).__name__}: {e})"
        ) from None
    path = os.path.join(folder, "model.safetensors")
    if os.path.exists(path):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return hf, load_file(path)
        except (SafetensorError, OSError) as e:
            raise ValueError(
                f"{path} is truncated or not a safetensors file ({type(e).__name__})"
            ) from None
    path = os.path.join(folder, "pytorch_model.bin")
    if not os.path.exists(path):
        raise ValueError(f"{folder} has neither model.safetensors nor pytorch_model.bin")
    try:
        return hf, torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ValueError(
            f"refused to load {path}: it holds objects that could run code when "
            "unpickled; use model.safetensors or a file you trust"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(
            f"{path} is truncated or not a PyTorch file ({type(e).__name__})"
        ) from None
