"""
A held-out split to choose a recipe's settings on, so that the val split is only
ever scored, never tuned on: a copy of a prepared one-text dataset whose train
split is the first 90% of the original's train split and whose val split is the
rest of it. The original val split is not read.

    python -m bench.holdout                          # data/shakespeare_char -> /tmp/holdout
    python train.py config/shakespeare_cpu_15min.py --data_root=/tmp/holdout \
        --dataset=shakespeare_char_holdout --out_dir=/tmp/try1 --dropout=0.1
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import json

import numpy as np

from data import DATA_ROOT, DataError
from data.dataset import load_meta

HOLDOUT_FRACTION = 0.1


def write_holdout(dataset_dir, out_root, fraction=HOLDOUT_FRACTION):
    """Write out_root/<name>_holdout from dataset_dir's train split; its path."""
    meta = load_meta(dataset_dir)
    train_path = os.path.join(dataset_dir, "train.bin")
    if not os.path.exists(train_path):
        raise DataError(f"{train_path} is missing: a holdout needs a one-text dataset")
    tokens = np.fromfile(train_path, dtype=meta["dtype"])
    cut = int(len(tokens) * (1 - fraction))
    name = os.path.basename(os.path.normpath(dataset_dir)) + "_holdout"
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    tokens[:cut].tofile(os.path.join(out_dir, "train.bin"))
    tokens[cut:].tofile(os.path.join(out_dir, "val.bin"))
    held = dict(meta, train_tokens=cut, val_tokens=len(tokens) - cut)
    held["source"] = f"the train split of {dataset_dir}, cut at {1 - fraction:.0%}"
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(held, f, indent=2)
    return out_dir


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="shakespeare_char")
    parser.add_argument("--out_root", default="/tmp/holdout")
    args = parser.parse_args(argv)
    try:
        out_dir = write_holdout(os.path.join(DATA_ROOT, args.dataset), args.out_root)
    except (DataError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
