"""
The model a training run starts from, as init_from says: a new one ('scratch'),
out_dir's checkpoint ('resume'), or GPT-2's weights (a Hugging Face folder or a
'gpt2*' name). Every failure the user can fix is one line.
"""

import dataclasses
import os

from model import GPT, GPTConfig
from support.checkpoint import first_line
from support.resume import LOAD_ERRORS, out_of_memory, resume_model
from support.settings import MODEL_KEYS, model_args


def load_pretrained(init, cfg):
    """GPT-2 weights from a Hugging Face folder or by name; any failure is one line naming it."""
    try:
        return GPT.from_pretrained(
            init,
            dropout=cfg.dropout,
            block_size=cfg.block_size,
            attention=cfg.attention,
            fused=cfg.fused,
        )
    except (OSError, *LOAD_ERRORS) as e:
        if out_of_memory(e):
            raise
        raise ValueError(f"could not load GPT-2 weights from {init}: {first_line(e)}") from None


def init_model(cfg, meta):
    """(model, checkpoint or None, cfg with the model keys set to the model's own)."""
    init, ckpt = cfg.init_from, None
    if init == "scratch":
        model = GPT(GPTConfig(**model_args(cfg, meta["vocab_size"])))
    elif init == "resume":
        model, ckpt = resume_model(cfg, meta)
    elif os.path.isdir(init) or init.startswith("gpt2"):
        if meta["tokenizer"]["kind"] != "gpt2":
            raise ValueError(
                f"init_from={init!r} needs a dataset tokenized with GPT-2 BPE, and "
                f"{cfg.dataset!r} is not; try --dataset=shakespeare"
            )
        model = load_pretrained(init, cfg)
    else:
        raise ValueError(
            f"init_from must be 'scratch', 'resume', a GPT-2 folder or a 'gpt2*' name, not {init!r}"
        )
    if model.config.vocab_size < meta["vocab_size"]:
        raise ValueError(
            f"the model's vocabulary ({model.config.vocab_size}) is smaller than the "
            f"dataset's ({meta['vocab_size']})"
        )
    cfg = dataclasses.replace(cfg, **{key: getattr(model.config, key) for key in MODEL_KEYS})
    return model, ckpt, cfg
