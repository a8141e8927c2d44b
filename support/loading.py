"""
Every way a command gets a model from files: a checkpoint (a run's ckpt.pt or one
of its snapshots), or GPT-2's weights (a Hugging Face folder or a 'gpt2*' name).
train.py starts from either (training_model; a new model it makes itself, and then
imports none of this); sample.py, heads.py, explore.py and HellaSwag load one to use
it (load_model). Every failure the user can fix is one line. A checkpoint is read
with weights_only=True (tensors and plain data: a pickled object that would run
code is refused), and only after its zip members pass their CRC checks; GPT-2's
Hugging Face files the same way (read_gpt2_files, for model.from_pretrained).
"""

import json
import os
import pickle
import re
import shlex
import zipfile
import zlib

import torch

from data import typed_path
from model import GPT, GPTConfig
from support.checkpoint import CheckpointError, checkpoint_path, first_line, out_of_memory
from support.settings import MODEL_KEYS

# What loading a damaged (but unpicklable) checkpoint or weights file raises.
LOAD_ERRORS = (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError, EOFError)


class LoadError(Exception):
    """A model folder or name that cannot be used; one line saying what to do."""


# -----------------------------------------------------------------------------
# Reading a checkpoint, and GPT-2's files


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


def load_checkpoint(path, map_location="cpu", option="--out_dir"):
    """Load a checkpoint with weights_only=True: tensors and plain data only, so a
    file holding a pickled object that would run code is refused, not executed.
    option: the command's option that gave path, named where none is there."""
    if os.path.isdir(path):
        path = checkpoint_path(path)
    if not os.path.exists(path):
        import glob  # here only: a missing checkpoint

        # the folders beside it that hold one (another recipe's out_dir, say), as given
        folder = os.path.dirname(path) if path.endswith(".pt") else path
        beside = os.path.join(glob.escape(os.path.dirname(os.path.normpath(folder))), "*")
        found = sorted(os.path.dirname(f) for f in glob.glob(checkpoint_path(beside)))
        hint = f"point {option} at one"
        if len(found) == 1:
            hint = f"{found[0]} holds one: {option}={shlex.quote(found[0])}"
        elif found:
            # three named, and how many more
            more = f" and {len(found) - 3} more" if len(found) > 3 else ""
            named = f"{', '.join(found[:3])}{more}"
            hint = f"{named} hold one: {option}={shlex.quote(found[0])}"
        train = f"python {typed_path('train.py')} {typed_path('config/shakespeare.py')}"
        raise CheckpointError(f"no checkpoint at {path}; {hint}, or train one with `{train}`")
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


def from_checkpoint(ckpt, path, **overrides):
    """The GPT a checkpoint holds, its config updated by overrides (dropout and the
    attention's kernel are a run's choice, not the weights')."""
    try:
        model = GPT(GPTConfig(**dict(ckpt["model_args"], **overrides)))
        model.load_state_dict(ckpt["model"])
    except LOAD_ERRORS as e:
        if out_of_memory(e):
            raise
        raise CheckpointError(
            f"{path} does not match this model.py ({first_line(e)}); "
            "use another copy or train it again with this version"
        ) from None
    bad = nonfinite_weight(model)
    if bad is not None:
        raise CheckpointError(
            f"{path} holds weights that are not finite (NaN or infinity in {bad}); "
            "use another copy or train it again"
        )
    return model


def from_gpt2(source, **overrides):
    """GPT-2's weights from a Hugging Face folder or by name ('gpt2', 'gpt2-medium', ...),
    or the model of a folder that export.py wrote (support/export_hf.py)."""
    from support.export_hf import ExportError, is_export, read_model

    try:
        if is_export(source):
            model = read_model(source, **overrides)
        else:
            model = GPT.from_pretrained(source, **overrides)
    except ExportError as e:
        raise LoadError(str(e)) from None
    except (OSError, *LOAD_ERRORS) as e:
        if out_of_memory(e):
            raise
        raise LoadError(f"could not load GPT-2 weights from {source}: {first_line(e)}") from None
    bad = nonfinite_weight(model)
    if bad is not None:
        raise LoadError(
            f"{source} holds weights that are not finite (NaN or infinity in {bad}); "
            "use another copy"
        )
    return model


def nonfinite_weight(model):
    """The name of the first weight holding NaN or infinity, or None. Such a model
    samples, measures and exports nothing but NaN (and sampling fails on it)."""
    for name, weight in model.named_parameters():
        if not torch.isfinite(weight).all():
            return name
    return None


def folder_tokenizer(source):
    """The tokenizer of a Hugging Face folder or name: GPT-2's, or the one export.py wrote."""
    from data.tokenizer import TokenizerError, get_tokenizer
    from support.export_hf import ExportError, is_export, read_tokenizer

    if not is_export(source):
        return get_tokenizer({"kind": "gpt2"})
    try:
        return read_tokenizer(source)
    except (ExportError, TokenizerError) as e:
        raise LoadError(f"{source} has a damaged tokenizer ({e})") from None


def is_gpt2(source):
    """Whether source names GPT-2's weights: a Hugging Face folder (config.json and
    no ckpt.pt; GPT-2's, or one export.py wrote), or a 'gpt2*' name that is no file
    or folder here."""
    if os.path.isdir(source):
        has_config = os.path.isfile(os.path.join(source, "config.json"))
        return has_config and not os.path.exists(checkpoint_path(source))
    return source.startswith("gpt2") and not os.path.exists(source)


# -----------------------------------------------------------------------------
# A model to train


def training_model(cfg, meta):
    """(model, checkpoint or None) for train.py's init_from other than 'scratch' (a new
    model, which train.py makes itself): 'resume' (out_dir's checkpoint, returned too),
    GPT-2's weights, or another run's checkpoint (its weights alone). Every failure the
    user can fix is a ValueError or a CheckpointError."""
    init, ckpt = cfg.init_from, None
    run_choices = dict(dropout=cfg.dropout, attn_dropout=cfg.attn_dropout, fused=cfg.fused)
    if init == "resume":
        from support.resume import changed_settings, check_resumable

        ckpt = load_checkpoint(cfg.out_dir)
        path = checkpoint_path(cfg.out_dir)
        check_resumable(ckpt, path)
        changed = changed_settings(ckpt, cfg)
        if changed and int(os.environ.get("RANK", 0)) == 0:
            print(
                "note: the run goes on with settings other than those it was trained with: "
                f"{', '.join(changed)}; to continue it as it was, give its own settings "
                "(its config file)"
            )
        if ckpt.get("tokenizer") != meta["tokenizer"]:
            raise ValueError(
                f"the checkpoint in {cfg.out_dir} was trained on another tokenizer "
                f"(dataset {ckpt.get('dataset')!r}); pass {dataset_options(ckpt)}"
            )
        model = from_checkpoint(ckpt, path, **run_choices)
    elif is_gpt2(init):
        if cfg.attention != "softmax":
            raise ValueError(
                f"init_from={init!r} loads GPT-2's weights, which need softmax attention; "
                f"train --attention={cfg.attention} from scratch"
            )
        try:
            wanted = folder_tokenizer(init).describe()
        except LoadError as e:
            raise ValueError(str(e)) from None
        if meta["tokenizer"]["kind"] != "gpt2" and wanted["kind"] == "gpt2":
            raise ValueError(
                f"init_from={init!r} needs a dataset tokenized with GPT-2 BPE, and "
                f"{cfg.dataset!r} is not; try --dataset=shakespeare"
            )
        if meta["tokenizer"] != wanted:
            raise ValueError(
                f"init_from={init!r} was trained with its own {wanted['kind']} tokenizer, "
                f"not the one of dataset {cfg.dataset!r}; pass the dataset it was trained on"
            )
        try:
            model = from_gpt2(
                init, block_size=cfg.block_size, attention=cfg.attention, **run_choices
            )
        except LoadError as e:
            raise ValueError(str(e)) from None
    elif os.path.isfile(init) or os.path.isfile(checkpoint_path(init)):
        model = from_another_run(init, cfg, meta, run_choices)
    elif os.path.isdir(init):
        raise ValueError(
            f"init_from={init!r} holds neither a checkpoint (ckpt.pt) nor a Hugging Face "
            "model (config.json); pass a checkpoint's folder or file, or a GPT-2 folder"
        )
    else:
        raise ValueError(
            f"init_from must be 'scratch', 'resume', a checkpoint (its folder or file), a GPT-2 "
            f"folder or a 'gpt2*' name, not {init!r}"
        )
    if model.config.vocab_size < meta["vocab_size"]:
        raise ValueError(
            f"the model's vocabulary ({model.config.vocab_size}) is smaller than the "
            f"dataset's ({meta['vocab_size']})"
        )
    kept = kept_model_keys(cfg, model.config)
    if kept and int(os.environ.get("RANK", 0)) == 0:
        print(f"note: the model keeps the shape it was trained with: {', '.join(kept)}")
    return model, ckpt


def from_another_run(init, cfg, meta, run_choices):
    """The weights of another run's checkpoint (its folder's ckpt.pt, or a file: a
    snapshot) to start this run from: iter 0, a new optimizer, this run's out_dir. Its
    tokenizer must be the dataset's, token for token."""
    path = checkpoint_path(init) if os.path.isdir(init) else init
    ckpt = load_checkpoint(path, option="--init_from")
    if ckpt.get("tokenizer") != meta["tokenizer"]:
        trained_on = ckpt.get("dataset")
        raise ValueError(
            f"{path} was trained on another tokenizer (dataset {trained_on!r}) than "
            f"dataset {cfg.dataset!r}'s; pass {dataset_options(ckpt)}, or a dataset "
            "prepared with the same tokenizer"
        )
    return from_checkpoint(ckpt, path, **run_choices)


def dataset_options(ckpt):
    """--dataset (and --data_root, where it was another) of the run that saved ckpt,
    to paste into a shell."""
    options = f"--dataset={shlex.quote(str(ckpt.get('dataset')))}"
    root = ckpt.get("config", {}).get("data_root")
    if isinstance(root, str):
        options += f" --data_root={shlex.quote(root)}"
    return options


def kept_model_keys(cfg, config):
    """The model keys where the settings ask for what the loaded model is not
    (--block_size=128 given to a resumed model of 64), each as 'key=model's (not
    settings')': its shape is the checkpoint's or GPT-2's, whatever the settings say.
    None in the settings (n_kv_head, attn_dropout) is a default, not a request."""
    kept = []
    for key in MODEL_KEYS:
        asked = getattr(cfg, key)
        if asked is not None and asked != getattr(config, key):
            kept.append(f"{key}={getattr(config, key)!r} (not {asked!r})")
    return kept


# -----------------------------------------------------------------------------
# A model to use


def load_model(init_from, out_dir):
    """(model, tokenizer, folder) from init_from: a checkpoint folder (its ckpt.pt),
    a checkpoint file (a snapshot), a Hugging Face GPT-2 folder or a 'gpt2*' name;
    or, when init_from is "", out_dir's checkpoint. folder is the checkpoint's, the
    default home of what a command writes about the model (out_dir for GPT-2)."""
    # here only: training loads a model without its tokenizer
    from data.tokenizer import TokenizerError, get_tokenizer

    source = init_from or out_dir
    if init_from and is_gpt2(init_from):
        return from_gpt2(init_from), folder_tokenizer(init_from), out_dir
    if init_from and not os.path.exists(init_from):
        raise LoadError(
            f"--init_from={init_from}: no such file or folder; pass a checkpoint folder "
            "(with ckpt.pt) or a Hugging Face GPT-2 folder (with config.json)"
        )
    option = "--init_from" if init_from else "--out_dir"
    ckpt = load_checkpoint(source, option=option)
    path = checkpoint_path(source) if os.path.isdir(source) else source
    if "tokenizer" not in ckpt:
        raise CheckpointError(
            f"{path} does not say which tokenizer it was trained with "
            "(no 'tokenizer' entry); train it again with this version of train.py"
        )
    model = from_checkpoint(ckpt, path)
    try:
        tok = get_tokenizer(ckpt["tokenizer"])
    except TokenizerError as e:
        raise CheckpointError(f"{path} has a damaged tokenizer description ({e})") from None
    folder = source if os.path.isdir(source) else os.path.dirname(source)
    return model, tok, folder
