"""
One text into a dataset: train.bin and val.bin of uint16 token ids, split by
characters (the first 90% train), and meta.json. Tiny Shakespeare, and any one
.txt file or folder of them prepared with --tokenizer char, take this path;
corpora of documents take data/corpus.py's.
"""

import contextlib
import json
import os
import re

import numpy as np
from tqdm import tqdm

from data import DataError
from data.tokenizer import TokenizerError, build_tokenizer

# Below this many characters a progress bar would only flash by.
PROGRESS_MIN_CHARS = 1_000_000
CHUNK_CHARS = 1_000_000
# A lone space or newline between two non-space characters: GPT-2's
# pre-tokenizer always splits there, so encoding the two sides separately
# gives exactly the tokens of encoding the whole text.
_SAFE_CUT = re.compile(r"(?<=\S)[ \n](?=\S)")


# ---------------------------------------------------------------- writing


@contextlib.contextmanager
def _atomic_open(path):
    # Readers never see a half-written file: write beside it, then rename.
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, path)
    except OSError as e:
        # a full disk: the file it was for, and the reason (a write names neither)
        raise DataError(f"cannot write {path} ({e.strerror or e})") from None
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
            # file.write: ndarray.tofile's error on a full disk gives no reason
            f.write(ids)
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
