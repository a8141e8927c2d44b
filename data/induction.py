"""
A corpus on which induction heads form: lines of random letters, each line one
random string written again and again.

    python data/induction.py          # writes data/induction/ (train.py also does, on first use)
    python train.py config/induction.py --snapshots=True --log_heads=True

This is the classic setting of induction heads (Olsson et al. 2022), as a text
that train.py reads like any other. Each line is LINE letters: a string x of
SHORTEST to LONGEST letters drawn at random from 52 (a-z, A-Z), repeated and
cut to LINE, then a newline. Nothing in a line can be predicted until x has
been seen once; after that every letter can, by finding the previous
occurrence of the current letter and copying the one after it, which is what
an induction head does. The strings are new on every line, so the corpus
(CHARS characters, about 15,600 lines) cannot be memorised: there is nothing
to learn but the copying.

The lines are longer than config/induction.py's context (64), so that most
of the windows train.py draws at random offsets lie inside one line, as the
sequences of the classic setting do. With lines of 64 letters, every window
holds the end of one string and the start of the next, and the same run formed
no induction head in 2000 steps (docs/heads.md).
"""

import os
import sys

import numpy as np

# Works both as `python data/induction.py` and as `import data.induction`.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from data.text import prepare_text

NAME = "induction"  # the dataset's folder under data/
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
LINE = 256  # letters per line, before its newline
SHORTEST = 4  # the shortest repeated string
LONGEST = 32  # the longest
CHARS = 4_000_000  # the corpus, newlines included; the last 10% is the val split
SEED = 1337


def induction_text(chars=CHARS, seed=SEED, line=LINE, shortest=SHORTEST, longest=LONGEST):
    """chars characters (whole lines): each line a random string of shortest to longest
    letters repeated to `line` letters, then a newline. The same text for the same seed."""
    rng = np.random.default_rng(seed)
    n_lines = chars // (line + 1)
    lengths = rng.integers(shortest, longest + 1, size=(n_lines, 1))  # (n, 1)
    letters = rng.integers(0, len(LETTERS), size=(n_lines, line))  # (n, line) fresh draws
    # position i of a line repeats position i mod length: the string, written again and again
    repeated = np.take_along_axis(letters, np.arange(line) % lengths, axis=1)  # (n, line)
    alphabet = np.frombuffer(LETTERS.encode("ascii"), dtype=np.uint8)
    lines = np.concatenate([alphabet[repeated], np.full((n_lines, 1), ord("\n"), np.uint8)], 1)
    return lines.tobytes().decode("ascii")


def recurring_text(text, shortest=64, longest=128, seed=SEED):
    """Natural text with passages that recur within the context: text cut into passages
    of shortest to longest characters, each written twice in a row. The second copy
    can be predicted by copying the first, which a model too small to know the text
    by heart can only do with an induction head."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(shortest, longest + 1, size=len(text) // shortest + 1)
    cuts = np.cumsum(lengths)
    starts = [0, *cuts[cuts < len(text)].tolist()]
    ends = [*starts[1:], len(text)]
    return "".join(text[a:b] * 2 for a, b in zip(starts, ends))


def prepare_induction(data_root, input_path=None):
    """Write the corpus into data_root/induction as one text, by characters; returns
    the meta dict. (input_path: unused, as the corpus is generated, not read.)"""
    out_dir = os.path.join(data_root, NAME)
    return prepare_text(induction_text(), out_dir, "char", source="data/induction.py")


def main():
    from data.dataset import ensure_dataset, load_meta
    from data.prepare import summary

    folder = ensure_dataset(NAME)
    print(summary(folder, load_meta(folder)))


if __name__ == "__main__":
    main()
