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
import contextlib
import glob
import hashlib
import http.client
import json
import os
import re
import sys
import urllib.error
import urllib.request

# Works both as `python data/prepare.py` and as `import data.prepare`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np
from tqdm import tqdm

from data.corpus import prepare_corpus
from data.induction import induction_text
from data.shards import SHARD_TOKENS, DataError, ShardedTokens, check_shards
from data.tokenizer import GPT2_VOCAB_SIZE, TokenizerError, build_tokenizer, get_tokenizer

DATA_ROOT = os.path.join(ROOT, "data")
SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_BYTES = 1_115_394
SHAKESPEARE_ENV = "TINYSHAKESPEARE_PATH"
DOWNLOAD_TIMEOUT_S = 30

DATASETS = {"shakespeare_char": "char", "shakespeare": "gpt2"}
_FOLDER_FOR_KIND = {kind: name for name, kind in DATASETS.items()}
SPLITS = ("train", "val")
FILES = ("train.bin", "val.bin", "meta.json")

# Below this many characters a progress bar would only flash by.
PROGRESS_MIN_CHARS = 1_000_000
CHUNK_CHARS = 1_000_000
# A lone space or newline between two non-space characters: GPT-2's
# pre-tokenizer always splits there, so encoding the two sides separately
# gives exactly the tokens of encoding the whole text.
_SAFE_CUT = re.compile(r"(?<=\S)[ \n](?=\S)")

_META_TYPES = {
    "tokenizer": dict,
    "vocab_size": int,
    "dtype": str,
    "train_tokens": int,
    "val_tokens": int,
}
DTYPE_LIMITS = {"uint16": 2**16, "uint32": 2**32}


# ---------------------------------------------------------------- writing


@contextlib.contextmanager
def _atomic_open(path):
    # Readers never see a half-written file: write beside it, then rename.
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _write_atomic(path, data):
    with _atomic_open(path) as f:
        f.write(data)


def _chunks(text, size):
    start = 0
    while len(text) - start > size:
        cut = _SAFE_CUT.search(text, start + size)
        if cut is None:
            break
        yield text[start : cut.start()]
        start = cut.start()
    yield text[start:]


def _encode_to_file(tok, text, path, label):
    """Stream the token ids of ``text`` into ``path``; returns how many."""
    count = 0
    bar = tqdm(
        total=len(text),
        unit="char",
        unit_scale=True,
        desc=f"encoding {label}",
        disable=len(text) < PROGRESS_MIN_CHARS,
    )
    with bar, _atomic_open(path) as f:
        for piece in _chunks(text, CHUNK_CHARS):
            ids = np.array(tok.encode(piece), dtype=np.uint16)
            ids.tofile(f)
            count += len(ids)
            bar.update(len(piece))
    return count


def prepare_text(text, out_dir, tokenizer_kind, val_fraction=0.1, source=None):
    """Tokenize ``text`` into out_dir/{train.bin,val.bin,meta.json}; returns the meta dict."""
    if not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
    n_train = int(len(text) * (1 - val_fraction))
    if n_train == 0 or n_train == len(text):
        raise DataError(f"the text has {len(text)} characters: too few to split into train and val")
    try:
        tok = build_tokenizer(tokenizer_kind, text)
    except TokenizerError as e:
        raise DataError(str(e)) from None
    if tok.vocab_size > 2**16:
        raise DataError(
            f"the vocabulary has {tok.vocab_size} tokens; uint16 files hold at most 65536"
        )

    os.makedirs(out_dir, exist_ok=True)
    meta_path = os.path.join(out_dir, "meta.json")
    # meta.json marks a complete dataset: drop it now, write it only once the
    # .bin files are in place.
    if os.path.exists(meta_path):
        os.remove(meta_path)
    desc = tok.describe()
    if desc["kind"] == "bpe":
        # the dataset folder keeps the trained tokenizer; load_meta reads it back
        _write_atomic(os.path.join(out_dir, "tokenizer.json"), tok.json.encode("utf-8"))
        desc = {"kind": "bpe", "file": "tokenizer.json"}
    # Split by characters, as nanoGPT does, so the val text is the same
    # whichever tokenizer is used.
    parts = {"train": text[:n_train], "val": text[n_train:]}
    counts = {
        split: _encode_to_file(tok, part, os.path.join(out_dir, f"{split}.bin"), split)
        for split, part in parts.items()
    }
    meta = {
        "tokenizer": desc,
        "vocab_size": tok.vocab_size,
        "dtype": "uint16",
        "train_tokens": counts["train"],
        "val_tokens": counts["val"],
        "source": source,
    }
    _write_atomic(meta_path, (json.dumps(meta, indent=2) + "\n").encode("utf-8"))
    return meta


# ---------------------------------------------------------------- reading


def read_text_file(path):
    """The text of a UTF-8 file (a byte-order mark is dropped)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    return _decode_utf8(data, path)


def _decode_utf8(data, path):
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not UTF-8 text (bad byte at offset {e.start}); convert it to UTF-8 first"
        ) from None


def read_corpus(path):
    """A file's text, or all *.txt files under a folder, sorted and joined by blank lines."""
    if os.path.isdir(path):
        files = sorted(
            os.path.join(folder, name)
            for folder, _, names in os.walk(path)
            for name in names
            if name.endswith(".txt")
        )
        if not files:
            raise DataError(f"no *.txt files found under {path}")
        return "\n\n".join(read_text_file(f) for f in files)
    if not os.path.exists(path):
        raise DataError(f"{path} does not exist")
    return read_text_file(path)


def _prepare_hint(dataset_dir):
    name = os.path.basename(os.path.normpath(dataset_dir))
    if name in DATASETS:
        return f"python data/{name}/prepare.py"
    return f"python data/prepare.py YOUR_CORPUS --name {name}"


def load_meta(dataset_dir):
    """The dataset's meta.json, checked for the fields training relies on."""
    path = os.path.join(dataset_dir, "meta.json")
    if not os.path.exists(path):
        raise DataError(
            f"{path} is missing; prepare the dataset with: {_prepare_hint(dataset_dir)}"
        )
    again = f"prepare the dataset again with: {_prepare_hint(dataset_dir)}"
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise DataError(f"{path} is not valid JSON; {again}") from None
    if isinstance(meta, dict) and isinstance(meta.get("tokenizer"), dict):
        meta["tokenizer"] = _saved_tokenizer(dataset_dir, meta["tokenizer"], again)
    problem = _meta_problem(meta)
    if problem:
        raise DataError(f"{path} is malformed ({problem}); {again}")
    return meta


def _saved_tokenizer(dataset_dir, desc, again):
    """A 'bpe' tokenizer's description with its saved file read in, so that
    checkpoints hold the whole tokenizer and need no dataset folder."""
    if desc.get("kind") != "bpe" or not isinstance(desc.get("file"), str):
        return desc
    path = os.path.join(dataset_dir, os.path.basename(desc["file"]))
    try:
        with open(path, encoding="utf-8") as f:
            return {"kind": "bpe", "json": f.read()}
    except (OSError, UnicodeDecodeError):
        raise DataError(f"cannot read the dataset's tokenizer {path}; {again}") from None


def _meta_problem(meta):
    if not isinstance(meta, dict):
        return "not a JSON object"
    for key, kind in _META_TYPES.items():
        value = meta.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"'{key}' should be {kind.__name__}"
    if meta["dtype"] not in DTYPE_LIMITS or ("shards" not in meta and meta["dtype"] != "uint16"):
        return f"dtype {meta['dtype']!r} is not one of {', '.join(DTYPE_LIMITS)}"
    if not isinstance(meta["tokenizer"].get("kind"), str):
        return "the tokenizer has no 'kind'"
    if meta["vocab_size"] <= 0 or meta["train_tokens"] < 0 or meta["val_tokens"] < 0:
        return "negative sizes"
    if meta["vocab_size"] > DTYPE_LIMITS[meta["dtype"]]:
        return f"vocab_size {meta['vocab_size']} does not fit {meta['dtype']}"
    if "shards" in meta and _shards_problem(meta):
        return _shards_problem(meta)
    return _tokenizer_problem(meta["tokenizer"], meta["vocab_size"])


def _shards_problem(meta):
    shards = meta["shards"]
    if not isinstance(shards, dict) or set(shards) != set(SPLITS):
        return "'shards' should map train and val to lists of shards"
    for split in SPLITS:
        if not isinstance(shards[split], list):
            return f"the {split} shards should be a list"
        for shard in shards[split]:
            if not isinstance(shard, dict) or not isinstance(shard.get("file"), str):
                return f"a {split} shard has no 'file'"
            if shard["file"] != os.path.basename(shard["file"]):
                return f"the shard {shard['file']!r} is not a plain file name"
            if not isinstance(shard.get("tokens"), int) or shard["tokens"] < 0:
                return f"the shard {shard['file']!r} has no token count"
        if sum(shard["tokens"] for shard in shards[split]) != meta[f"{split}_tokens"]:
            return f"the {split} shards do not add up to {split}_tokens"
    return None


def _tokenizer_problem(desc, vocab_size):
    # The model is sized by vocab_size and decodes with the tokenizer, so the two must agree.
    if desc["kind"] == "char":
        chars = desc.get("chars")
        if not isinstance(chars, str) or not chars or len(set(chars)) != len(chars):
            return "the char tokenizer needs 'chars', a string of distinct characters"
        size = len(chars)
    elif desc["kind"] == "gpt2":
        size = GPT2_VOCAB_SIZE
    elif desc["kind"] == "bpe":
        try:
            size = get_tokenizer(desc).vocab_size
        except TokenizerError as e:
            return str(e)
    else:
        return f"unknown tokenizer kind {desc['kind']!r}"
    if size != vocab_size:
        return f"vocab_size is {vocab_size} but the tokenizer has {size} tokens"
    return None


def load_tokenizer(dataset_dir):
    """The tokenizer the dataset was encoded with."""
    try:
        return get_tokenizer(load_meta(dataset_dir)["tokenizer"])
    except TokenizerError as e:
        raise DataError(f"{os.path.join(dataset_dir, 'meta.json')}: {e}") from None


def load_tokens(dataset_dir, split):
    """The split's token ids, read-only: a uint16 memmap of split.bin, or the
    split's shards as one ShardedTokens."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    meta = load_meta(dataset_dir)
    again = f"prepare the dataset again with: {_prepare_hint(dataset_dir)}"
    if "shards" in meta:
        return ShardedTokens(check_shards(dataset_dir, meta, split, again), meta["dtype"])
    path = os.path.join(dataset_dir, f"{split}.bin")
    if not os.path.exists(path):
        raise DataError(f"{path} is missing; {again}")
    size = os.path.getsize(path)
    expected = meta[f"{split}_tokens"]
    if size % 2:
        raise DataError(f"{path} has an odd number of bytes ({size}), so it is truncated; {again}")
    if size // 2 != expected:
        raise DataError(f"{path} holds {size // 2} tokens but meta.json says {expected}; {again}")
    if size == 0:
        raise DataError(f"{path} is empty; {again}")
    return np.memmap(path, dtype=np.uint16, mode="r")


# ---------------------------------------------------------------- tiny Shakespeare


def _where_to_put(dataset_dir):
    return (
        f"put tiny Shakespeare at {os.path.join(dataset_dir, 'input.txt')}, "
        f"or pass --input PATH, or set {SHAKESPEARE_ENV}=PATH"
    )


def _user_file(dataset_dir, input_path):
    """The local copy to use, in order: --input, the env var, the dataset folder."""
    for given, origin in (
        (input_path, "--input"),
        (os.environ.get(SHAKESPEARE_ENV), SHAKESPEARE_ENV),
    ):
        if given:
            if not os.path.isfile(given):
                raise DataError(f"{given} (from {origin}) does not exist")
            return given
    cached = os.path.join(dataset_dir, "input.txt")
    return cached if os.path.isfile(cached) else None


def _download_shakespeare(dataset_dir):
    print(f"downloading tiny Shakespeare from {SHAKESPEARE_URL}", file=sys.stderr)
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except (OSError, http.client.HTTPException, ValueError) as e:  # URLError is an OSError
        reason = getattr(e, "reason", None) or e
        raise DataError(
            f"cannot download tiny Shakespeare ({reason}); {_where_to_put(dataset_dir)}"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != SHAKESPEARE_BYTES or digest != SHAKESPEARE_SHA256:
        raise DataError(
            f"the download from {SHAKESPEARE_URL} is corrupt "
            f"({len(data)} bytes, sha256 {digest[:12]}...); "
            f"try again, or {_where_to_put(dataset_dir)}"
        )
    os.makedirs(dataset_dir, exist_ok=True)
    _write_atomic(os.path.join(dataset_dir, "input.txt"), data)
    return data


def find_shakespeare(dataset_dir, also=()):
    """The path of tiny Shakespeare where the prepare scripts find it:
    $TINYSHAKESPEARE_PATH, then input.txt in the dataset folder, then each path
    in `also`; else it is downloaded, checked and kept in the dataset folder."""
    path = _user_file(dataset_dir, None) or next((p for p in also if os.path.isfile(p)), None)
    if path is None:
        _download_shakespeare(dataset_dir)
        path = os.path.join(dataset_dir, "input.txt")
    return path


def shakespeare_text(dataset_dir, input_path=None):
    """Tiny Shakespeare, from a local file when there is one, else downloaded once."""
    path = _user_file(dataset_dir, input_path)
    if path is None:
        return _decode_utf8(_download_shakespeare(dataset_dir), SHAKESPEARE_URL)
    with open(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != SHAKESPEARE_SHA256:
        # The user may well have edited it on purpose, so carry on.
        print(
            f"warning: {path} differs from the canonical tiny Shakespeare; using it anyway",
            file=sys.stderr,
        )
    return _decode_utf8(data, path)


def shakespeare_dir(kind, data_root=None):
    """data/shakespeare_char for 'char', data/shakespeare for 'gpt2'."""
    if kind not in _FOLDER_FOR_KIND:
        raise DataError(f"unknown tokenizer {kind!r}; use one of {', '.join(_FOLDER_FOR_KIND)}")
    return os.path.join(data_root or DATA_ROOT, _FOLDER_FOR_KIND[kind])


def prepare_shakespeare(kind, data_root=None, input_path=None):
    """Prepare tiny Shakespeare with the 'char' or 'gpt2' tokenizer; returns the meta dict."""
    dataset_dir = shakespeare_dir(kind, data_root)
    text = shakespeare_text(dataset_dir, input_path)
    return prepare_text(text, dataset_dir, kind, source=SHAKESPEARE_URL)


def ensure_dataset(name, data_root=None, input_path=None):
    """The folder of a prepared dataset, preparing tiny Shakespeare if needed."""
    data_root = data_root or DATA_ROOT
    dataset_dir = os.path.join(data_root, name)
    if all(os.path.exists(os.path.join(dataset_dir, f)) for f in FILES):
        return dataset_dir
    # a sharded dataset: meta.json is written last, after every shard
    if os.path.exists(os.path.join(dataset_dir, "meta.json")) and glob.glob(
        os.path.join(dataset_dir, "train_*.bin")
    ):
        return dataset_dir
    if name == "induction":  # generated, not read: data/induction.py
        print(f"preparing {name} in {dataset_dir} (first use)")
        prepare_text(induction_text(), dataset_dir, "char", source="data/induction.py")
        return dataset_dir
    if name not in DATASETS:
        raise DataError(
            f"unknown dataset {name!r} (no prepared files in {dataset_dir}); "
            f"known ones: {', '.join(DATASETS)}; prepare your own corpus with: "
            f"python data/prepare.py YOUR_CORPUS --name {name}"
        )
    print(f"preparing {name} in {dataset_dir} (first use)")
    prepare_shakespeare(DATASETS[name], data_root, input_path)
    return dataset_dir


# ---------------------------------------------------------------- command line


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
