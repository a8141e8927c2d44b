"""
A prepared dataset, from its meta.json to a batch: a folder holding meta.json (the
tokenizer's description and the token counts) and either train.bin and val.bin (one
text, uint16 token ids, data/text.py) or train_00000.bin, ..., val_00000.bin, ... (a
corpus of documents in shards, data/shards.py, written by data/corpus.py). What
training, heads.py and the benchmarks read; data/prepare.py is the command that
writes one.

A batch is a set of random block_size windows of a split, and y is x shifted by one
token:

    load_split    a split on the device (small), as a memmap (large), or as shards
    get_batch     the windows at given starts, as x, y on the device
    step_batches  this process's micro-batches of one iter
"""

import glob
import json
import os

import numpy as np
import torch

from data import DATA_ROOT, DataError, typed_path

# the datasets prepared on first use, and the command that prepares each
DATASETS = {
    "shakespeare_char": "python data/shakespeare_char/prepare.py",
    "shakespeare": "python data/shakespeare/prepare.py",
    "induction": "python data/induction.py",
}
SPLITS = ("train", "val")
FILES = ("train.bin", "val.bin", "meta.json")
_META_TYPES = {
    "tokenizer": dict,
    "vocab_size": int,
    "dtype": str,
    "train_tokens": int,
    "val_tokens": int,
}
DTYPE_LIMITS = {"uint16": 2**16, "uint32": 2**32}


def _prepare_hint(dataset_dir):
    """The command that prepares the dataset in dataset_dir, to paste into a shell: for
    one of DATASETS its own (elsewhere than data/, the folder removed: the next run
    prepares it); else data/prepare.py with the source and tokenizer its meta.json
    names, where it can still be read (the default tokenizer, char, reads .txt only)."""
    import shlex  # here only: a dataset to prepare

    folder = os.path.normpath(dataset_dir)
    name = os.path.basename(folder)
    root = os.path.dirname(folder)
    default_root = root == os.path.normpath(DATA_ROOT)
    if name in DATASETS and default_root:
        return "python " + typed_path(DATASETS[name].removeprefix("python "))
    if name in DATASETS:
        return f"rm -r {shlex.quote(folder)} (the next run prepares it again)"
    source = "YOUR_CORPUS"
    tokenizer = ""
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        tokenizer = " --tokenizer=TOKENIZER"  # the one it was prepared with
        if isinstance(meta.get("source"), str):
            source = shlex.quote(meta["source"])
        kind = meta["tokenizer"]["kind"]
        tokenizer = f" --tokenizer={kind}"
        if kind == "bpe":
            tokenizer = f" --tokenizer=bpe:{meta['vocab_size']}"
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    there = "" if default_root else f" --data_root={shlex.quote(root)}"
    prepare = typed_path("data/prepare.py")
    return f"python {prepare} {source}{tokenizer} --name {shlex.quote(name)}{there}"


def _again(dataset_dir):
    """The end of a message about a damaged dataset: how to prepare it anew."""
    return f"prepare the dataset again with: {_prepare_hint(dataset_dir)}"


def load_meta(dataset_dir):
    """The dataset's meta.json, checked for the fields training relies on."""
    path = os.path.join(dataset_dir, "meta.json")
    if not os.path.exists(path):
        raise DataError(
            f"{path} is missing; prepare the dataset with: {_prepare_hint(dataset_dir)}"
        )
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise DataError(f"{path} is not valid JSON; {_again(dataset_dir)}") from None
    if isinstance(meta, dict) and isinstance(meta.get("tokenizer"), dict):
        meta["tokenizer"] = _saved_tokenizer(dataset_dir, meta["tokenizer"])
    problem = _meta_problem(meta)
    if problem:
        raise DataError(f"{path} is malformed ({problem}); {_again(dataset_dir)}")
    return meta


def _saved_tokenizer(dataset_dir, desc):
    """A 'bpe' tokenizer's description with its saved file read in, so that
    checkpoints hold the whole tokenizer and need no dataset folder."""
    if desc.get("kind") != "bpe" or not isinstance(desc.get("file"), str):
        return desc
    path = os.path.join(dataset_dir, os.path.basename(desc["file"]))
    try:
        with open(path, encoding="utf-8") as f:
            return {"kind": "bpe", "json": f.read()}
    except (OSError, UnicodeDecodeError):
        raise DataError(
            f"cannot read the dataset's tokenizer {path}; {_again(dataset_dir)}"
        ) from None


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
    if "shards" in meta:
        from data.shards import shards_problem  # here only: a sharded dataset

        problem = shards_problem(meta)
        if problem:
            return problem
    return _tokenizer_problem(meta["tokenizer"], meta["vocab_size"])


def _tokenizer_problem(desc, vocab_size):
    # The model is sized by vocab_size and decodes with the tokenizer, so the two must agree.
    if desc["kind"] == "char":
        chars = desc.get("chars")
        if not isinstance(chars, str) or not chars or len(set(chars)) != len(chars):
            return "the char tokenizer needs 'chars', a string of distinct characters"
        size = len(chars)
    elif desc["kind"] == "gpt2":
        from data.tokenizer import GPT2_VOCAB_SIZE

        size = GPT2_VOCAB_SIZE
    elif desc["kind"] == "bpe":
        from data.tokenizer import TokenizerError, get_tokenizer

        try:
            size = get_tokenizer(desc).vocab_size
        except TokenizerError as e:
            return str(e)
    else:
        return f"unknown tokenizer kind {desc['kind']!r}"
    if size != vocab_size:
        return f"vocab_size is {vocab_size} but the tokenizer has {size} tokens"
    return None


def load_tokens(dataset_dir, split):
    """The split's token ids, read-only: a uint16 memmap of split.bin, or the
    split's shards as one ShardedTokens."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    meta = load_meta(dataset_dir)
    if "shards" in meta:
        from data.shards import ShardedTokens, check_shards

        return ShardedTokens(
            check_shards(dataset_dir, meta, split, _again(dataset_dir)), meta["dtype"]
        )
    path = os.path.join(dataset_dir, f"{split}.bin")
    if not os.path.exists(path):
        raise DataError(f"{path} is missing; {_again(dataset_dir)}")
    size = os.path.getsize(path)
    expected = meta[f"{split}_tokens"]
    if size % 2:
        raise DataError(
            f"{path} has an odd number of bytes ({size}), so it is truncated; {_again(dataset_dir)}"
        )
    if size // 2 != expected:
        raise DataError(
            f"{path} holds {size // 2} tokens but meta.json says {expected}; {_again(dataset_dir)}"
        )
    if size == 0:
        raise DataError(f"{path} is empty; {_again(dataset_dir)}")
    return np.memmap(path, dtype=np.uint16, mode="r")


def ensure_dataset(name, data_root=None, input_path=None):
    """The folder of a prepared dataset, preparing one of DATASETS if needed."""
    data_root = data_root or DATA_ROOT
    dataset_dir = os.path.join(data_root, name)
    if all(os.path.exists(os.path.join(dataset_dir, f)) for f in FILES):
        return dataset_dir
    # a sharded dataset: meta.json is written last, after every shard
    if os.path.exists(os.path.join(dataset_dir, "meta.json")) and glob.glob(
        os.path.join(dataset_dir, "train_*.bin")
    ):
        return dataset_dir
    if name not in DATASETS:
        # a typo's likely meaning, the datasets prepared in data_root and those prepared
        # on first use, where else it may be, and the command that prepares it
        import difflib  # here only: an unknown dataset

        prepared = []
        if os.path.isdir(data_root):
            for folder in sorted(os.listdir(data_root)):
                meta = os.path.join(data_root, folder, "meta.json")
                if folder not in DATASETS and os.path.isfile(meta):
                    prepared.append(folder)
        close = difflib.get_close_matches(name, prepared + list(DATASETS), n=1)
        meant = f"did you mean {close[0]!r}? " if close else ""
        there = f"prepared in {data_root}: {', '.join(prepared)}; " if prepared else ""
        raise DataError(
            f"unknown dataset {name!r} (no prepared files in {dataset_dir}); {meant}{there}"
            f"prepared on first use: {', '.join(DATASETS)}; one prepared in another folder "
            f"needs its --data_root; prepare your own corpus with: {_prepare_hint(dataset_dir)}"
        )
    print(f"preparing {name} in {dataset_dir} (first use)")
    # the preparers load here, on first use: a prepared dataset needs none of them
    if name == "induction":
        from data.induction import prepare_induction

        prepare_induction(data_root, input_path)
    else:
        from data.tiny_shakespeare import prepare_shakespeare

        kind = "char" if name == "shakespeare_char" else "gpt2"
        prepare_shakespeare(kind, data_root, input_path)
    return dataset_dir


# -----------------------------------------------------------------------------
# Batches

SMALL_DATASET = 100_000_000  # tokens; a smaller split lives on the device as int64


def load_split(dataset_dir, split, block_size, vocab_size, device):
    """A small split becomes one int64 tensor on the device, so a batch is one
    gather there; a large one stays a memmap, read batch by batch, and a
    sharded one stays its shards' memmaps, never held whole."""
    tokens = load_tokens(dataset_dir, split)
    if len(tokens) < block_size + 1:
        raise ValueError(
            f"the {split} split of {dataset_dir} has {len(tokens)} tokens, fewer than "
            f"block_size + 1 = {block_size + 1}; use a smaller --block_size"
        )
    if not isinstance(tokens, np.memmap):
        return tokens  # a sharded split: its shards' memmaps (data/shards.py)
    if len(tokens) < SMALL_DATASET:
        # a damaged file can hold ids past the vocabulary, which would crash a
        # later step; a large split is not scanned (that would read all of it)
        top = int(tokens.max())
        if top >= vocab_size:
            raise DataError(
                f"{os.path.join(dataset_dir, split + '.bin')} holds token id {top}, outside "
                f"the vocabulary of {vocab_size}; {_again(dataset_dir)}"
            )
        return torch.from_numpy(tokens.astype(np.int64)).to(device)
    return tokens


def to_device(t, device):
    if device.type == "cuda":  # from pinned memory the copy does not stall the host
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def get_batch(data, starts, length, device):
    """x, y (N, length) for the windows starting at starts (N,); y is x shifted by one.
    The shards of a split are one stream, so a window may run from one into the next."""
    if isinstance(data, torch.Tensor):
        rows = to_device(starts, device)[:, None] + torch.arange(length + 1, device=device)
        chunk = data[rows]  # (N, length + 1)
    else:
        rows = starts.numpy()[:, None] + np.arange(length + 1)
        chunk = to_device(torch.from_numpy(data[rows].astype(np.int64)), device)
    return chunk[:, :-1], chunk[:, 1:]


def step_batches(data, gen, cfg, rank, world, device):
    """This process's micro-batches of one iter, x and y (accum / world, B, T).

    Every process draws the windows of all micro-steps from the same generator
    and takes micro-steps rank, rank + world, ...: the update is then the same
    whatever the number of processes."""
    n, B, T = cfg.gradient_accumulation_steps, cfg.batch_size, cfg.block_size
    starts = torch.randint(len(data) - T, (n, B), generator=gen)[rank::world]  # (n / world, B)
    x, y = get_batch(data, starts.reshape(-1), T, device)
    return x.reshape(-1, B, T), y.reshape(-1, B, T)
