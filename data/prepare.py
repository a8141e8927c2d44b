"""Turn a text corpus into token files that training reads with np.memmap.

A dataset is a folder holding meta.json (the tokenizer's description and the
token counts) and either train.bin and val.bin (one text, uint16 token ids) or
train_00000.bin, ..., val_00000.bin, ... (a corpus of documents in shards,
data/shards.py; streamed and tokenized on every core by data/corpus.py).

Prepare your own corpus:

    python data/prepare.py SOURCE --tokenizer gpt2|bpe:VOCAB --name NAME [--num_proc N]

where SOURCE is a folder or glob of .jsonl, .parquet or .txt files (a .txt
file is one document) or a Hugging Face dataset id (with --subset). One .txt
file, or --tokenizer char, makes one text split by characters as before.

Tiny Shakespeare is prepared on first use, or with
python data/shakespeare_char/prepare.py (characters) or
python data/shakespeare/prepare.py (GPT-2 BPE).
"""

import argparse
import glob
import os
import sys

# Works both as `python data/prepare.py` and as `python -m data.prepare`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from data import DATA_ROOT
from data.corpus import prepare_corpus
from data.shards import SHARD_TOKENS, DataError
from data.text import prepare_text, read_corpus
from data.tiny_shakespeare import SHAKESPEARE_ENV, prepare_shakespeare, shakespeare_dir


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


def _run(action):
    """Run a command-line action; errors become one line on stderr and exit code 1."""
    try:
        print(action())
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def shakespeare_main(kind, argv=None):
    """Command line of data/shakespeare_char/prepare.py and data/shakespeare/prepare.py."""
    parser = argparse.ArgumentParser(
        description=f"Prepare tiny Shakespeare with the {kind} tokenizer."
    )
    parser.add_argument(
        "--input",
        metavar="PATH",
        help=f"a local copy of input.txt (default: ${SHAKESPEARE_ENV}, then download)",
    )
    args = parser.parse_args(argv)
    _run(lambda: summary(shakespeare_dir(kind), prepare_shakespeare(kind, input_path=args.input)))


def _dataset_name(path, name):
    name = name or os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    if not name or name in (".", "..") or "/" in name or os.sep in name or glob.has_magic(name):
        raise DataError(f"invalid dataset name {name!r}; pass --name NAME (a plain folder name)")
    return name


def _one_text(args):
    """Whether the source is prepared as one text: the char tokenizer, or one .txt file."""
    return args.tokenizer == "char" or (os.path.isfile(args.path) and args.path.endswith(".txt"))


def _prepare(args):
    name = _dataset_name(args.path, args.name)
    out_dir = os.path.join(args.data_root or DATA_ROOT, name)
    if args.tokenizer == "char" and not (os.path.isdir(args.path) or args.path.endswith(".txt")):
        raise DataError(
            f"--tokenizer char reads one text, a .txt file or a folder of them; "
            f"for {args.path} use --tokenizer gpt2 or bpe:VOCAB"
        )
    if _one_text(args):
        text = read_corpus(args.path)
        val_fraction = 0.1 if args.val_fraction is None else args.val_fraction
        meta = prepare_text(
            text, out_dir, args.tokenizer, val_fraction, source=os.path.abspath(args.path)
        )
        return summary(out_dir, meta)
    meta = prepare_corpus(
        args.path,
        out_dir,
        kind=args.tokenizer,
        num_proc=args.num_proc,
        val_docs=args.val_docs,
        val_fraction=0.01 if args.val_fraction is None else args.val_fraction,
        text_column=args.text_column,
        subset=args.subset,
        shard_tokens=args.shard_tokens,
    )
    return summary(out_dir, meta)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Tokenize a corpus into data/NAME/: shards of documents, or one text."
    )
    parser.add_argument(
        "path",
        metavar="SOURCE",
        help="a folder or glob of .jsonl/.parquet/.txt files, a Hugging Face dataset id, "
        "or one UTF-8 text file",
    )
    parser.add_argument(
        "--tokenizer",
        default="char",
        help="char: one token per character (one small text); gpt2: GPT-2 BPE; "
        "bpe:VOCAB: a byte-level BPE of VOCAB tokens trained on the corpus (default: char)",
    )
    parser.add_argument("--name", help="dataset folder name (default: the file or folder name)")
    parser.add_argument("--num_proc", type=int, help="tokenizer processes (default: one per core)")
    parser.add_argument("--val_docs", type=int, help="the first N documents are the val split")
    parser.add_argument(
        "--val_fraction",
        type=float,
        help="share kept for validation: of the documents (default 0.01), "
        "or of one text's characters (default 0.1)",
    )
    parser.add_argument("--text_column", default="text", help="the column that holds the text")
    parser.add_argument("--subset", help="the hub dataset's subset (config), e.g. sample-10BT")
    parser.add_argument(
        "--shard_tokens", type=int, default=SHARD_TOKENS, help="tokens per shard file"
    )
    parser.add_argument(
        "--data_root", help="where dataset folders live (default: data/ in this repo)"
    )
    args = parser.parse_args(argv)
    _run(lambda: _prepare(args))


if __name__ == "__main__":
    main()
