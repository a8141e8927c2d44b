"""Corpora of documents into token shards (data/prepare.py, data/corpus.py,
data/shards.py), read back by training (data/dataset.py), and the
bpe:VOCAB tokenizer; on jsonl, parquet and txt files the tests write themselves."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import train
from data import DataError, sources
from data.corpus import is_val, prepare_corpus
from data.dataset import ensure_dataset, get_batch, load_meta, load_split, load_tokens, step_batches
from data.shards import ShardedTokens, ShardWriter, dtype_for
from data.text import prepare_text
from data.tokenizer import END_OF_TEXT, get_tokenizer, gpt2_encoding, train_bpe
from support.loading import load_checkpoint
from support.run_log import read_evaluations
from support.settings import Settings

REPO = os.path.dirname(os.path.abspath(train.__file__))


@pytest.fixture(scope="module")
def documents(corpus_path):
    """Tiny Shakespeare's paragraphs as documents, plus a few that try the edges:
    a literal end-of-text marker, non-ASCII text, an empty document."""
    with open(corpus_path, encoding="utf-8") as f:
        paragraphs = f.read().split("\n\n")
    extra = [f"a literal {END_OF_TEXT} stays text", "Grüße, 日本語 ✓", ""]
    return paragraphs[:1500] + extra + paragraphs[1500:3000]


def write_jsonl(path, docs, column="text"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"id": i, column: doc}) + "\n")


def write_parquet(folder, docs, files=3, column="text"):
    """docs spread over several parquet files, named so they sort in order."""
    os.makedirs(folder, exist_ok=True)
    for k, part in enumerate(np.array_split(np.arange(len(docs)), files)):
        table = pa.table({column: [docs[i] for i in part], "n": list(map(int, part))})
        pq.write_table(table, os.path.join(folder, f"part_{k:02d}.parquet"), row_group_size=200)


def shard_bytes(folder):
    """{file name: bytes} of every shard, and meta.json."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".bin") or n == "meta.json")
    return {name: open(os.path.join(folder, name), "rb").read() for name in names}


def split_bytes(folder):
    """{split: the bytes of its shards, one after another}."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(".bin"))
    return {
        split: b"".join(
            open(os.path.join(folder, n), "rb").read() for n in names if n.startswith(split)
        )
        for split in ("train", "val")
    }


def run_prepare(*args, env=None):
    return subprocess.run(
        [sys.executable, "data/prepare.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_error(result, *words, code=1):
    """The one error line of a run that failed (exit 1), or of a bad option (code=2)."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- the tokens


def test_tokens_are_tiktoken_of_each_document_plus_end_of_text(tmp_path, documents):
    write_parquet(str(tmp_path / "src"), documents)
    folder = str(tmp_path / "out")
    meta = prepare_corpus(
        str(tmp_path / "src"), folder, "gpt2", num_proc=1, val_fraction=0.05, shard_tokens=30_000
    )
    enc = gpt2_encoding()  # tiktoken itself
    expected = {"train": [], "val": []}
    for i, doc in enumerate(documents):
        split = "val" if is_val(i, None, 0.05) else "train"
        expected[split] += enc.encode_ordinary(doc) + [enc.eot_token]
    val_docs = sum(is_val(i, None, 0.05) for i in range(len(documents)))
    assert val_docs == 151  # documents 0, 20, ..., 3000
    assert meta["documents"] == {"train": len(documents) - val_docs, "val": val_docs}
    assert meta["dtype"] == "uint16" and meta["eot_token"] == 50256
    assert len(meta["shards"]["train"]) > 3  # the count below spans shard boundaries
    for split in ("train", "val"):
        tokens = load_tokens(folder, split)
        assert isinstance(tokens, ShardedTokens)
        assert len(tokens) == meta[f"{split}_tokens"] == len(expected[split])
        assert tokens[np.arange(len(tokens))].tolist() == expected[split]


def test_output_is_the_same_for_one_two_and_three_processes(tmp_path, documents):
    write_jsonl(str(tmp_path / "src" / "docs.jsonl"), documents)
    outputs = []
    for n in (1, 2, 3):
        result = run_prepare(
            str(tmp_path / "src"),
            "--tokenizer=gpt2",
            f"--name=n{n}",
            f"--data_root={tmp_path}",
            f"--num_proc={n}",
            "--val_docs=20",
            "--shard_tokens=30000",
        )
        assert result.returncode == 0, result.stderr
        assert "tokens/s" in result.stderr  # the progress bar
        assert "documents in" in result.stdout  # the summary line
        outputs.append(shard_bytes(str(tmp_path / f"n{n}")))
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0]) > 4


def expected_splits(documents, val_fraction):
    """Each split's tokens as tiktoken itself gives them, document by document."""
    enc = gpt2_encoding()
    expected = {"train": [], "val": []}
    for i, doc in enumerate(documents):
        split = "val" if is_val(i, None, val_fraction) else "train"
        expected[split] += enc.encode_ordinary(doc) + [enc.eot_token]
    return expected


def write_layout(folder, documents, layout):
    """The documents as one of the layouts the processes split between them."""
    os.makedirs(folder)
    if layout == "parquet, many small row groups":
        write_parquet(folder, documents, files=3)
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            pq.write_table(pq.read_table(path), path, row_group_size=7)
    elif layout == "parquet, one big row group":
        pq.write_table(
            pa.table({"text": documents}), os.path.join(folder, "one.parquet"), row_group_size=10**6
        )
    elif layout == "jsonl":
        # two files; the second starts with a byte-order mark, has Windows line
        # ends and blank lines, none of which is a document
        half = len(documents) // 2
        write_jsonl(os.path.join(folder, "a.jsonl"), documents[:half])
        lines = [json.dumps({"text": doc}) for doc in documents[half:]]
        data = "\ufeff" + "\r\n".join(lines[:100]) + "\r\n\r\n" + "\n".join(lines[100:]) + "\n\n"
        with open(os.path.join(folder, "b.jsonl"), "w", encoding="utf-8", newline="") as f:
            f.write(data)
    else:  # one .txt file per document, named so they sort in order
        for i, doc in enumerate(documents):
            with open(os.path.join(folder, f"{i:05d}.txt"), "w", encoding="utf-8") as f:
                f.write(doc)


@pytest.mark.parametrize(
    "layout", ["parquet, many small row groups", "parquet, one big row group", "jsonl", "txt"]
)
def test_processes_read_their_own_tasks_and_write_the_same_bytes(
    tmp_path, documents, layout, monkeypatch
):
    """Tasks of 4 KB, so the source is cut into dozens of tasks (a big row group
    into row ranges, a jsonl file into byte ranges); parquet decoded 5 rows at a
    time, so batches straddle the tasks' edges. 1, 2 and 3 processes write the
    tokens tiktoken gives each document, byte for byte the same."""
    monkeypatch.setattr(sources, "TASK_BYTES", 4_000)
    monkeypatch.setattr(sources, "WHOLE_GROUP_BYTES", 32_000)
    monkeypatch.setattr(sources, "READ_ROWS", 5)
    docs = [doc for doc in documents if doc] if layout == "txt" else documents
    docs = docs[:400] if layout == "txt" else docs
    src = str(tmp_path / "src")
    write_layout(src, docs, layout)
    plan = sources.open_source(src)
    assert len(plan.tasks) >= 12
    if layout == "parquet, one big row group":
        assert {piece.group for task in plan.tasks for piece in task} == {0}
    expected = expected_splits(docs, 0.05)
    outputs = []
    for n in (1, 2, 3):
        folder = str(tmp_path / f"n{n}")
        prepare_corpus(src, folder, "gpt2", num_proc=n, val_fraction=0.05, shard_tokens=50_000)
        for split in ("train", "val"):
            tokens = load_tokens(folder, split)
            assert tokens[np.arange(len(tokens))].tolist() == expected[split]
        outputs.append(shard_bytes(folder))
    assert outputs[0] == outputs[1] == outputs[2]


def read_as_processes(plan, num_proc):
    """The documents as num_proc processes read them: task i by reader i % num_proc."""
    readers = [sources.TaskReader(plan) for _ in range(num_proc)]
    texts = []
    for i, task in enumerate(plan.tasks):
        texts += readers[i % num_proc].read(task)
    return texts


@pytest.mark.parametrize("task_bytes", [1, 2, 3, 7, 40, 10**6])
def test_tasks_cut_anywhere_hold_every_document_once(tmp_path, monkeypatch, task_bytes):
    """Tasks of a single byte cut a jsonl file at every byte, a line's end
    included, and a row group at every row; read by 1, 2 or 3 readers, each
    skipping the others' tasks, every document comes out once, in order."""
    monkeypatch.setattr(sources, "TASK_BYTES", task_bytes)
    monkeypatch.setattr(sources, "WHOLE_GROUP_BYTES", 0)  # every row group cut
    monkeypatch.setattr(sources, "READ_ROWS", 3)
    docs = ["", "a", "two\nlines", "Grüße ✓", "x" * 50, "", "b", "end"] * 3
    (tmp_path / "j").mkdir()
    lines = [json.dumps({"text": doc, "n": i}) for i, doc in enumerate(docs)]
    # blank lines, one of them a single byte, are no documents
    text = "\r\n".join(lines[:5]) + "\n\n" + "\r\n".join(lines[5:]) + "\r\n\r\n"
    (tmp_path / "j" / "d.jsonl").write_bytes(text.encode())
    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({"text": docs}), tmp_path / "p" / "d.parquet", row_group_size=10)
    for src in ("j", "p"):
        plan = sources.open_source(str(tmp_path / src))
        for n in (1, 2, 3):
            assert read_as_processes(plan, n) == docs, (src, n)
        if task_bytes == 1:
            assert len(plan.tasks) >= len(docs)


def test_a_json_array_file_is_read_by_one_process(tmp_path, documents):
    """A .json file that holds one array cannot be cut into lines: the main
    process reads it (through `datasets`) and the processes only tokenize."""
    docs = documents[:300]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "docs.json").write_text(json.dumps([{"text": d} for d in docs]))
    assert isinstance(sources.open_source(str(tmp_path / "src")), sources.Stream)
    prepare_corpus(str(tmp_path / "src"), str(tmp_path / "out"), "gpt2", num_proc=2)
    expected = expected_splits(docs, 0.01)
    for split in ("train", "val"):
        tokens = load_tokens(str(tmp_path / "out"), split)
        assert tokens[np.arange(len(tokens))].tolist() == expected[split]


def test_txt_folder_is_one_document_per_file(tmp_path):
    src = tmp_path / "poems"
    (src / "b").mkdir(parents=True)
    texts = ["Roses are red,\n", "violets are blue.\n", "Sugar is sweet, ünd so are you.\n"]
    for i, text in enumerate(texts):
        (src / ("b" if i else "") / f"{i}.txt").write_text(text, encoding="utf-8")
    meta = prepare_corpus(str(src), str(tmp_path / "out"), "gpt2", num_proc=1, val_docs=1)
    assert meta["documents"] == {"train": 2, "val": 1}
    tok = get_tokenizer({"kind": "gpt2"})
    val = load_tokens(str(tmp_path / "out"), "val")
    assert tok.decode(val[np.arange(len(val))].tolist()) == texts[0] + END_OF_TEXT


def test_sigkill_then_the_same_command_gives_the_same_bytes(tmp_path, documents):
    write_jsonl(str(tmp_path / "src" / "docs.jsonl"), documents * 6)
    command = [
        str(tmp_path / "src"),
        "--tokenizer=gpt2",
        "--name=big",
        f"--data_root={tmp_path}",
        "--num_proc=2",
        "--shard_tokens=10000",
    ]
    folder = tmp_path / "big"
    proc = subprocess.Popen(
        [sys.executable, "data/prepare.py", *command],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 60
    while not (folder / "train_00001.bin").exists() and time.time() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the workers too
    proc.wait()
    assert (folder / "train_00001.bin").exists()
    assert not (folder / "meta.json").exists()  # so nothing reads it as a dataset
    with pytest.raises(DataError, match="meta.json is missing"):
        load_meta(str(folder))
    with pytest.raises(DataError, match="unknown dataset"):
        ensure_dataset("big", str(tmp_path))

    again = run_prepare(*command)
    assert again.returncode == 0, again.stderr
    reference = run_prepare(
        str(tmp_path / "src"),
        "--tokenizer=gpt2",
        "--name=ref",
        f"--data_root={tmp_path}",
        "--num_proc=1",
        "--shard_tokens=10000",
    )
    assert reference.returncode == 0, reference.stderr
    assert shard_bytes(str(folder)) == shard_bytes(str(tmp_path / "ref"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="finds the processes in /proc")
def test_a_tokenizer_process_killed_is_one_line_and_no_dataset(tmp_path, documents):
    write_jsonl(str(tmp_path / "src" / "docs.jsonl"), documents * 12)  # 8 tasks
    command = [str(tmp_path / "src"), "--tokenizer=gpt2", "--name=k", f"--data_root={tmp_path}"]
    proc = subprocess.Popen(
        [sys.executable, "data/prepare.py", *command, "--num_proc=2"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Each tokenizer process is stopped as soon as it appears, then all are
    # killed: had one been killed alone before it claimed a task, the other
    # would have tokenized all of them, and the dataset would rightly be whole.
    stopped = set()
    deadline = time.time() + 60
    while len(stopped) < 2 and time.time() < deadline:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            workers = set(f.read().split())
        for pid in workers - stopped:
            os.kill(int(pid), signal.SIGSTOP)
        stopped |= workers
        time.sleep(0.001)
    for pid in stopped:
        os.kill(int(pid), signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    line = assert_one_line_error(subprocess.CompletedProcess([], proc.returncode, "", stderr))
    assert "a tokenizer process ended without its tokens (exit code -9" in line
    assert os.listdir(tmp_path / "k") == []


# ---------------------------------------------------------------- reading shards


def test_sharded_tokens_read_as_one_stream_and_every_shard_is_sampled(tmp_path):
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 70_000, 10_000).astype(np.uint32)  # past uint16
    writer = ShardWriter(str(tmp_path), "train", dtype_for(70_000), shard_tokens=1_500)
    for piece in np.array_split(stream, 13):  # writes that do not line up with shards
        writer.write(piece)
    shards = writer.finish()
    assert [s["tokens"] for s in shards] == [1_500] * 6 + [1_000]
    paths = [str(tmp_path / s["file"]) for s in shards]
    tokens = ShardedTokens(paths, "uint32")
    assert len(tokens) == len(stream)
    positions = rng.integers(0, len(stream), (64, 33))
    assert np.array_equal(tokens[positions], stream[positions])

    cfg = Settings(gradient_accumulation_steps=4, batch_size=8, block_size=32)
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(20):
        x, y = step_batches(tokens, gen, cfg, 0, 1, torch.device("cpu"))
        for row in x.reshape(-1, 32):
            # the window's first token says where it starts; look it up in the stream
            seen.update(np.flatnonzero(stream == row[0].item()) // 1_500)
        assert torch.equal(x[..., 1:], y[..., :-1])
    assert seen >= set(range(len(shards)))


def test_a_sharded_split_loads_as_shards(tmp_path, documents):
    write_jsonl(str(tmp_path / "src" / "d.jsonl"), documents)
    folder = str(tmp_path / "ds")
    prepare_corpus(str(tmp_path / "src"), folder, "gpt2", num_proc=1, shard_tokens=40_000)
    data = load_split(folder, "train", 64, 50257, torch.device("cpu"))
    assert isinstance(data, ShardedTokens)  # never the whole split in memory
    whole = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in sorted_shards(folder)])
    starts = torch.tensor([0, 39_990, len(whole) - 65])  # one window crosses a shard end
    x, y = get_batch(data, starts, 64, torch.device("cpu"))
    for row, start in zip(x, starts.tolist()):
        assert row.tolist() == whole[start : start + 64].tolist()


def sorted_shards(folder):
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.startswith("train_"))


def tiny_run(tmp_path):
    """train.py's settings for a one-layer model on the dataset prepared as data/docs."""
    return [
        "--dataset=docs",
        f"--data_root={tmp_path / 'data'}",
        "--n_layer=1",
        "--n_head=2",
        "--n_embd=32",
        "--block_size=32",
        "--batch_size=4",
        "--gradient_accumulation_steps=2",
        "--device=cpu",
        "--compile=False",
        "--dtype=float32",
        "--eval_iters=2",
    ]


def test_exact_resume_on_a_sharded_dataset(tmp_path, documents):
    write_jsonl(str(tmp_path / "src" / "d.jsonl"), documents)
    prepare_corpus(
        str(tmp_path / "src"), str(tmp_path / "data" / "docs"), "gpt2", 1, shard_tokens=30_000
    )
    common = [
        *tiny_run(tmp_path),
        "--eval_interval=3",
        "--lr_decay_iters=6",
        "--dropout=0.1",
    ]
    a, b = tmp_path / "a", tmp_path / "b"
    train.main([*common, f"--out_dir={a}", "--max_iters=6"])
    train.main([*common, f"--out_dir={b}", "--max_iters=3"])
    train.main([*common, f"--out_dir={b}", "--max_iters=6", "--init_from=resume"])
    ca, cb = load_checkpoint(str(a)), load_checkpoint(str(b))
    assert ca["iter_num"] == cb["iter_num"] == 6
    for key in ca["model"]:
        assert torch.equal(ca["model"][key], cb["model"][key]), key


# ---------------------------------------------------------------- your own BPE


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_bpe_round_trip(bpe, text):
    assert bpe.decode(bpe.encode(text)) == text
    assert bpe.decode(sum(bpe.encode_documents([text, text]), [])) == text + text


@pytest.fixture(scope="module")
def bpe(documents):
    return train_bpe(documents, 600)


def test_bpe_describes_itself_fully(bpe):
    again = get_tokenizer(bpe.describe())
    text = "To be, or not to be: that is the question. Ünïcödé"
    assert again.encode(text) == bpe.encode(text)
    assert again.vocab_size == 600 and again.eot_token == 0
    # a literal end-of-text in a document is text, never the separator
    assert 0 not in bpe.encode_documents([END_OF_TEXT])[0]
    # token by token, as heads.py shows them (a split character shows as "\ufffd")
    plain = "To be, or not to be: that is the question."
    assert "".join(bpe.token_strings(bpe.encode(plain))) == plain


def test_bpe_larger_than_the_corpus_allows_says_so(tmp_path, documents):
    """bpe:VOCAB beyond what a small corpus can merge: the vocabulary it did reach, and
    a line that says why; the oracle for that why: every word, split as GPT-2's
    pre-tokenizer splits it, is one token."""
    from tokenizers import pre_tokenizers

    docs = documents[:200]
    write_jsonl(str(tmp_path / "src" / "d.jsonl"), docs)

    def prepare(vocab_size, name):
        result = run_prepare(
            str(tmp_path / "src"),
            f"--tokenizer=bpe:{vocab_size}",
            f"--name={name}",
            f"--data_root={tmp_path / 'data'}",
            "--num_proc=1",
        )
        assert result.returncode == 0, result.stderr
        return result

    result = prepare(60000, "small")
    meta = load_meta(str(tmp_path / "data" / "small"))
    assert meta["vocab_size"] < 60000
    note = f"(--tokenizer bpe:60000: the corpus gave {meta['vocab_size']:,} tokens, by then"
    assert note in result.stdout
    tok = get_tokenizer(meta["tokenizer"])
    split = pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str
    words = {doc[a:b] for doc in docs for _, (a, b) in split(doc)}
    assert len(words) > 1000
    assert [w for w in words if len(tok.encode(w)) != 1] == []
    # a vocabulary the corpus reaches prints no such line
    assert "--tokenizer bpe" not in prepare(300, "reached").stdout


def test_bpe_dataset_trains_and_samples_through_the_checkpoint(tmp_path, documents):
    write_jsonl(str(tmp_path / "src" / "d.jsonl"), documents)
    result = run_prepare(
        str(tmp_path / "src"),
        "--tokenizer=bpe:512",
        "--name=mine",
        f"--data_root={tmp_path / 'data'}",
        "--num_proc=2",
    )
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "data" / "mine"
    assert (folder / "tokenizer.json").exists()
    meta = load_meta(str(folder))
    tok = get_tokenizer(meta["tokenizer"])
    assert meta["vocab_size"] == tok.vocab_size == 512
    val = load_tokens(str(folder), "val")
    val_docs = [d for i, d in enumerate(documents) if is_val(i, None, 0.01)]
    assert tok.decode(val[np.arange(len(val))].tolist()) == "".join(
        d + END_OF_TEXT for d in val_docs
    )

    out = tmp_path / "out"
    train.main(
        [
            "--dataset=mine",
            f"--data_root={tmp_path / 'data'}",
            f"--out_dir={out}",
            "--n_layer=1",
            "--n_head=2",
            "--n_embd=32",
            "--block_size=32",
            "--batch_size=4",
            "--gradient_accumulation_steps=1",
            "--max_iters=2",
            "--eval_iters=1",
            "--device=cpu",
            "--compile=False",
            "--dtype=float32",
        ]
    )
    assert load_checkpoint(str(out))["tokenizer"] == tok.describe()  # the whole tokenizer
    os.rename(folder, tmp_path / "gone")  # sampling needs no dataset folder
    sample = subprocess.run(
        [sys.executable, "sample.py", f"--out_dir={out}", "--max_new_tokens=8"]
        + ["--num_samples=1", "--attn_dir=", "--device=cpu", "--prompt=ROMEO:"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sample.returncode == 0, sample.stderr
    assert "ROMEO:" in sample.stdout


# ---------------------------------------------------------------- bad input


@pytest.fixture
def bad_sources(tmp_path):
    (tmp_path / "empty").mkdir()
    write_jsonl(str(tmp_path / "nocol" / "d.jsonl"), ["a", "b"], column="body")
    write_parquet(str(tmp_path / "nocolpq"), ["a", "b", "c"], files=1, column="body")
    write_jsonl(str(tmp_path / "nodocs" / "d.jsonl"), [])
    return tmp_path


# a source that cannot be prepared exits 1; an option no source could be prepared with, 2
@pytest.mark.parametrize(
    "source, extra, words, code",
    [
        ("missing", [], ["does not exist"], 1),
        # with the default tokenizer: before, use --tokenizer gpt2, which then said this
        ("missing", ["--tokenizer=char"], ["does not exist"], 1),
        ("empty", [], ["holds no"], 1),
        ("nodocs", [], ["no documents"], 1),
        ("nocol", [], ["no column 'text'", "--text_column"], 1),
        ("nocolpq", [], ["no column 'text'", "body"], 1),
        ("nocolpq", ["--text_column=body", "--num_proc=0"], ["--num_proc must be 1 or more"], 2),
        ("nocolpq", ["--text_column=body", "--tokenizer=bpe:100"], ["too small"], 2),
        # it was told to need the whole text in memory, as --tokenizer char does
        ("nocolpq", ["--text_column=body", "--tokenizer=sentencepiece"], ["unknown"], 2),
        ("nocolpq", ["--text_column=body", "--val_docs=5"], ["too few"], 1),
        # shards of no tokens: the writer looped for ever
        ("nocolpq", ["--text_column=body", "--shard_tokens=0"], ["--shard_tokens must be 1"], 2),
        ("nocol/d.jsonl", ["--tokenizer=char"], ["--tokenizer char reads one text"], 2),
        # a hub dataset's subset, given to local files: it was ignored
        ("nocolpq", ["--text_column=body", "--subset=sample-10BT"], ["--subset", "local"], 2),
        ("nocol/d.jsonl", ["--tokenizer=char", "--subset=x"], ["--subset", "local"], 2),
    ],
)
def test_bad_sources_get_one_line_and_no_dataset(bad_sources, source, extra, words, code):
    args = [str(bad_sources / source), "--tokenizer=gpt2", "--name=out", *extra]
    result = run_prepare(*args, f"--data_root={bad_sources / 'data'}")
    assert_one_line_error(result, *words, code=code)
    assert not (bad_sources / "data" / "out" / "meta.json").exists()
    if (bad_sources / "data" / "out").exists():
        assert os.listdir(bad_sources / "data" / "out") == []  # nothing half-written


def test_a_bad_option_or_an_unwritable_root_is_one_line(bad_sources):
    """An optional number that is not one (exit 2, as every bad option), and a data
    root where no folder can be made (exit 1, a run that failed): one line each."""
    source = [str(bad_sources / "nocolpq"), "--tokenizer=gpt2", "--text_column=body"]
    root = f"--data_root={bad_sources / 'data'}"
    for option in ("--val_fraction=abc", "--num_proc=four", f"--val_docs={2**63}"):
        result = run_prepare(*source, root, option)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith(f"error: {option[2:].split('=')[0]} ")
        assert len(result.stderr.splitlines()) == 1, result.stderr
    a_file = bad_sources / "a_file"
    a_file.write_text("not a folder")
    result = run_prepare(*source, f"--data_root={a_file}")
    assert_one_line_error(result, "cannot read or write", str(a_file))


@pytest.mark.parametrize("layout", ["jsonl", "parquet"])
def test_a_bad_document_met_by_a_tokenizer_process_is_one_line(
    tmp_path, documents, layout, monkeypatch
):
    """The last task, which a tokenizer process reads, holds a line that is not
    JSON or a value that is not text: the error is the process's one line, and
    nothing is left of the dataset."""
    monkeypatch.setattr(sources, "TASK_BYTES", 4_000)
    monkeypatch.setattr(sources, "WHOLE_GROUP_BYTES", 0)
    src = tmp_path / "src"
    if layout == "jsonl":
        write_jsonl(str(src / "d.jsonl"), documents[:500])
        offset = (src / "d.jsonl").stat().st_size
        with open(src / "d.jsonl", "a") as f:
            f.write("not json\n")
        words = f"is not JSON lines (byte {offset}:"
    else:
        write_parquet(str(src), [*documents[:500], None], files=1)
        words = "some 'text' values are not text"
    assert len(sources.open_source(str(src)).tasks) > 4
    with pytest.raises(DataError) as error:
        prepare_corpus(str(src), str(tmp_path / "out"), "gpt2", num_proc=2)
    assert words in str(error.value) and "\n" not in str(error.value)
    assert os.listdir(tmp_path / "out") == []


def test_hub_id_without_network_is_one_line(tmp_path):
    result = run_prepare(
        "Skylion007/openwebtext",
        "--tokenizer=gpt2",
        f"--data_root={tmp_path}",
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert_one_line_error(result, "Skylion007/openwebtext")


@pytest.mark.parametrize("damage", ["missing", "cut", "uint16"])
def test_damaged_sharded_dataset_is_one_line(tmp_path, documents, damage):
    write_jsonl(str(tmp_path / "src" / "d.jsonl"), documents[:500])
    folder = tmp_path / "data" / "docs"
    prepare_corpus(str(tmp_path / "src"), str(folder), "gpt2", 1, shard_tokens=10_000)
    whole = split_bytes(folder)
    if damage == "missing":
        os.remove(folder / "train_00001.bin")
    elif damage == "cut":
        with open(folder / "train_00001.bin", "r+b") as f:
            f.truncate(1000)
    else:  # a vocabulary that does not fit the dtype
        meta = json.loads((folder / "meta.json").read_text())
        meta["vocab_size"] = 70_000
        (folder / "meta.json").write_text(json.dumps(meta))
    result = subprocess.run(
        [sys.executable, "train.py", "--dataset=docs", f"--data_root={tmp_path / 'data'}"]
        + [f"--out_dir={tmp_path / 'out'}", "--device=cpu", "--max_iters=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    words = {"missing": "is missing", "cut": "cut short", "uint16": "does not fit uint16"}
    line = result.stderr.strip().splitlines()[-1]
    assert words[damage] in line
    # the advice, followed as written, prepares the same dataset again in the same place
    # (it named neither the tokenizer, gpt2 here, nor the data root)
    advice = line.split("prepare the dataset again with: ")[1]
    assert advice == (
        f"python data/prepare.py {tmp_path / 'src'} --tokenizer=gpt2 --name docs "
        f"--data_root={tmp_path / 'data'}"
    )
    again = subprocess.run(advice, shell=True, cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    # the same tokens (in shards of data/prepare.py's default size, not the 10,000 above)
    assert split_bytes(folder) == whole


def test_a_vocabulary_past_uint16_cannot_make_one_text(tmp_path):
    chars = "".join(map(chr, range(300, 70_300)))  # 70,000 distinct characters
    with pytest.raises(DataError, match="uint16 files hold at most 65536"):
        prepare_text(chars, str(tmp_path), "char", 0.5)
    assert not os.path.exists(tmp_path / "meta.json")


def test_two_processes_match_one_on_shards_with_hellaswag(tmp_path, documents, cores_alone):
    """DDP over torchrun reads the same shards, and HellaSwag's counts summed
    over the processes give the one-process scores."""
    write_jsonl(str(tmp_path / "src" / "d.jsonl"), documents)
    prepare_corpus(
        str(tmp_path / "src"), str(tmp_path / "data" / "docs"), "gpt2", 1, shard_tokens=30_000
    )
    with open(tmp_path / "hs.jsonl", "w") as f:
        for i in range(5):
            endings = ["the king is dead.", "my lord.", "to be or not.", "ROMEO: hence!"]
            f.write(json.dumps({"ctx": f"Scene {i}. Enter", "endings": endings, "label": i % 4}))
            f.write("\n")
    common = [
        *tiny_run(tmp_path),
        "--eval_interval=2",
        "--max_iters=2",
        "--dropout=0.0",
        "--hellaswag=True",
        f"--hellaswag_data={tmp_path / 'hs.jsonl'}",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    train.main([*common, f"--out_dir={one}"])
    with cores_alone():
        result = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
            + ["train.py", *common, f"--out_dir={two}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    assert result.returncode == 0, result.stderr[-3000:]
    logs = [read_evaluations(out) for out in (one, two)]
    assert [r["iter"] for r in logs[1]] == [0, 2]
    for a, b in zip(*logs):
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-4)
        assert a["hellaswag_acc"] == b["hellaswag_acc"]
        assert a["hellaswag_acc_norm"] == b["hellaswag_acc_norm"]
