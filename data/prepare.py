"""Turn a text corpus into token files that training reads with np.memmap.

A dataset is a folder holding meta.json (the tokenizer's description and the
token counts) and either train.bin and val.bin (one text, uint16 token ids) or
train_00000.bin, ..., val_00000.bin, ... (a corpus of documents in shards,
data/shards.py; streamed and tokenized on every core by data/corpus.py).

Prepare your own corpus:

    python data/prepare.py SOURCE --tokenizer=gpt2|bpe:VOCAB --name=NAME [--num_proc=N]

where SOURCE is a folder or glob of .jsonl, .parquet or .txt files (a .txt
file is one document) or a Hugging Face dataset id (with --subset). One .txt
file, or --tokenizer char, makes one text split by characters as before.

Tiny Shakespeare is prepared on first use, or with
python data/shakespeare_char/prepare.py (characters) or
python data/shakespeare/prepare.py (GPT-2 BPE).
"""

import dataclasses
import glob
import os
import sys

# Works both as `python data/prepare.py` and as `python -m data.prepare`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from data import DATA_ROOT, DataError
from data.corpus import prepare_corpus
from data.shards import SHARD_TOKENS
from data.text import prepare_text, read_corpus
from data.tiny_shakespeare import prepare_shakespeare, shakespeare_dir
from data.tokenizer import TokenizerError, bpe_vocab_size, check_bpe_size
from support.configurator import (
    ConfigError,
    parse_settings,
    wants_help,
)
from support.help import describe_settings, print_help


def summary(dataset_dir, meta):
    line = (
        f"{dataset_dir}: {meta['tokenizer']['kind']} tokenizer, vocab {meta['vocab_size']}, "
        f"train {meta['train_tokens']:,} tokens, val {meta['val_tokens']:,} tokens"
    )
    if "shards" not in meta:
        return line
    docs = meta["documents"]
    shards = len(meta["shards"]["train"]) + len(meta["shards"]["val"])
    return (
        f"{line}, {docs['train']:,} + {docs['val']:,} documents in {shards} {meta['dtype']} shards"
    )


@dataclasses.dataclass
class Settings:
    """The options of `python data/prepare.py SOURCE`."""

    # a folder or glob of .jsonl/.parquet/.txt files, a Hugging Face dataset id, or one
    # UTF-8 text file (SOURCE, the one bare argument)
    source: str = ""
    # char: one token per character (one small text); gpt2: GPT-2 BPE; bpe:VOCAB: a
    # byte-level BPE of VOCAB tokens trained on the corpus
    tokenizer: str = "char"
    name: str = ""  # dataset folder name ("": the file or folder name)
    num_proc: int | None = None  # tokenizer processes (None: one per core)
    val_docs: int | None = None  # the first N documents are the val split
    # share kept for validation: of the documents (None: 0.01), or of one text's characters
    # (None: 0.1)
    val_fraction: float | None = None
    text_column: str = "text"  # the column that holds the text
    subset: str | None = None  # the hub dataset's subset (config), e.g. sample-10BT
    shard_tokens: int = SHARD_TOKENS  # tokens per shard file
    data_root: str = DATA_ROOT  # where dataset folders live


@dataclasses.dataclass
class ShakespeareSettings:
    """The options of data/shakespeare_char/prepare.py and data/shakespeare/prepare.py."""

    # a local copy of input.txt ("": $TINYSHAKESPEARE_PATH, then data/NAME/input.txt,
    # then a download)
    input: str = ""


def shakespeare_main(kind, argv=None):
    """Command line of data/shakespeare_char/prepare.py and data/shakespeare/prepare.py."""

    def prepare_it(cfg):
        meta = prepare_shakespeare(kind, input_path=cfg.input or None)
        print(summary(shakespeare_dir(kind), meta))

    doc = f"Prepare tiny Shakespeare with the {kind} tokenizer."
    sys.exit(run(prepare_it, argv, doc, ShakespeareSettings))


def _dataset_name(path, name):
    name = name or os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    if not name or name in (".", "..") or "/" in name or os.sep in name or glob.has_magic(name):
        raise ConfigError(f"invalid dataset name {name!r}; pass --name NAME (a plain folder name)")
    return name


def check_options(cfg):
    """ConfigError (exit 2, as every bad option) for an option no corpus could be
    prepared with, before any is read."""
    if not cfg.source:
        raise ConfigError("name the corpus: python data/prepare.py SOURCE (see --help)")
    try:
        vocab_size = bpe_vocab_size(cfg.tokenizer)
        if vocab_size is not None:
            check_bpe_size(vocab_size)
    except TokenizerError as e:
        raise ConfigError(str(e)) from None
    if vocab_size is None and cfg.tokenizer not in ("char", "gpt2"):
        raise ConfigError(
            f"unknown --tokenizer {cfg.tokenizer!r}; use char, gpt2 or bpe:VOCAB (bpe:4096, say)"
        )
    for key in ("num_proc", "val_docs", "shard_tokens"):
        value = getattr(cfg, key)
        if value is not None and value < 1:
            raise ConfigError(f"--{key} must be 1 or more, got {value}")
    if cfg.val_fraction is not None and not 0 < cfg.val_fraction < 1:
        raise ConfigError(f"--val_fraction must be between 0 and 1, got {cfg.val_fraction}")
    if cfg.subset is not None and os.path.exists(cfg.source):
        raise ConfigError(
            f"--subset names a subset of a Hugging Face dataset, and {cfg.source} is local "
            "files, which have none; leave --subset out"
        )
    # (a source that does not exist is said so where it is read)
    text_source = os.path.isdir(cfg.source) or cfg.source.endswith(".txt")
    if cfg.tokenizer == "char" and os.path.exists(cfg.source) and not text_source:
        raise ConfigError(
            f"--tokenizer char reads one text, a .txt file or a folder of them; "
            f"for {cfg.source} use --tokenizer gpt2 or bpe:VOCAB"
        )
    # one text has no documents, columns or shards: these did nothing, and said nothing
    for_documents = {"val_docs": None, "text_column": "text", "shard_tokens": SHARD_TOKENS}
    given = [f"--{key}" for key, default in for_documents.items() if getattr(cfg, key) != default]
    if given and _one_text(cfg):
        raise ConfigError(
            f"{cfg.source} is prepared as one text (train.bin and val.bin, its last "
            "--val_fraction of characters for val), and only a corpus of documents takes "
            f"{' and '.join(given)}: leave it out, or use --tokenizer gpt2 or bpe:VOCAB on "
            "a folder of files"
        )


def _one_text(cfg):
    """Whether the source is prepared as one text: the char tokenizer, or one .txt file."""
    return cfg.tokenizer == "char" or (os.path.isfile(cfg.source) and cfg.source.endswith(".txt"))


def prepare(cfg):
    """Prepare cfg.source into data_root/NAME and print what was written."""
    check_options(cfg)
    name = _dataset_name(cfg.source, cfg.name)
    out_dir = os.path.join(cfg.data_root, name)
    if _one_text(cfg):
        text = read_corpus(cfg.source)
        val_fraction = 0.1 if cfg.val_fraction is None else cfg.val_fraction
        meta = prepare_text(
            text, out_dir, cfg.tokenizer, val_fraction, source=os.path.abspath(cfg.source)
        )
    else:
        meta = prepare_corpus(
            cfg.source,
            out_dir,
            kind=cfg.tokenizer,
            num_proc=cfg.num_proc,
            val_docs=cfg.val_docs,
            val_fraction=0.01 if cfg.val_fraction is None else cfg.val_fraction,
            text_column=cfg.text_column,
            subset=cfg.subset,
            shard_tokens=cfg.shard_tokens,
        )
    print(summary(out_dir, meta))
    asked = bpe_vocab_size(cfg.tokenizer)
    if asked is not None and meta["vocab_size"] < asked:
        # a corpus this small runs out of pairs to merge
        print(
            f"(--tokenizer {cfg.tokenizer}: the corpus gave {meta['vocab_size']:,} tokens, "
            "by then each of its words was one token; a larger corpus gives more)"
        )


def run(command, argv, doc, settings, positional=None):
    """command(cfg) with cfg parsed from argv (sys.argv's by default), or --help.
    Every failure is one line, as in every command of the project (support/cli.py;
    this light copy keeps torch out, as preparing data needs none): exit code 2 for
    a bad option (check_options), 1 for a corpus that cannot be prepared. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print_help(doc, describe_settings(settings))
        return 0
    try:
        command(parse_settings(settings, argv, allow_files=False, positional=positional))
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        # a bad option is bad input; a corpus that cannot be prepared, a failure
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        # a folder that cannot be made or written (a read-only place, a full disk)
        print(
            f"error: cannot read or write {e.filename or 'a file'} ({e.strerror or e})",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv=None):
    return run(prepare, argv, __doc__, Settings, positional="source")


if __name__ == "__main__":
    sys.exit(main())
