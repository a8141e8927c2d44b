"""
A model of this project as a folder that Hugging Face `transformers` loads offline, and
such a folder read back (train.py's, sample.py's, heads.py's and explore.py's --init_from).

The folder holds config.json, model.safetensors, generation_config.json and the
tokenizer's files (support/export_tokenizer.py). Its class is the first of these that
holds the model exactly:

  gpt2          GPT2LMHeadModel: learned positions, one key/value head per query head,
                no QK-norm and no window. Its Conv1D layers store each weight transposed,
                and it always has biases: a model without them gets zeros.
  gpt_neox      GPTNeoXForCausalLM (Pythia's): the same with rotary positions. Its
                query_key_value holds each head's query, key and value side by side, and
                it too always has biases.
  hackable_gpt  everything else (QK-norm, grouped-query attention, a window and its sinks,
                linear attention, token shift): support/modeling_hackable_gpt.py, copied
                into the folder and loaded with trust_remote_code=True, with model.py's
                names.

KV shifting (kv_shift) is refused in one line: no class here mixes a key with the one
before it, so sample such a model with sample.py.

config.json also carries `gpt_config`, the model's GPTConfig, and `tokenizer_kind`, so that
reading the folder back gives the model and tokenizer it came from: a model without biases
comes back without them, unless a fine-tune in transformers has made them non-zero.

Exporting writes files only: it needs safetensors and tokenizers, not transformers.
"""

import dataclasses
import json
import math
import os
import re
import shutil

import torch

from model import GPT, GPTConfig

REMOTE_CODE = "modeling_hackable_gpt.py"
ARCHITECTURES = {
    "gpt2": "GPT2LMHeadModel",
    "gpt_neox": "GPTNeoXForCausalLM",
    "hackable_gpt": "HackableGPTForCausalLM",
}
# transformers' names of model.py's activations (torch's own tanh GELU, not gelu_new's
# formula written out, so that the logits agree to the last bits)
HF_ACTIVATIONS = {"gelu": "gelu_pytorch_tanh", "relu2": "relu2"}
OUR_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu", "gelu_new": "gelu", "relu2": "relu2"}
# Hugging Face's GPT-2 stores these as Conv1D, (in, out): the transpose of Linear's weight
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# model.py's names and GPT-NeoX's, part for part
NEOX_NAMES = [
    ("transformer.wte.", "gpt_neox.embed_in."),
    ("transformer.ln_f.", "gpt_neox.final_layer_norm."),
    ("transformer.h.", "gpt_neox.layers."),
    (".ln_1.", ".input_layernorm."),
    (".attn.c_attn.", ".attention.query_key_value."),
    (".attn.c_proj.", ".attention.dense."),
    (".ln_2.", ".post_attention_layernorm."),
    (".mlp.c_fc.", ".mlp.dense_h_to_4h."),
    (".mlp.c_proj.", ".mlp.dense_4h_to_h."),
]
# how sample.py samples by default, for generate and pipeline
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 200}
SAMPLE_TOKENS = 500
# the fields of GPTConfig that are a run's choice, not the weights'
RUN_CHOICES = ("dropout", "attn_dropout", "fused")


class ExportError(Exception):
    """A folder that cannot be written or read as an export; one line saying what to do."""


def hf_class(config):
    """The model_type the folder gets: the first class that holds config exactly."""
    plain = (
        config.attention == "softmax"
        and not config.qk_norm
        and config.n_kv_head == config.n_head
        and config.sliding_window is None
        and not config.token_shift
    )
    if plain and not config.rope:
        return "gpt2"
    if plain:
        return "gpt_neox"
    return "hackable_gpt"


def model_args(config):
    """GPTConfig's fields as a dict, as a checkpoint's model_args."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


# -----------------------------------------------------------------------------
# config.json and generation_config.json


def config_json(config, kind, tokenizer_kind, eot):
    """config.json for the class `kind`, with gpt_config and tokenizer_kind for reading back."""
    common = {
        "architectures": [ARCHITECTURES[kind]],
        "model_type": kind,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "dtype": "float32",
        "gpt_config": model_args(config),
        "tokenizer_kind": tokenizer_kind,
    }
    if kind == "gpt2":
        return common | {
            "n_positions": config.block_size,
            "n_embd": config.n_embd,
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "activation_function": HF_ACTIVATIONS[config.activation],
            "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
    if kind == "gpt_neox":
        return common | {
            "hidden_size": config.n_embd,
            "num_hidden_layers": config.n_layer,
            "num_attention_heads": config.n_head,
            "intermediate_size": 4 * config.n_embd,
            "hidden_act": HF_ACTIVATIONS[config.activation],
            "max_position_embeddings": config.block_size,
            "layer_norm_eps": 1e-5,
            # x + attn(ln_1(x)), then x + mlp(ln_2(x)), as model.py's Block
            "use_parallel_residual": False,
            # every channel pair turns (model.py's rotary_tables, base 10000)
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
            },
            "attention_bias": True,
            "attention_dropout": 0.0,
            "hidden_dropout": 0.0,
        }
    fields = {key: value for key, value in model_args(config).items() if key not in RUN_CHOICES}
    return (
        common
        | fields
        | {
            "auto_map": {
                "AutoConfig": "modeling_hackable_gpt.HackableGPTConfig",
                "AutoModelForCausalLM": "modeling_hackable_gpt.HackableGPTForCausalLM",
            },
            "rope_base": 10000.0,
            "layer_norm_eps": 1e-5,
        }
    )


def generation_config_json(config, eot):
    """sample.py's defaults; a model whose positions end at block_size stops there."""
    gen = dict(SAMPLING)
    if eot is not None:
        gen |= {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}
    if math.isfinite(config.context):
        gen["max_length"] = config.block_size
    else:
        gen["max_new_tokens"] = SAMPLE_TOKENS
    return gen


# -----------------------------------------------------------------------------
# The weights, both ways


def with_biases(config):
    """The state dict's shapes of the same model with biases, on the meta device."""
    with torch.device("meta"):
        full = GPT(dataclasses.replace(config, bias=True))
    return {key: t.shape for key, t in full.state_dict().items()}


def neox_name(key, reverse=False):
    for ours, theirs in NEOX_NAMES:
        if reverse:
            key = key.replace(theirs, ours)
        else:
            key = key.replace(ours, theirs)
    return key


def per_head_qkv(t, n_head, reverse=False):
    """c_attn's rows [Q of every head, K of every head, V of every head] as GPT-NeoX's
    [Q, K, V of head 0, Q, K, V of head 1, ...], or (reverse) back."""
    rows = t.shape[0]
    parts = (3, n_head, rows // (3 * n_head))
    if reverse:
        parts = (n_head, 3, rows // (3 * n_head))
    return t.reshape(*parts, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def to_hf(state_dict, config, kind):
    """model.py's state dict as the class `kind` names and lays out its tensors."""
    # the LM head is the token embedding (tied): transformers ties it again on loading
    sd = {key: t for key, t in state_dict.items() if key != "lm_head.weight"}
    if kind == "hackable_gpt":
        return sd
    for key, shape in with_biases(config).items():
        if key not in sd and key != "lm_head.weight":
            sd[key] = torch.zeros(shape)
    if kind == "gpt2":
        return {key: t.t() if key.endswith(CONV1D) else t for key, t in sd.items()}
    out = {}
    for key, t in sd.items():
        if ".attn.c_attn." in key:
            t = per_head_qkv(t, config.n_head)
        out[neox_name(key)] = t
    return out


def from_hf(tensors, config, kind):
    """to_hf undone: model.py's names and layouts, the head tied again, and config's bias
    set by the weights (a stock class's zero biases are dropped, non-zero ones kept)."""
    sd = {}
    for key, t in tensors.items():
        # causal-mask buffers of older GPT-2 files, and a head saved beside its embedding
        if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
            continue
        if kind == "gpt2" and key.endswith(CONV1D):
            t = t.t()
        if kind == "gpt_neox":
            key = neox_name(key, reverse=True)
            if ".attn.c_attn." in key:
                t = per_head_qkv(t, config.n_head, reverse=True)
        sd[key] = t
    biases = [key for key in with_biases(config) if key.endswith("bias") and key in sd]
    if not config.bias and any(sd[key].any() for key in biases):
        config = dataclasses.replace(config, bias=True)
    if not config.bias:
        for key in biases:
            del sd[key]
    if "transformer.wte.weight" in sd:
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd, config


# -----------------------------------------------------------------------------
# Writing a folder


def check_target(target):
    """A one-line ExportError unless target is a new or empty folder."""
    if os.path.isdir(target) and not os.listdir(target):
        return
    if os.path.exists(target):
        raise ExportError(
            f"{target} already exists and is not an empty folder; pass another --to "
            "or remove it first"
        )


def write_atomically(target, write):
    """write(folder) into a temporary folder beside target, then renamed to target: a
    failure or a kill leaves no half-written export behind (a kill leaves the temporary
    folder, swept by the next export beside it)."""
    target = os.path.abspath(target)
    check_target(target)
    parent = os.path.dirname(target)
    prefix = f".{os.path.basename(target)}.tmp."
    try:
        os.makedirs(parent, exist_ok=True)
        for name in os.listdir(parent):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
        tmp = os.path.join(parent, f"{prefix}{os.getpid()}")
        os.mkdir(tmp)
    except OSError as e:
        raise ExportError(f"cannot write into {parent} ({e.strerror or e}); pass another --to")
    try:
        write(tmp)
        # onto an empty folder too: rename replaces an empty directory
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def written_error(e, path):
    """safetensors' error for a write the system refused (a full disk), as the OSError
    Python gives for one: its errno is in the error's text, as `(os error 28)`."""
    found = re.search(r"\(os error (\d+)\)", str(e))
    if found is None:
        return e
    return OSError(int(found.group(1)), os.strerror(int(found.group(1))), path)


def export(model, tok, target):
    """Write model (a GPT) and tok (data/tokenizer.py's) into the folder target, which
    must be new or empty. Returns the model_type the folder holds."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from support.export_tokenizer import end_of_text, tokenizer_files

    config = model.config
    if config.kv_shift:
        raise ExportError(
            "no Hugging Face class holds KV shifting (kv_shift): each key there is its "
            "token's own; sample this model with sample.py"
        )
    kind = hf_class(config)
    eot = end_of_text(tok)
    state = {key: t.detach().float().cpu() for key, t in model.state_dict().items()}
    tensors = {key: t.contiguous() for key, t in to_hf(state, config, kind).items()}
    max_length = config.block_size if math.isfinite(config.context) else None
    texts = {
        "config.json": config_json(config, kind, tok.describe()["kind"], eot),
        "generation_config.json": generation_config_json(config, eot),
    }
    texts = {name: json.dumps(value, indent=2) + "\n" for name, value in texts.items()}
    texts |= tokenizer_files(tok, max_length)

    def write(folder):
        weights = os.path.join(folder, "model.safetensors")
        try:
            save_file(tensors, weights, metadata={"format": "pt"})
        except SafetensorError as e:
            raise written_error(e, weights) from None
        # safetensors writes its file readable by its owner alone; the folder is for sharing
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(weights, 0o666 & ~umask)
        for name, text in texts.items():
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(text)
        if kind == "hackable_gpt":
            here = os.path.dirname(os.path.abspath(__file__))
            shutil.copyfile(os.path.join(here, REMOTE_CODE), os.path.join(folder, REMOTE_CODE))

    write_atomically(target, write)
    return kind


# -----------------------------------------------------------------------------
# Reading a folder back


def read_config(folder):
    """config.json of folder as a dict, or None where there is none to read."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_export(folder):
    """Whether folder is one that export() wrote (its config.json has gpt_config)."""
    hf = read_config(folder) if os.path.isdir(folder) else None
    return isinstance(hf, dict) and "gpt_config" in hf


def read_model(folder, **overrides):
    """The GPT an exported folder holds. overrides: the run's dropout, attn_dropout and
    fused; block_size (a model with learned positions keeps the first block_size of
    them); attention, which must be the model's own."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    hf = read_config(folder)
    try:
        config = GPTConfig(**hf["gpt_config"])
        kind = hf["model_type"]
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"{folder}/config.json has a damaged gpt_config ({e})") from None
    attention = overrides.pop("attention", config.attention)
    if attention != config.attention:
        raise ExportError(
            f"{folder} holds a model with {config.attention} attention, not {attention}"
        )
    block_size = overrides.pop("block_size", config.block_size)
    if not config.rope and block_size > config.block_size:
        raise ExportError(
            f"block_size {block_size} is larger than the {config.block_size} learned "
            f"positions in {folder}"
        )
    path = os.path.join(folder, "model.safetensors")
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError) as e:
        raise ExportError(f"{path} is missing, truncated or not safetensors ({e})") from None
    sd, config = from_hf(tensors, config, kind)
    if "transformer.wpe.weight" in sd:
        sd["transformer.wpe.weight"] = sd["transformer.wpe.weight"][:block_size]
    config = dataclasses.replace(config, block_size=block_size, **overrides)
    model = GPT(config)
    try:
        model.load_state_dict(sd, strict=True)
    except RuntimeError as e:
        raise ExportError(f"{path} does not fit its config.json ({e})") from None
    return model


def read_tokenizer(folder):
    """The tokenizer of an exported folder, as data/tokenizer.py's."""
    from support.export_tokenizer import read_tokenizer as from_json

    path = os.path.join(folder, "tokenizer.json")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ExportError(f"cannot read {path} ({e.strerror or e})") from None
    return from_json(read_config(folder).get("tokenizer_kind"), text)
