"""
A corpus source's documents, in a fixed order, cut into read tasks that any
process can read by itself.

    local_files     the files of a local source (a file, a folder, a glob)
    FORMATS         the kinds of file, each read its own way: a new one is an entry
    open_source     a Plan of read tasks for local files, else a Stream
    TaskReader      the documents of a plan's tasks, read in one process
    iter_documents  every document of a source, in order, read in one process

A task names where its documents lie, and holds about TASK_BYTES of text (or
one row group of up to WHOLE_GROUP_BYTES): rows of a parquet row group, byte
ranges of a jsonl file (the lines that start in each), or whole .txt files
(one document each). The plan is made from file sizes and parquet's metadata
alone, so the process that makes it reads no text, and each tokenizer process
reads its own tasks (data/corpus.py). A hub dataset, and a .json file that
holds one JSON array rather than a document per line, can only be read from
the start by one process: they are a Stream, read by the `datasets` library.
"""

import glob
import io
import json
import math
import os
from typing import Callable, NamedTuple

from data import DataError

# Arrow's default allocator (jemalloc) keeps pages of the row groups already read, more
# of them the longer the read: the main process grew from 179 MB for a 250 MB corpus to
# 225 MB for 1 GB, where the C library's malloc stays flat, 154 and 156 MB (python -m
# bench.corpus --parts=memory). pyarrow reads this when it loads, so it is set before
# anything here imports it; a value the user set wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

TASK_BYTES = 1 << 20  # about 1 MB of text per read task
# A parquet row group decodes from its start only, so processes that share one
# each decode all of it (the rows of the others' tasks too, 2% of the work of
# tokenizing them): a row group up to this size is one task, read by one process.
WHOLE_GROUP_BYTES = 8 * TASK_BYTES
READ_ROWS = 256  # parquet rows decoded at a time
# parquet column chunks are read through a buffer of this size, page by page:
# unbuffered, pyarrow reads a whole column chunk at once, 130 MB for a row group
# of 200 MB of text
READ_BUFFER = 1 << 20


class Piece(NamedTuple):
    """A contiguous part of one file: rows start..stop of a parquet row group,
    the lines of a jsonl file that start in bytes start..stop, or a whole .txt
    file (start 0, stop its size)."""

    path: str
    group: int | None
    start: int
    stop: int


class Plan(NamedTuple):
    """A local source cut into tasks, each a tuple of pieces, in the order of
    the documents."""

    source: str
    format: "Format"  # how its files are read: one of FORMATS
    text_column: str
    tasks: list
    documents: int | None  # where the metadata says how many


class Stream(NamedTuple):
    """A source only one process can read, from its start: batches of texts."""

    batches: object  # an iterator over lists of texts
    documents: int | None


# ---------------------------------------------------------------- files


def local_files(source):
    """The files of a local source (a file, a folder, a glob), or None for a hub id."""
    if os.path.isdir(source):
        names = sorted(glob.glob(os.path.join(source, "**", "*"), recursive=True))
        files = [name for name in names if os.path.splitext(name)[1] in FORMATS]
        if not files:
            kinds = ", ".join(FORMATS)
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


def _format(files):
    """The Format of the files: one of FORMATS, the same for every file."""
    kinds = {os.path.splitext(name)[1] for name in files}
    formats = {FORMATS.get(kind) for kind in kinds}
    if None in formats or len(formats) != 1:
        raise DataError(
            f"the source mixes or holds unknown file kinds ({', '.join(sorted(kinds))}); "
            f"use files of one kind: {', '.join(FORMATS)}"
        )
    return formats.pop()


def _is_json_array(path):
    """Whether a .json file holds one JSON array (not a document per line)."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


# ---------------------------------------------------------------- the plan


def open_source(source, text_column="text", subset=None):
    """How to read a source: a Plan of read tasks for local files, else a Stream."""
    files = local_files(source)
    if files is None or any(f.endswith(".json") and _is_json_array(f) for f in files):
        return _open_stream(source, files, text_column, subset)
    fmt = _format(files)
    if fmt.check is not None:
        fmt.check(files, source, text_column)
    pieces = [piece for path in files for piece in fmt.pieces(path, source, text_column)]
    count = None
    if fmt.documents is not None:
        count = sum(fmt.documents(piece) for piece, _ in pieces)
    return Plan(source, fmt, text_column, _tasks(pieces), count)


def _tasks(pieces):
    """Consecutive (piece, bytes) gathered into tasks of at most TASK_BYTES
    (a piece is no bigger, unless it is one row or one .txt file)."""
    tasks = []
    task = []
    size = 0
    for piece, nbytes in pieces:
        if task and size + nbytes > TASK_BYTES:
            tasks.append(tuple(task))
            task = []
            size = 0
        task.append(piece)
        size += nbytes
    if task:
        tasks.append(tuple(task))
    return tasks


def _cuts(count, parts):
    """count (rows or bytes) cut into `parts` near-equal parts (fewer if count
    is smaller): each part's (start, stop)."""
    parts = max(1, min(count, parts))
    return [(count * k // parts, count * (k + 1) // parts) for k in range(parts)]


def _open_parquet(path):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read {path} ({str(e).splitlines()[0]})") from None


def _parquet_pieces(path, source, text_column):
    """(piece, bytes) for each part of each row group: a row group of more than
    WHOLE_GROUP_BYTES of text is cut by rows into parts of TASK_BYTES, so that a
    file of one big row group still spreads over every process. The text
    column's size before compression stands for its text (a column
    dictionary-encoded throughout reads smaller than it is)."""
    parquet = _open_parquet(path)
    columns = parquet.schema_arrow.names
    if text_column not in columns:
        raise DataError(
            f"{source} has no column {text_column!r} (its columns: {', '.join(columns)}); "
            "pass --text_column NAME"
        )
    metadata = parquet.metadata
    pieces = []
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        chunks = [row_group.column(i) for i in range(row_group.num_columns)]
        size = sum(c.total_uncompressed_size for c in chunks if c.path_in_schema == text_column)
        rows = row_group.num_rows
        parts = 1 if size <= WHOLE_GROUP_BYTES else math.ceil(size / TASK_BYTES)
        for start, stop in _cuts(rows, parts):
            pieces.append((Piece(path, group, start, stop), size * (stop - start) / max(rows, 1)))
    return pieces


def _jsonl_pieces(path, source, text_column):
    """(piece, bytes) for each byte range of a jsonl file."""
    size = os.path.getsize(path)
    if size == 0:
        return []
    cuts = _cuts(size, math.ceil(size / TASK_BYTES))
    return [(Piece(path, None, start, stop), stop - start) for start, stop in cuts]


def _text_pieces(path, source, text_column):
    """[(piece, bytes)] for a .txt file, one document."""
    size = os.path.getsize(path)
    return [(Piece(path, None, 0, size), size)]


def _check_json_column(files, source, text_column):
    """The first document has the text column: a wrong --text_column is one
    line before any process starts."""
    for path in files:
        with open(path, "rb") as f:
            for offset, line in _lines(f, 0):
                row = _json_row(line, path, offset)
                if text_column not in row:
                    raise DataError(
                        f"{source} has no column {text_column!r} (its columns: "
                        f"{', '.join(row)}); pass --text_column NAME"
                    )
                return


# ---------------------------------------------------------------- reading


class TaskReader:
    """Reads the documents of a plan's tasks in one process, tasks taken in
    the plan's order. It keeps the parquet row group it is in open, so a row
    group cut into several tasks is decoded once on the way through, never
    again from its start for each task (a process skips the rows of the tasks
    other processes read: pyarrow decodes them but makes no Python strings)."""

    def __init__(self, plan):
        self.plan = plan
        self.parquet = None  # the parquet file being read, and its path
        self.path = None
        self.group = None  # the row group being read
        self.batches = None  # its batches still to come
        self.batch = None  # the current batch's texts (an arrow array)
        self.row = 0  # the row of the group where the current batch starts

    def read(self, task):
        """The texts of one task's documents, in order."""
        texts = []
        for piece in task:
            texts += self.plan.format.read(self, piece)
        if not all(isinstance(text, str) for text in texts):
            raise DataError(
                f"{self.plan.source}: some {self.plan.text_column!r} values are not text"
            )
        return texts

    def _open_group(self, path, group):
        if path != self.path:
            self.parquet = _open_parquet(path)
            self.path = path
        self.group = group
        self.batches = self.parquet.iter_batches(
            READ_ROWS, row_groups=[group], columns=[self.plan.text_column], use_threads=False
        )
        self.row = 0
        self.batch = self._next_batch()

    def _next_batch(self):
        batch = next(self.batches, None)
        return None if batch is None else batch.column(0)

    def parquet_rows(self, piece):
        if (piece.path, piece.group) != (self.path, self.group) or piece.start < self.row:
            self._open_group(piece.path, piece.group)
        texts = []
        while self.batch is not None:
            end = self.row + len(self.batch)
            if end > piece.start:
                first = max(piece.start, self.row) - self.row
                last = min(piece.stop, end) - self.row
                texts += self.batch.slice(first, last - first).to_pylist()
            if end > piece.stop:
                break  # the rest of this batch belongs to a later piece
            self.row = end
            self.batch = self._next_batch()
        return texts

    def jsonl_lines(self, piece):
        """The texts of the lines that start in bytes piece.start..piece.stop."""
        with open(piece.path, "rb") as f:
            begin = piece.start
            if begin > 0:
                # a line that starts before the range belongs to the piece before
                f.seek(begin - 1)
                begin += len(f.readline()) - 1
            if begin >= piece.stop:
                return []
            f.seek(begin)
            data = f.read(piece.stop - begin)
            if not data.endswith(b"\n"):
                data += f.readline()  # the end of the last line that starts in the range
        column = self.plan.text_column
        texts = []
        for offset, line in _lines(io.BytesIO(data), begin):
            row = _json_row(line, piece.path, offset)
            if column not in row:
                raise DataError(
                    f"{self.plan.source}: the document at byte {offset} of {piece.path} "
                    f"has no {column!r}; pass --text_column NAME"
                )
            texts.append(row[column])
        return texts


def _lines(lines, offset):
    """(byte offset, line) of the lines (each with its end) that are not
    blank, the first starting at byte `offset` of its file; a byte-order mark
    at the start of the file is dropped."""
    for line in lines:
        if offset == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
            offset = 3
        if line.strip():
            yield offset, line
        offset += len(line)


def _json_row(line, path, offset):
    try:
        row = json.loads(line)
    except ValueError as e:
        raise DataError(
            f"{path} is not JSON lines (byte {offset}: {str(e).splitlines()[0]}); "
            "a .jsonl file holds one JSON object per line"
        ) from None
    if not isinstance(row, dict):
        raise DataError(
            f"{path} is not JSON lines (byte {offset} is not an object); "
            "a .jsonl file holds one JSON object per line"
        )
    return row


def _text_document(reader, piece):
    return [_text_file(piece.path)]


def _text_file(path):
    """A .txt file's text, one document. Newlines are read as `datasets` read
    them (\\r\\n and \\r as \\n), so the tokens match earlier preparations."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not UTF-8 text (bad byte at offset {e.start}); convert it to UTF-8 first"
        ) from None


# ---------------------------------------------------------------- the formats


class Format(NamedTuple):
    """How one kind of file is planned and read. A new kind of file is one entry
    of FORMATS: its pieces (how a file is cut into parts that processes read by
    themselves), its reader (the texts of one piece), and the `datasets` builder
    that reads it when only a stream will do."""

    builder: str  # the `datasets` builder of such files
    pieces: Callable  # (path, source, text_column) -> [(Piece, bytes of text)]
    read: Callable  # (TaskReader, piece) -> [texts]
    documents: Callable | None  # piece -> how many documents, where the plan can know
    check: Callable | None  # (files, source, text_column) -> None, raises DataError


JSON_LINES = Format("json", _jsonl_pieces, TaskReader.jsonl_lines, None, _check_json_column)
FORMATS = {
    ".parquet": Format(
        "parquet", _parquet_pieces, TaskReader.parquet_rows, lambda p: p.stop - p.start, None
    ),
    ".jsonl": JSON_LINES,
    ".json": JSON_LINES,  # one document per line; a file that is one JSON array is a Stream
    ".txt": Format("text", _text_pieces, _text_document, lambda p: 1, None),
}


# ---------------------------------------------------------------- one reader only


def _open_stream(source, files, text_column, subset):
    """A hub dataset, or local files read through `datasets` (JSON arrays)."""
    import datasets  # here only: a slow import that only these sources need

    datasets.disable_progress_bars()
    documents = None
    try:
        if files is None:
            stream = datasets.load_dataset(source, name=subset, split="train", streaming=True)
            info = stream.info.splits
            documents = info["train"].num_examples if info and "train" in info else None
        else:
            stream = datasets.load_dataset(
                _format(files).builder, data_files=files, split="train", streaming=True
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
    return Stream(_stream_texts(stream, source, text_column), documents)


def _stream_texts(stream, source, text_column):
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


def iter_documents(source, text_column="text", subset=None):
    """Every document's text, in the source's order, read in this process."""
    reading = open_source(source, text_column, subset)
    if isinstance(reading, Stream):
        for texts in reading.batches:
            yield from texts
        return
    reader = TaskReader(reading)
    for task in reading.tasks:
        yield from reader.read(task)
