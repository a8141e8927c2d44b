"""
Loading a model to use it: the device, the precision, the checkpoint or GPT-2 folder.

What sample.py, heads.py and the explorer share. Every failure is a LoadError
whose message is one line saying what to do.
"""

import os

import torch

from data.tokenizer import TokenizerError, get_tokenizer
from model import GPT, GPTConfig
from support.checkpoint import (
    CheckpointError,
    checkpoint_path,
    clean_state_dict,
    first_line,
    load_checkpoint,
)
from support.hardware import bf16_error, native_bf16


class LoadError(Exception):
    """A device, precision or model folder that cannot be used; one line saying what to do."""


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def mps_available():
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def auto_device():
    """The first this machine has: a CUDA GPU, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return "cuda"
    if mps_available():
        return "mps"
    return "cpu"


def pick_device(name):
    mps = mps_available()
    if name == "auto":
        return auto_device()
    try:
        device = torch.device(name)
    except RuntimeError:
        raise LoadError(f"unknown --device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LoadError(f"--device={name} but no CUDA GPU is available; use --device=cpu (or auto)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise LoadError(
            f"--device={name} but there are {torch.cuda.device_count()} GPUs; "
            "use cuda:0 .. cuda:N-1"
        )
    if device.type == "mps" and not mps:
        raise LoadError(f"--device={name} but MPS is not available; use --device=cpu (or auto)")
    if device.type not in ("cpu", "cuda", "mps"):
        raise LoadError(f"unsupported --device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    return name


def pick_dtype(name, device):
    if name == "auto":
        # native bf16 only: V100 and T4 have no bf16 tensor cores and would emulate it
        return (
            torch.bfloat16
            if device.startswith("cuda") and native_bf16("cuda")[0]
            else torch.float32
        )
    if name not in DTYPES:
        raise LoadError(f"unknown --dtype {name!r}; use auto, float32, bfloat16 or float16")
    if DTYPES[name] == torch.bfloat16 and (error := bf16_error(device.split(":")[0])):
        raise LoadError(error)  # where bfloat16 would die with SIGILL
    return DTYPES[name]


def load_model(cfg):
    """Return (model, tokenizer, folder): folder is where the model came from,
    the default home of its attention maps."""
    source = cfg["init_from"] or cfg["out_dir"]
    has_ckpt = os.path.exists(checkpoint_path(source))
    is_hf = os.path.isfile(os.path.join(source, "config.json")) and not has_ckpt
    if cfg["init_from"] and (
        is_hf or (cfg["init_from"].startswith("gpt2") and not os.path.exists(source))
    ):
        try:
            model = GPT.from_pretrained(source)
        except (ValueError, OSError, KeyError, TypeError, RuntimeError, IndexError, EOFError) as e:
            raise LoadError(
                f"could not load GPT-2 weights from {source}: {first_line(e)}"
            ) from None
        return model, get_tokenizer({"kind": "gpt2"}), cfg["out_dir"]
    if cfg["init_from"] and not os.path.exists(source):
        raise LoadError(
            f"--init_from={source}: no such file or folder; pass a checkpoint folder "
            "(with ckpt.pt) or a Hugging Face GPT-2 folder (with config.json)"
        )

    ckpt = load_checkpoint(source)
    path = checkpoint_path(source) if os.path.isdir(source) else source
    if "tokenizer" not in ckpt:
        raise CheckpointError(
            f"{path} does not say which tokenizer it was trained with "
            "(no 'tokenizer' entry); train it again with this version of train.py"
        )
    try:
        model = GPT(GPTConfig(**ckpt["model_args"]))
        model.load_state_dict(clean_state_dict(ckpt["model"]))
    except (TypeError, ValueError, RuntimeError, KeyError, AttributeError, IndexError) as e:
        raise CheckpointError(
            f"{path} does not match this model.py ({first_line(e)}); "
            "train it again with this version"
        ) from None
    try:
        tok = get_tokenizer(ckpt["tokenizer"])
    except TokenizerError as e:
        raise CheckpointError(f"{path} has a damaged tokenizer description ({e})") from None
    folder = source if os.path.isdir(source) else os.path.dirname(source)
    return model, tok, folder
