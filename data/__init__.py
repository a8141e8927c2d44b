"""
The data package: text into tokens, and tokens into batches.

    tokenizer.py         characters, GPT-2 BPE, or a BPE trained on your corpus
    sources.py           a corpus's documents: FORMATS, the table of file kinds
    corpus.py            documents into token shards, on every core
    text.py              one text into train.bin and val.bin
    tiny_shakespeare.py  the corpus of the README, found or downloaded
    shards.py            the shard files, written and read
    dataset.py           a prepared dataset folder: meta.json, its tokens, their batches
    prepare.py           the command: python data/prepare.py SOURCE ...
"""

import os

# where dataset folders live unless --data_root says otherwise
DATA_ROOT = os.path.dirname(os.path.abspath(__file__))


def typed_path(path):
    """A file of the repository (path from its root) as a command typed in the current
    folder names it, quoted for the shell: what advice prints, run from anywhere."""
    import shlex  # here only: advice

    full = os.path.join(os.path.dirname(DATA_ROOT), path)
    shown = os.path.relpath(full)
    if shown.startswith(os.pardir):
        shown = full
    return shlex.quote(shown)


class DataError(Exception):
    """A problem with a dataset that the user can fix; the message is a single line."""
