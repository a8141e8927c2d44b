"""
Tiny Shakespeare (Karpathy's char-rnn corpus, 1,115,394 bytes): found on this
machine or downloaded once, checked, and prepared as one text, by characters
(data/shakespeare_char) or with GPT-2 BPE (data/shakespeare).
"""

import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.request

from data import DATA_ROOT, DataError
from data.text import _decode_utf8, _write_atomic, prepare_text

SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
SHAKESPEARE_BYTES = 1_115_394
SHAKESPEARE_ENV = "TINYSHAKESPEARE_PATH"
DOWNLOAD_TIMEOUT_S = 30
# the dataset folder of each tokenizer
FOLDERS = {"char": "shakespeare_char", "gpt2": "shakespeare"}


def _where_to_put(dataset_dir):
    # what every command that prepares it on first use accepts (train.py, heads.py, the
    # prepare scripts); only the prepare scripts take --input too, so it is not named here
    return (
        f"put tiny Shakespeare at {os.path.join(dataset_dir, 'input.txt')}, "
        f"or set {SHAKESPEARE_ENV}=PATH to a copy of it"
    )


def _user_file(dataset_dir, input_path):
    """The local copy to use, in order: --input, the env var, the dataset folder."""
    for given, origin in (
        (input_path, "--input"),
        (os.environ.get(SHAKESPEARE_ENV), SHAKESPEARE_ENV),
    ):
        if given:
            if not os.path.isfile(given):
                raise DataError(f"{given} (from {origin}) does not exist")
            return given
    cached = os.path.join(dataset_dir, "input.txt")
    return cached if os.path.isfile(cached) else None


def _download_shakespeare(dataset_dir):
    print(f"downloading tiny Shakespeare from {SHAKESPEARE_URL}", file=sys.stderr)
    try:
        with urllib.request.urlopen(SHAKESPEARE_URL, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    except (OSError, http.client.HTTPException, ValueError) as e:  # URLError is an OSError
        reason = getattr(e, "reason", None) or e
        raise DataError(
            f"cannot download tiny Shakespeare ({reason}); {_where_to_put(dataset_dir)}"
        ) from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != SHAKESPEARE_BYTES or digest != SHAKESPEARE_SHA256:
        raise DataError(
            f"the download from {SHAKESPEARE_URL} is corrupt "
            f"({len(data)} bytes, sha256 {digest[:12]}...); "
            f"try again, or {_where_to_put(dataset_dir)}"
        )
    os.makedirs(dataset_dir, exist_ok=True)
    _write_atomic(os.path.join(dataset_dir, "input.txt"), data)
    return data


def find_shakespeare(dataset_dir, also=()):
    """The path of tiny Shakespeare where the prepare scripts find it:
    $TINYSHAKESPEARE_PATH, then input.txt in the dataset folder, then each path
    in `also`; else it is downloaded, checked and kept in the dataset folder."""
    path = _user_file(dataset_dir, None) or next((p for p in also if os.path.isfile(p)), None)
    if path is None:
        _download_shakespeare(dataset_dir)
        path = os.path.join(dataset_dir, "input.txt")
    return path


def shakespeare_text(dataset_dir, input_path=None):
    """Tiny Shakespeare, from a local file when there is one, else downloaded once."""
    path = _user_file(dataset_dir, input_path)
    if path is None:
        return _decode_utf8(_download_shakespeare(dataset_dir), SHAKESPEARE_URL)
    with open(path, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != SHAKESPEARE_SHA256:
        # The user may well have edited it on purpose, so carry on.
        print(
            f"warning: {path} differs from the canonical tiny Shakespeare; using it anyway",
            file=sys.stderr,
        )
    return _decode_utf8(data, path)


def shakespeare_dir(kind, data_root=None):
    """data/shakespeare_char for 'char', data/shakespeare for 'gpt2'."""
    if kind not in FOLDERS:
        raise DataError(f"unknown tokenizer {kind!r}; use one of {', '.join(FOLDERS)}")
    return os.path.join(data_root or DATA_ROOT, FOLDERS[kind])


def prepare_shakespeare(kind, data_root=None, input_path=None):
    """Prepare tiny Shakespeare with the 'char' or 'gpt2' tokenizer; returns the meta dict."""
    dataset_dir = shakespeare_dir(kind, data_root)
    text = shakespeare_text(dataset_dir, input_path)
    return prepare_text(text, dataset_dir, kind, source=SHAKESPEARE_URL)
