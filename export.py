"""
Export a model trained here to a folder that Hugging Face transformers loads offline.

    python export.py --to=hf-shakespeare       # the main command's model, out-shakespeare-char
    # a snapshot of python train.py config/induction.py --snapshots=True
    python export.py --init_from=out-induction/snapshots/iter_000500.pt --to=hf-induction
    # after python train.py config/shakespeare_bpe.py (GGUF holds GPT-2's architecture only)
    python export.py --out_dir=out-shakespeare-bpe --format=gguf --to=shakespeare.gguf

The folder holds config.json, model.safetensors, generation_config.json and the
tokenizer's files; the model class is GPT-2's for the classic configs, GPT-NeoX's for
rotary positions alone, and this project's own modeling file, copied in, for the rest:

    from transformers import AutoModelForCausalLM, pipeline
    model = AutoModelForCausalLM.from_pretrained("hf-shakespeare", trust_remote_code=True)
    pipeline("text-generation", model="hf-shakespeare", trust_remote_code=True)("ROMEO:")

Every command here takes the folder back as --init_from=DIR, and gets the same model.
--to must be a new or empty folder: it is written beside it and renamed at the end, so
a failure leaves nothing half-written. --format=gguf writes one file for llama.cpp
instead, for GPT-2's kind of model with a BPE. docs/export.md says what each format
holds and cannot hold. Options are --key=value; `python export.py --help` lists them.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import os
import shlex
import sys

from support import cli
from support.export_hf import ARCHITECTURES, ExportError, check_target, export
from support.loading import load_model


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-shakespeare-char"  # the checkpoint's folder
    # "" = out_dir's checkpoint; or a checkpoint folder or file, or a Hugging Face folder
    init_from: str = ""
    to: str = ""  # the folder to write (new, or empty); with --format=gguf, the file
    # hf: a folder for transformers; gguf: one file for llama.cpp (GPT-2's kind, with a BPE)
    format: str = "hf"


def main(cfg):
    if cfg.format not in ("hf", "gguf"):
        raise ExportError(f"--format must be hf or gguf, not {cfg.format!r}")
    if not cfg.to:
        raise ExportError("pass the folder to write as --to=DIR (a file for --format=gguf)")
    if cfg.format == "gguf":
        return main_gguf(cfg)
    # before the model loads: an answer in a second, not after the work
    check_target(os.path.abspath(cfg.to))
    model, tok, _ = load_model(cfg.init_from, cfg.out_dir)
    try:
        kind = export(model.eval(), tok, cfg.to)
    except OSError as e:
        raise written(e, cfg.to) from None
    c = model.config
    print(
        f"wrote {cfg.to}: {ARCHITECTURES[kind]}, {c.n_layer} layers x {c.n_head} heads, "
        f"{c.n_embd} wide, a {tok.describe()['kind']} tokenizer of {tok.vocab_size} tokens"
    )
    remote = ""
    if kind == "hackable_gpt":
        remote = ", trust_remote_code=True"
    print(f'load it with AutoModelForCausalLM.from_pretrained("{cfg.to}"{remote})')


def main_gguf(cfg):
    from support.export_gguf import write_gguf

    model, tok, _ = load_model(cfg.init_from, cfg.out_dir)
    try:
        write_gguf(model.eval(), tok, cfg.to)
    except OSError as e:
        raise written(e, cfg.to) from None
    c = model.config
    print(f"wrote {cfg.to}: gpt2, {c.n_layer} layers x {c.n_head} heads, {c.n_embd} wide")
    print(f"run it with llama.cpp: llama-cli -m {shlex.quote(cfg.to)} -p 'ROMEO:'")


def written(e, target):
    """The line of an export that could not be written (a full disk); nothing of it is
    left behind."""
    return cli.Failed(f"cannot write {target} ({e.strerror or e}); pass another --to")


def run(argv):
    """The command: what `python export.py ...` exits with (cli.py)."""
    return cli.run(main, argv, __doc__, Settings, (ExportError,))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
