"""
Token shards: a large split as many files, written by preparation and read by training.

A sharded dataset folder holds train_00000.bin, ..., val_00000.bin, ... and
meta.json, which lists every shard with its token count. meta.json is written
last, so a folder without it is an unfinished preparation, never a dataset.
Training reads the shards of a split as one stream of tokens: the shards laid
end to end, each memory-mapped, none of them read whole.

    dtype_for       the smallest unsigned dtype that holds a vocabulary
    ShardWriter     a split's tokens into shards of a fixed size, each complete or absent
    shards_problem  meta.json's list of shards checked
    check_shards    the shards meta.json lists are all there, whole
    ShardedTokens   the shards of a split read as one array of tokens
"""

import contextlib
import os

import numpy as np

from data import DataError

SPLITS = ("train", "val")
SHARD_TOKENS = 100_000_000  # 200 MB per uint16 shard, as build-nanogpt's FineWeb shards


def dtype_for(vocab_size):
    """uint16 while every token id fits in it, uint32 beyond."""
    if vocab_size <= 2**16:
        return "uint16"
    if vocab_size <= 2**32:
        return "uint32"
    raise DataError(f"a vocabulary of {vocab_size} tokens does not fit in uint32 token files")


def shard_name(split, index):
    return f"{split}_{index:05d}.bin"


def is_shard_file(name):
    """A shard of either split, or the temporary file of one being written."""
    stem = name.split(".")[0]
    split, _, number = stem.partition("_")
    return split in SPLITS and number.isdigit() and name.endswith((".bin", ".tmp"))


class ShardWriter:
    """Writes one split's tokens into shards of shard_tokens tokens (the last one
    shorter). A shard is written under a temporary name and renamed once full, so
    a shard file on disk is always complete."""

    def __init__(self, folder, split, dtype, shard_tokens=SHARD_TOKENS):
        self.folder = folder
        self.split = split
        self.dtype = np.dtype(dtype)
        self.shard_tokens = shard_tokens
        self.shards = []  # [{"file": name, "tokens": count}] of the finished shards
        self.file = None
        self.count = 0  # tokens in the open shard

    def write(self, tokens):
        """Append tokens (a 1-D integer array), opening and closing shards as they fill."""
        tokens = np.asarray(tokens, dtype=self.dtype)
        while len(tokens):
            if self.file is None:
                self._open()
            room = self.shard_tokens - self.count
            try:
                # file.write: ndarray.tofile opens a second handle on the file at each call
                self.file.write(np.ascontiguousarray(tokens[:room]))
            except OSError as e:
                # a full disk: the file it was for, and the reason (a write names neither)
                raise DataError(f"cannot write {self._path()} ({e.strerror or e})") from None
            self.count += min(room, len(tokens))
            tokens = tokens[room:]
            if self.count == self.shard_tokens:
                self._close()

    def discard(self):
        """Close the open shard without keeping it (a failed preparation; its .tmp file
        is removed with the rest). Closing flushes, which a full disk refuses again."""
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None

    def finish(self):
        """Close the last shard; returns the list of shards with their token counts."""
        if self.file is not None:
            self._close()
        return self.shards

    @property
    def tokens(self):
        return sum(shard["tokens"] for shard in self.shards) + self.count

    def _path(self):
        return os.path.join(self.folder, shard_name(self.split, len(self.shards)))

    def _open(self):
        self.file = open(self._path() + ".tmp", "wb")
        self.count = 0

    def _close(self):
        path = self._path()
        try:
            self.file.close()  # the last of the shard's bytes, flushed
        except OSError as e:
            raise DataError(f"cannot write {path} ({e.strerror or e})") from None
        os.replace(path + ".tmp", path)
        self.shards.append({"file": os.path.basename(path), "tokens": self.count})
        self.file = None
        self.count = 0


def shards_problem(meta):
    """What is wrong with meta.json's list of shards, or None."""
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


def check_shards(folder, meta, split, again):
    """The paths of a split's shards, after checking each is on disk with the
    size meta.json gives it; `again` says how to prepare the dataset again."""
    shards = meta["shards"][split]
    if not shards:
        raise DataError(f"{folder} has no {split} shards; {again}")
    itemsize = np.dtype(meta["dtype"]).itemsize
    paths = []
    for shard in shards:
        path = os.path.join(folder, shard["file"])
        if not os.path.isfile(path):
            raise DataError(f"{path} is missing; {again}")
        size = os.path.getsize(path)
        if size != shard["tokens"] * itemsize:
            raise DataError(
                f"{path} holds {size} bytes but meta.json says {shard['tokens']} "
                f"{meta['dtype']} tokens, so it is cut short or damaged; {again}"
            )
        paths.append(path)
    return paths


class ShardedTokens:
    """The shards of a split as one 1-D array of tokens, for the batch sampler:
    len() is the total, and indexing with an array of positions gathers them
    from the shards that hold them. Each shard is one memory map, so only the
    tokens a batch touches are read."""

    def __init__(self, paths, dtype):
        self.dtype = np.dtype(dtype)
        self.shards = [np.memmap(path, dtype=self.dtype, mode="r") for path in paths]
        sizes = [len(shard) for shard in self.shards]
        # the stream position where each shard starts, and the end of the last
        self.starts = np.cumsum([0] + sizes)

    def __len__(self):
        return int(self.starts[-1])

    def __getitem__(self, positions):
        """The tokens at an array of stream positions, in its shape. A row of
        positions (a batch's window) that one shard holds is read from it in one
        gather; a row that runs across a shard's end, position by position."""
        positions = np.asarray(positions)
        rows = positions.reshape(-1, positions.shape[-1] if positions.ndim else 1)
        first = np.searchsorted(self.starts, rows.min(axis=1), side="right") - 1
        last = np.searchsorted(self.starts, rows.max(axis=1), side="right") - 1
        out = np.empty(rows.shape, dtype=self.dtype)
        for i in np.unique(first):
            here = (first == i) & (last == i)
            out[here] = self.shards[i][rows[here] - self.starts[i]]
        crossing = first != last
        if crossing.any():
            out[crossing] = self._gather(rows[crossing])
        return out.reshape(positions.shape)

    def _gather(self, positions):
        shard_of = np.searchsorted(self.starts, positions, side="right") - 1
        out = np.empty(positions.shape, dtype=self.dtype)
        for i in np.unique(shard_of):
            here = shard_of == i
            out[here] = self.shards[i][positions[here] - self.starts[i]]
        return out
