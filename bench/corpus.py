"""
Preparing a corpus and reading its shards, against peers measured in the same run.

    python -m bench.corpus                 # every part; figures for docs/benchmarks.md
    python -m bench.corpus --parts=speed --mb=20
    python -m bench.corpus --parts=memory --memory_mb=250,1000

speed   tokens/s of data/prepare.py with 1 and 2 processes, of bare tiktoken
        (encode_ordinary_batch, 1 and 2 threads) over the same documents held
        in memory, and of nanoGPT's OpenWebText method (data/openwebtext/
        prepare.py: `datasets` map with num_proc, then one memmap write of
        each split), all on one local parquet corpus.
memory  the peak RSS of every process of `data/prepare.py --num_proc 2` on
        corpora of the sizes given, in MB of text.
step    a training step whose batches come from shards, against the same
        tokens read from one file.

Corpora are made in /tmp (--tmp) from tiny Shakespeare's paragraphs, shuffled
into documents of 1 to 20 paragraphs, and deleted afterwards. Ratios measured
in one run are what count; the machine's load average is printed with them.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import os
import shutil
import subprocess
import sys
import tempfile
import time
from statistics import median

import numpy as np
import torch

from bench import common
from data.prepare import DataError, find_shakespeare, shakespeare_dir
from model import GPT, GPTConfig
from support.batches import get_batch
from support.configurator import ConfigError, describe, parse_args
from support.corpus import prepare_corpus
from support.shards import ShardedTokens
from support.tokenizer import gpt2_encoding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# where the tests also look: a shared folder beside the checkout
BESIDE = os.path.join(os.path.dirname(ROOT), "shared", "data", "tinyshakespeare", "input.txt")
DEFAULTS = dict(
    parts="speed,memory,step",  # which measurements, comma-separated
    mb=20,  # size of the speed corpus, MB of text
    memory_mb="250,1000",  # sizes of the memory corpora, MB of text, comma-separated
    tmp=tempfile.gettempdir(),  # where the corpora are made (and deleted afterwards)
)


# ---------------------------------------------------------------- the corpus


def make_parquet_corpus(path, megabytes, seed=0):
    """A parquet file of about `megabytes` MB of text: tiny Shakespeare's
    paragraphs shuffled into documents, written a table at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = find_shakespeare(shakespeare_dir("char"), also=[BESIDE])
    with open(source, encoding="utf-8") as f:
        paragraphs = f.read().split("\n\n")
    rng = np.random.default_rng(seed)
    target = megabytes * 1_000_000
    written = 0
    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        while written < target:
            docs = []
            size = 0
            while size < 10_000_000 and written + size < target:
                picks = rng.integers(0, len(paragraphs), rng.integers(1, 21))
                doc = "\n\n".join(paragraphs[i] for i in picks)
                docs.append(doc)
                size += len(doc)
            writer.write_table(pa.table({"text": docs}, schema=schema), row_group_size=2000)
            written += size
    return path


def read_documents(path):
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["text"]).column("text").to_pylist()


# ---------------------------------------------------------------- speed


def ours(path, out, num_proc):
    """tokens/s of this project's preparation, reading and writing included."""
    start = time.perf_counter()
    meta = prepare_corpus(path, out, "gpt2", num_proc=num_proc, val_docs=10)
    seconds = time.perf_counter() - start
    return (meta["train_tokens"] + meta["val_tokens"]) / seconds


def bare_tiktoken(docs, threads):
    """tokens/s of tiktoken's batch encoding alone, the documents already in memory."""
    enc = gpt2_encoding()
    start = time.perf_counter()
    ids = enc.encode_ordinary_batch(docs, num_threads=threads)
    seconds = time.perf_counter() - start
    return (sum(map(len, ids)) + len(ids)) / seconds


def nanogpt_method(path, out, num_proc):
    """tokens/s of nanoGPT's data/openwebtext/prepare.py, re-created: `datasets`
    loads the parquet into its arrow cache, splits off a small val set, maps an
    encode_ordinary + end-of-text tokenizer over the documents with num_proc
    processes, then writes each split into one uint16 memmap, batch by batch."""
    import datasets

    cache = os.path.join(out, "cache")
    start = time.perf_counter()
    table = datasets.load_dataset("parquet", data_files=[path], split="train", cache_dir=cache)
    splits = table.train_test_split(test_size=0.0005, seed=2357, shuffle=True)
    enc = gpt2_encoding()

    def encode(example):
        ids = enc.encode_ordinary(example["text"]) + [enc.eot_token]
        return {"ids": ids, "len": len(ids)}

    tokens = 0
    for name, split in splits.items():
        encoded = split.map(encode, remove_columns=["text"], num_proc=num_proc)
        total = int(np.sum(encoded["len"], dtype=np.uint64))
        out_file = np.memmap(
            os.path.join(out, f"{name}.bin"), dtype=np.uint16, mode="w+", shape=(total,)
        )
        at = 0
        pieces = min(1024, len(encoded))
        for i in range(pieces):
            part = encoded.shard(num_shards=pieces, index=i, contiguous=True).with_format("numpy")
            ids = np.concatenate(part["ids"])
            out_file[at : at + len(ids)] = ids
            at += len(ids)
        out_file.flush()
        tokens += total
    seconds = time.perf_counter() - start
    return tokens / seconds


def bench_speed(tmp, megabytes):
    path = make_parquet_corpus(os.path.join(tmp, "speed.parquet"), megabytes)
    docs = read_documents(path)
    rates = {}
    # interleaved, twice, so a burst of load from elsewhere hits every method alike
    for _ in range(2):
        for name, fn in (
            ("ours, 1 process", lambda: ours(path, os.path.join(tmp, "o1"), 1)),
            ("ours, 2 processes", lambda: ours(path, os.path.join(tmp, "o2"), 2)),
            ("tiktoken batch, 1 thread", lambda: bare_tiktoken(docs, 1)),
            ("tiktoken batch, 2 threads", lambda: bare_tiktoken(docs, 2)),
            ("nanoGPT method, num_proc=2", lambda: nanogpt_method(path, fresh(tmp, "ng"), 2)),
        ):
            rates.setdefault(name, []).append(fn())
    best = {name: max(values) for name, values in rates.items()}
    print(f"\nspeed: {megabytes} MB parquet, {len(docs):,} documents (best of 2, tokens/s)")
    for name, rate in best.items():
        print(f"  {name:30s} {rate:12,.0f}")
    two = best["ours, 2 processes"]
    print(f"  2 processes / 1 process:           {two / best['ours, 1 process']:.2f}x (goal 1.7)")
    print(
        f"  2 processes / tiktoken 2 threads:  {two / best['tiktoken batch, 2 threads']:.2f}x "
        "(goal 1.0)"
    )
    threads = best["tiktoken batch, 2 threads"] / best["tiktoken batch, 1 thread"]
    print(f"  tiktoken 2 threads / 1 thread:     {threads:.2f}x")
    print(
        f"  2 processes / nanoGPT method:      {two / best['nanoGPT method, num_proc=2']:.2f}x "
        "(goal 1.5)"
    )


def fresh(tmp, name):
    folder = os.path.join(tmp, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return folder


# ---------------------------------------------------------------- memory


def peak_rss_mb(pid):
    """VmHWM, the process's peak resident memory so far, in MB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def prepare_peaks(path, tmp):
    """The peak RSS (MB) of the main process and of each worker of data/prepare.py."""
    command = [sys.executable, os.path.join(ROOT, "data", "prepare.py"), path]
    command += ["--tokenizer=gpt2", "--name=mem", f"--data_root={tmp}", "--num_proc=2"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peaks = {}
    while proc.poll() is None:
        for pid in [proc.pid, *children(proc.pid)]:
            rss = peak_rss_mb(pid)
            if rss is not None:
                peaks[pid] = max(peaks.get(pid, 0), rss)
        time.sleep(0.2)
    summary = proc.stdout.read().strip()
    if proc.returncode != 0:
        raise SystemExit(f"data/prepare.py failed on {path}")
    return peaks.pop(proc.pid), sorted(peaks.values()), summary


def bench_memory(tmp, sizes):
    print("\nmemory: data/prepare.py --num_proc 2, peak RSS per process (MB)")
    results = {}
    for megabytes in sizes:
        path = make_parquet_corpus(os.path.join(tmp, f"mem{megabytes}.parquet"), megabytes)
        start = time.perf_counter()
        main, workers, summary = prepare_peaks(path, tmp)
        seconds = time.perf_counter() - start
        os.remove(path)
        shutil.rmtree(os.path.join(tmp, "mem"))
        results[megabytes] = max(main, *workers)
        print(
            f"  {megabytes:5d} MB corpus: main {main:.0f}, workers "
            f"{', '.join(f'{w:.0f}' for w in workers)} ({seconds:.0f} s) | {summary}"
        )
    if len(results) > 1:
        small, large = min(results), max(results)
        ratio = results[large] / results[small]
        print(f"  largest process, {large} MB / {small} MB corpus: {ratio:.2f}x")


# ---------------------------------------------------------------- a training step


def bench_step(tmp, repeats=20):
    """A training step (forward, backward, AdamW) whose batch comes from 8
    shards, against the same tokens from one memory-mapped file."""
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 4096, 8_000_000).astype(np.uint16)
    whole = os.path.join(tmp, "whole.bin")
    stream.tofile(whole)
    paths = []
    for i, part in enumerate(np.array_split(stream, 8)):
        paths.append(os.path.join(tmp, f"train_{i:05d}.bin"))
        part.tofile(paths[-1])
    sources = {
        "one file": np.memmap(whole, dtype=np.uint16, mode="r"),
        "8 shards": ShardedTokens(paths, "uint16"),
    }
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=4096, block_size=256, n_layer=4, n_head=4, n_embd=256))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    B, T = 8, 256

    def step(data):
        starts = torch.randint(len(data) - T, (B,), generator=gen)
        x, y = get_batch(data, starts, T, torch.device("cpu"))
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = {name: [] for name in sources}
    for name, data in sources.items():
        step(data)  # warm up
    for _ in range(repeats):
        for name, data in sources.items():
            start = time.perf_counter()
            step(data)
            times[name].append(time.perf_counter() - start)
    one, shards = median(times["one file"]), median(times["8 shards"])
    print(
        f"\nstep: 4-layer 256-wide GPT, vocab 4096, batch {B} x {T}, median of {repeats}, "
        "interleaved"
    )
    print(f"  one file {1000 * one:.1f} ms, 8 shards {1000 * shards:.1f} ms: {shards / one:.3f}x")
    batch = {}
    for name, data in sources.items():
        starts = torch.randint(len(data) - 1024, (12 * 40,), generator=gen)
        start = time.perf_counter()
        for _ in range(5):
            get_batch(data, starts, 1024, torch.device("cpu"))
        batch[name] = (time.perf_counter() - start) / 5
    print(
        f"  GPT-2 124M's batch read alone (480 x 1024 tokens): one file "
        f"{1000 * batch['one file']:.1f} ms, 8 shards {1000 * batch['8 shards']:.1f} ms"
    )


# ---------------------------------------------------------------- main


def load():
    return open("/proc/loadavg").read().split()[:3]


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\n\noptions (defaults):\n" + describe(DEFAULTS))
        return 0
    try:
        args = parse_args(DEFAULTS, argv, allow_files=False)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(common.cpu_class())
    print(f"load average before: {' '.join(load())}")
    tmp = tempfile.mkdtemp(prefix="bench_corpus_", dir=args["tmp"])
    try:
        parts = args["parts"].split(",")
        if "speed" in parts:
            bench_speed(tmp, args["mb"])
        if "memory" in parts:
            bench_memory(tmp, [int(s) for s in args["memory_mb"].split(",")])
        if "step" in parts:
            bench_step(tmp)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nload average after: {' '.join(load())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
