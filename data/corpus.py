"""
A corpus of documents, from local files or the Hugging Face hub, tokenized on
every core into token shards (shards.py) in bounded memory.

    prepare_corpus  tokenize a source into a sharded dataset folder

Local files are cut into read tasks of about 1 MB of text (sources.py). Each
of --num_proc tokenizer processes claims the next task in the plan's order
as soon as it is free, reads it from the files itself, tokenizes it, and
hands its tokens back. The main process takes the tasks' tokens in the
plan's order and only writes them, so the bytes are the same whatever the
number of processes; a process may claim a task only while fewer than two
per process are waiting to be written, so none holds more than a few. A hub
dataset can only be read from its start, by one process: the main process
reads it and hands batches of documents to a pool of tokenizer processes.
"""

import collections
import contextlib
import json
import math
import multiprocessing
import os
import queue
import time
import traceback

import numpy as np
from tqdm import tqdm

from data import DataError
from data.shards import SHARD_TOKENS, SPLITS, ShardWriter, dtype_for, is_shard_file
from data.sources import Stream, TaskReader, iter_documents, open_source
from data.tokenizer import TokenizerError, bpe_vocab_size, get_tokenizer, train_bpe

BATCH_CHARS = 1 << 20  # about 1 MB of a stream's text per tokenizer task
BPE_SAMPLE_CHARS = 100_000_000  # the share of the corpus a bpe:VOCAB tokenizer learns from
WAIT_S = 1.0  # how often a process blocked on a queue looks whether the other end is gone


# ---------------------------------------------------------------- tokenizing


def _start_tokenizer(desc):
    # one process is one core: the BPE library would otherwise start a thread per core
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return get_tokenizer(desc)


def _encode_task(tok, texts):
    """The tokens of a task's documents, each followed by the end-of-text token,
    as one array, and each document's token count (end-of-text included)."""
    docs = tok.encode_documents(texts)
    end = np.array([tok.eot_token])
    pieces = [np.zeros(0, dtype=np.int64)]  # a task can hold no documents
    for doc in docs:
        pieces.append(doc)
        pieces.append(end)
    ids = np.concatenate(pieces).astype(dtype_for(tok.vocab_size))
    return ids, np.array([len(doc) + 1 for doc in docs], dtype=np.int64)


def _context():
    """fork where there is fork: the processes start at once, with the tokenizer
    already built (GPT-2's takes a second to build from its files); else spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


@contextlib.contextmanager
def _tokenized(reading, desc, num_proc):
    """An iterator over (ids, lengths) of _encode_task for each task of a Plan,
    or each batch of a Stream, in order; the processes it starts end with the
    `with` block."""
    if isinstance(reading, Stream):
        with _stream_tokenized(reading, desc, num_proc) as results:
            yield results
    elif num_proc == 1 or len(reading.tasks) <= 1:
        yield _tokenized_here(reading, desc)
    else:
        with _tokenized_by_workers(reading, desc, min(num_proc, len(reading.tasks))) as results:
            yield results


def _tokenized_here(plan, desc):
    tok = _start_tokenizer(desc)
    reader = TaskReader(plan)
    for task in plan.tasks:
        yield _encode_task(tok, reader.read(task))


# ---------------------------------------------------------------- processes that read


def _worker(plan, desc, claims, counter, results):
    """A tokenizer process: it claims the first task of the plan that no
    process has claimed yet, reads it from the files, tokenizes it and puts
    its tokens on the results queue; then the next, until none is left. A
    task is claimed only with one of the `claims`, 2 per process, that the
    main process gives back as it writes each task: no process gets more than
    a few tasks ahead of the writing."""
    parent = os.getppid()
    index = -1
    try:
        tok = _start_tokenizer(desc)
        reader = TaskReader(plan)
        while True:
            _acquire(claims, parent)
            with counter.get_lock():
                index = counter.value
                counter.value += 1
            if index >= len(plan.tasks):
                return
            results.put((index, "tokens", _encode_task(tok, reader.read(plan.tasks[index]))))
    except DataError as e:
        results.put((index, "error", str(e)))
    except KeyboardInterrupt:
        pass  # Ctrl-C reached the whole process group; the main process says so
    except Exception:
        results.put((index, "failed", traceback.format_exc()))


def _acquire(claims, parent):
    """Take a claim, waiting for one, unless the main process is gone."""
    while not claims.acquire(timeout=WAIT_S):
        if os.getppid() != parent:
            # the main process was killed: nobody will write the tokens
            os._exit(1)


def _take(results, processes):
    """The next (index, kind, value) a process put on the results queue. A
    process's puts are flushed before it ends, so one that was killed, or
    all of them ended while the queue is empty, means tokens are missing."""
    while True:
        try:
            return results.get(timeout=WAIT_S)
        except queue.Empty:
            codes = [process.exitcode for process in processes]
            killed = [code for code in codes if code not in (None, 0)]
            if killed or (None not in codes and results.empty()):
                code = killed[0] if killed else 0
                raise DataError(
                    f"a tokenizer process ended without its tokens (exit code {code}: killed, "
                    "or out of memory); run the command again, with a smaller --num_proc"
                ) from None


def _in_order(plan, results, claims, processes):
    """Each task's tokens in the plan's order, whichever process finished them
    first; a claim goes back once the task has been written."""
    finished = {}
    for index in range(len(plan.tasks)):
        while index not in finished:
            done, kind, value = _take(results, processes)
            # an error ends the run when it arrives: it may have come from the
            # tokenizer's start, before the process held a task of its own
            if kind == "error":
                raise DataError(value)
            if kind == "failed":
                raise RuntimeError(f"a tokenizer process failed:\n{value}")
            finished[done] = value
        yield finished.pop(index)
        claims.release()


@contextlib.contextmanager
def _tokenized_by_workers(plan, desc, num_proc):
    context = _context()
    claims = context.Semaphore(2 * num_proc)
    counter = context.Value("q", 0)  # the next task to claim
    results = context.Queue()
    processes = [
        context.Process(target=_worker, args=(plan, desc, claims, counter, results), daemon=True)
        for _ in range(num_proc)
    ]
    for process in processes:
        process.start()
    try:
        yield _in_order(plan, results, claims, processes)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join()


# ---------------------------------------------------------------- one reader, many tokenizers


_pool_tokenizer = None


def _start_pool_worker(desc):
    global _pool_tokenizer
    _pool_tokenizer = _start_tokenizer(desc)


def _encode_in_pool(texts):
    return _encode_task(_pool_tokenizer, texts)


def _stream_tasks(batches):
    """Regroup a stream's batches into tasks of about BATCH_CHARS characters."""
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


@contextlib.contextmanager
def _stream_tokenized(stream, desc, num_proc):
    if num_proc == 1:
        tok = _start_tokenizer(desc)
        yield (_encode_task(tok, task) for task in _stream_tasks(stream.batches))
        return
    pool = _context().Pool(num_proc, initializer=_start_pool_worker, initargs=(desc,))
    with pool:
        yield _pool_results(pool, _stream_tasks(stream.batches), num_proc)


def _pool_results(pool, tasks, num_proc):
    """The pool's results in order, at most 2 tasks per process in flight, so
    memory stays bounded however fast the stream reads."""
    pending = collections.deque()
    for task in tasks:
        pending.append(pool.apply_async(_encode_in_pool, (task,)))
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
    """Write one task's documents to their splits, one write to each; returns
    how many went to val."""
    flags = np.array(
        [is_val(first + i, val_docs, val_fraction) for i in range(len(lengths))], dtype=bool
    )
    if not flags.any():
        writers["train"].write(ids)
        return 0
    in_val = np.repeat(flags, lengths)  # (tokens,) whether each token's document is val
    writers["train"].write(ids[~in_val])
    writers["val"].write(ids[in_val])
    return int(flags.sum())


# ---------------------------------------------------------------- preparing


def _write_splits(reading, tok, num_proc, writers, val_docs, val_fraction):
    """Tokenize every document into the writers, with a progress bar; returns
    the number of documents and how many of them went to val."""
    docs = 0
    val = 0
    start = time.perf_counter()
    # the processes start before the bar's thread does: fork copies no threads
    with (
        _tokenized(reading, tok.describe(), num_proc) as results,
        tqdm(total=reading.documents, unit="doc", unit_scale=True, desc="tokenizing") as bar,
    ):
        for ids, lengths in results:
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
    size = 0
    for text in iter_documents(source, text_column, subset):
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
    if shard_tokens < 1:
        raise DataError(f"--shard_tokens must be 1 or more, got {shard_tokens}")
    reading = open_source(source, text_column, subset)
    os.makedirs(folder, exist_ok=True)
    clear_dataset(folder)
    tok = build_corpus_tokenizer(kind, folder, source, text_column, subset)
    dtype = dtype_for(tok.vocab_size)
    writers = {split: ShardWriter(folder, split, dtype, shard_tokens) for split in SPLITS}
    try:
        docs, val = _write_splits(reading, tok, num_proc, writers, val_docs, val_fraction)
    except BaseException:
        # a failure here leaves no shards behind; a kill leaves no meta.json
        for writer in writers.values():
            writer.discard()
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
