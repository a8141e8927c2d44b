"""
A corpus of documents, from local files or the Hugging Face hub, streamed
through tokenizer processes into token shards (shards.py) in bounded memory.

    open_source     a source's documents as batches of texts, and how many if known
    prepare_corpus  tokenize a source into a sharded dataset folder

The `datasets` library reads the sources in streaming mode, local files and
hub ids alike: a folder or glob of .jsonl or .txt files (one document per
.txt file), or a hub id such as HuggingFaceFW/fineweb-edu. Local parquet is
read a row group at a time with pyarrow itself (see _parquet_texts).
Documents are read in batches, tokenized by --num_proc worker processes, and
written back in their order, so the bytes are the same whatever the number
of workers.
"""

import collections
import glob
import json
import math
import multiprocessing
import os
import time

import numpy as np
from tqdm import tqdm

from support.shards import (
    SHARD_TOKENS,
    SPLITS,
    DataError,
    ShardWriter,
    dtype_for,
    is_shard_file,
)
from support.tokenizer import TokenizerError, bpe_vocab_size, get_tokenizer, train_bpe

# Arrow's default allocator (jemalloc) keeps pages of the row groups already read, more
# of them the longer the read: the main process grew from 179 MB for a 250 MB corpus to
# 225 MB for 1 GB, where the C library's malloc stays flat, 154 and 156 MB (python -m
# bench.corpus --parts=memory). pyarrow reads this when it loads, so it is set before
# anything here imports it; a value the user set wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
READ_ROWS = 1024  # documents per read
BATCH_CHARS = 1 << 20  # about 1 MB of text per tokenizer task
BPE_SAMPLE_CHARS = 100_000_000  # the share of the corpus a bpe:VOCAB tokenizer learns from


# ---------------------------------------------------------------- reading


def local_files(source):
    """The files of a local source (a file, a folder, a glob), or None for a hub id."""
    if os.path.isdir(source):
        names = sorted(glob.glob(os.path.join(source, "**", "*"), recursive=True))
        files = [name for name in names if os.path.splitext(name)[1] in BUILDERS]
        if not files:
            kinds = ", ".join(BUILDERS)
            raise DataError(f"{source} holds no {kinds} files; pass a folder of documents")
        return files
    if glob.has_magic(source):
        files = sorted(glob.glob(source, recursive=True))
        if not files:
            raise DataError(f"no files match {source}")
        return files
    if os.path.exists(source):
        return [source]
    if source.count("/") != 1 or source.startswith((".", "/")):
        raise DataError(f"{source} does not exist (nor is it a hub id such as owner/name)")
    return None


def _builder(files):
    kinds = {os.path.splitext(name)[1] for name in files}
    builders = {BUILDERS.get(kind) for kind in kinds}
    if None in builders or len(builders) != 1:
        raise DataError(
            f"the source mixes or holds unknown file kinds ({', '.join(sorted(kinds))}); "
            "use only .jsonl, only .parquet or only .txt files"
        )
    return builders.pop()


def _parquet_texts(files, source, text_column):
    """Local parquet files read row group by row group, on this thread.
    `datasets` reads parquet ahead of its reader on background threads, so a
    reader slower than the disk (a tokenizer) would hold more of the file the
    bigger it is; this reader holds one row group."""
    import pyarrow.parquet as pq

    for name in files:
        try:
            parquet = pq.ParquetFile(name)
        except (OSError, ValueError) as e:
            raise DataError(f"cannot read {name} ({str(e).splitlines()[0]})") from None
        columns = parquet.schema_arrow.names
        if text_column not in columns:
            raise DataError(
                f"{source} has no column {text_column!r} (its columns: {', '.join(columns)}); "
                "pass --text_column NAME"
            )
        # one row group at a time: iter_batches holds more of a file the bigger it is
        for group in range(parquet.num_row_groups):
            column = parquet.read_row_group(group, columns=[text_column], use_threads=False)[0]
            for start in range(0, len(column), READ_ROWS):
                texts = column.slice(start, READ_ROWS).to_pylist()
                if not all(isinstance(text, str) for text in texts):
                    raise DataError(f"{source}: some {text_column!r} values are not text")
                yield texts


def _parquet_rows(files):
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(name).metadata.num_rows for name in files)


def open_source(source, text_column="text", subset=None):
    """(batches, total): an iterator over lists of document texts, in the
    source's order, and the number of documents where it is known (else None)."""
    files = local_files(source)
    if files is not None and _builder(files) == "parquet":
        return _parquet_texts(files, source, text_column), _parquet_rows(files)
    import datasets  # here only: a slow import that only preparation needs

    datasets.disable_progress_bars()
    total = None
    try:
        if files is None:
            stream = datasets.load_dataset(source, name=subset, split="train", streaming=True)
            info = stream.info.splits
            total = info["train"].num_examples if info and "train" in info else None
        else:
            builder = _builder(files)
            options = {"sample_by": "document"} if builder == "text" else {}
            stream = datasets.load_dataset(
                builder, data_files=files, split="train", streaming=True, **options
            )
    except ConnectionError:
        raise DataError(
            f"cannot reach the Hugging Face hub for {source}; connect to the internet, "
            "or download its files and pass their folder"
        ) from None
    except StopIteration:  # `datasets` reads the first rows of a json file to learn its columns
        raise DataError(f"{source} holds no documents") from None
    except (ValueError, OSError) as e:
        raise DataError(f"cannot read {source} ({str(e).splitlines()[0]})") from None
    columns = stream.column_names
    if columns is not None and text_column not in columns:
        raise DataError(
            f"{source} has no column {text_column!r} (its columns: {', '.join(columns)}); "
            "pass --text_column NAME"
        )
    return _texts(stream, source, text_column), total


def _texts(stream, source, text_column):
    """The texts of a `datasets` stream, a batch of READ_ROWS documents at a time."""
    try:
        for rows in stream.select_columns([text_column]).iter(batch_size=READ_ROWS):
            texts = rows[text_column]
            if not all(isinstance(text, str) for text in texts):
                raise DataError(f"{source}: some {text_column!r} values are not text")
            yield texts
    except (KeyError, ValueError) as e:
        # json files only say which columns they have once read
        if text_column in str(e) or isinstance(e, KeyError):
            raise DataError(
                f"{source} has no column {text_column!r}; pass --text_column NAME"
            ) from None
        raise DataError(f"cannot read {source} ({str(e).splitlines()[0]})") from None


def _task_batches(batches):
    """Regroup the read batches into tasks of about BATCH_CHARS characters."""
    task = []
    size = 0
    for texts in batches:
        for text in texts:
            task.append(text)
            size += len(text)
            if size >= BATCH_CHARS:
                yield task
                task = []
                size = 0
    if task:
        yield task


# ---------------------------------------------------------------- tokenizing


_worker_tokenizer = None


def _start_worker(desc):
    global _worker_tokenizer
    # one worker is one core: the BPE library would otherwise start a thread per core
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = get_tokenizer(desc)


def _encode_task(texts):
    """The tokens of a task's documents, each followed by the end-of-text token,
    as one array, and each document's token count (end-of-text included)."""
    tok = _worker_tokenizer
    docs = tok.encode_documents(texts)
    end = np.array([tok.eot_token])
    pieces = []
    for doc in docs:
        pieces.append(doc)
        pieces.append(end)
    ids = np.concatenate(pieces).astype(dtype_for(tok.vocab_size))
    return ids, [len(doc) + 1 for doc in docs]


def _encoded(tasks, desc, num_proc):
    """The results of _encode_task for each task, in order. With workers, at
    most 2 tasks per worker are in flight, so memory stays bounded however
    fast the source reads."""
    if num_proc == 1:
        _start_worker(desc)
        for task in tasks:
            yield _encode_task(task)
        return
    # fork: the workers start at once, with the tokenizer already built (GPT-2's
    # takes a second to build from its files); spawn where there is no fork
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(num_proc, initializer=_start_worker, initargs=(desc,)) as pool:
        pending = collections.deque()
        for task in tasks:
            pending.append(pool.apply_async(_encode_task, (task,)))
            if len(pending) >= 2 * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ---------------------------------------------------------------- the split


def is_val(index, val_docs, val_fraction):
    """Whether document `index` goes to val: the first val_docs documents, or
    else one document in every 1 / val_fraction, spread evenly from the first
    (so even a corpus of two documents has a val split)."""
    if val_docs is not None:
        return index < val_docs
    return math.floor(index * val_fraction) > math.floor((index - 1) * val_fraction)


def _write_task(writers, ids, lengths, first, val_docs, val_fraction):
    """Write one task's documents to their splits; returns how many went to val."""
    flags = [is_val(first + i, val_docs, val_fraction) for i in range(len(lengths))]
    if not any(flags):
        writers["train"].write(ids)
        return 0
    ends = np.cumsum(lengths)
    for flag, start, end in zip(flags, ends - lengths, ends):
        writers["val" if flag else "train"].write(ids[start:end])
    return sum(flags)


# ---------------------------------------------------------------- preparing


def _write_splits(batches, total, tok, num_proc, writers, val_docs, val_fraction):
    """Tokenize every document into the writers, with a progress bar; returns
    the number of documents and how many of them went to val."""
    docs = 0
    val = 0
    start = time.perf_counter()
    bar = tqdm(total=total, unit="doc", unit_scale=True, desc="tokenizing")
    with bar:
        for ids, lengths in _encoded(_task_batches(batches), tok.describe(), num_proc):
            val += _write_task(writers, ids, lengths, docs, val_docs, val_fraction)
            docs += len(lengths)
            tokens = writers["train"].tokens + writers["val"].tokens
            rate = tokens / (time.perf_counter() - start)
            bar.update(len(lengths))
            bar.set_postfix_str(f"{tokens:,} tokens, {rate:,.0f} tokens/s")
    return docs, val


def clear_dataset(folder):
    """Remove what an earlier or unfinished preparation left, meta.json first,
    so that nothing in the folder reads as a finished dataset meanwhile."""
    for name in ("meta.json", "tokenizer.json", "train.bin", "val.bin"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            os.remove(path)
    for name in os.listdir(folder):
        if is_shard_file(name) or name.endswith(".tmp"):
            os.remove(os.path.join(folder, name))


def _write_atomic(path, text):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _bpe_sample(source, text_column, subset):
    """The first BPE_SAMPLE_CHARS characters of the corpus, document by document."""
    batches, _ = open_source(source, text_column, subset)
    size = 0
    for texts in batches:
        for text in texts:
            yield text
            size += len(text)
            if size >= BPE_SAMPLE_CHARS:
                return


def build_corpus_tokenizer(kind, folder, source, text_column, subset):
    """The tokenizer for a corpus: GPT-2's, or a BPE trained on the corpus and
    saved to folder/tokenizer.json."""
    if kind == "gpt2":
        return get_tokenizer({"kind": "gpt2"})
    try:
        vocab_size = bpe_vocab_size(kind)
        if vocab_size is None:
            raise DataError(
                f"--tokenizer {kind} needs the whole text in memory; for a corpus of "
                "documents use --tokenizer gpt2 or bpe:VOCAB"
            )
        dtype_for(vocab_size)
        tok = train_bpe(_bpe_sample(source, text_column, subset), vocab_size)
    except TokenizerError as e:
        raise DataError(str(e)) from None
    _write_atomic(os.path.join(folder, "tokenizer.json"), tok.json)
    return tok


def prepare_corpus(
    source,
    folder,
    kind="gpt2",
    num_proc=None,
    val_docs=None,
    val_fraction=0.01,
    text_column="text",
    subset=None,
    shard_tokens=SHARD_TOKENS,
):
    """Tokenize a source's documents into folder/{train,val}_NNNNN.bin and
    meta.json (written last); returns the meta dict. Run again after a crash,
    it starts over and writes the same bytes."""
    num_proc = os.cpu_count() if num_proc is None else num_proc
    if num_proc < 1:
        raise DataError(f"--num_proc must be 1 or more, got {num_proc}")
    if val_docs is None and not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
    if val_docs is not None and val_docs < 1:
        raise DataError(f"--val_docs must be 1 or more, got {val_docs}")
    batches, total = open_source(source, text_column, subset)
    os.makedirs(folder, exist_ok=True)
    clear_dataset(folder)
    tok = build_corpus_tokenizer(kind, folder, source, text_column, subset)
    dtype = dtype_for(tok.vocab_size)
    writers = {split: ShardWriter(folder, split, dtype, shard_tokens) for split in SPLITS}
    try:
        docs, val = _write_splits(batches, total, tok, num_proc, writers, val_docs, val_fraction)
    except BaseException:
        # a failure here leaves no shards behind; a kill leaves no meta.json
        for writer in writers.values():
            writer.finish()
        clear_dataset(folder)
        raise
    shards = {split: writers[split].finish() for split in SPLITS}
    if docs == 0:
        clear_dataset(folder)
        raise DataError(f"{source} holds no documents")
    if not shards["train"] or not shards["val"]:
        clear_dataset(folder)
        raise DataError(
            f"{source} has {docs} documents: too few to split whole documents into "
            "train and val; add documents or change --val_docs / --val_fraction"
        )
    desc = tok.describe()
    if desc["kind"] == "bpe":
        desc = {"kind": "bpe", "file": "tokenizer.json"}
    meta = {
        "tokenizer": desc,
        "vocab_size": tok.vocab_size,
        "dtype": dtype,
        "eot_token": tok.eot_token,
        "train_tokens": writers["train"].tokens,
        "val_tokens": writers["val"].tokens,
        "documents": {"train": docs - val, "val": val},
        "shards": shards,
        "source": source,
    }
    _write_atomic(os.path.join(folder, "meta.json"), json.dumps(meta, indent=2) + "\n")
    return meta
