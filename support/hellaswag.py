"""
HellaSwag, completion style: how often a model finds the right ending of a sentence.

    python -m support.hellaswag --out_dir=out-gpt2
    python -m support.hellaswag --init_from=path/to/gpt2 --data=hellaswag_val.jsonl --limit=500

Each example is a context and 4 endings, one of them right. The model reads
the context followed by each ending, and the loss is taken over the ending's
tokens only: `acc` picks the ending with the lowest summed loss, `acc_norm`
the lowest mean loss per token, as build-nanogpt and llm.c score it (GPT-2
124M: about 0.2955 acc_norm there). This is how a base model that was never
shown the multiple-choice format can still be scored.

The file is the official validation set (fetched on first use into
data/hellaswag/) or --data PATH, one JSON object a line with "ctx",
"endings" (4 texts) and "label" (0-3). --out FILE writes one line per
example: its index, the 4 summed and mean losses, the predictions and the label.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import functools
import http.client
import json
import os
import sys
import urllib.request

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from data.tokenizer import get_tokenizer
from support import cli
from support.device import inference_dtype, pick_device
from support.loading import load_model

HELLASWAG_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
DEFAULT_DATA = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "data",
    "hellaswag",
    "hellaswag_val.jsonl",
)
DOWNLOAD_TIMEOUT_S = 30


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-gpt2"  # the checkpoint folder to score
    # "" = out_dir's checkpoint; or a checkpoint folder, or a Hugging Face GPT-2 folder
    init_from: str = ""
    data: str = ""  # "" = the official validation file, fetched on first use
    out: str = ""  # a .jsonl file for one line per example; "" = none
    limit: int = 0  # score only the first N examples; 0 = all
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    # auto (bfloat16 on a GPU that has it, else float32), float32, bfloat16, float16
    dtype: str = "auto"


class HellaSwagError(ValueError):
    """A HellaSwag file that cannot be used; the message is one line saying what to do."""


# ---------------------------------------------------------------- the examples


def fetch_official(option="--data"):
    """The official validation file at DEFAULT_DATA, downloaded there first if missing;
    option: the caller's setting for a file of one's own, named where that fails."""
    path = DEFAULT_DATA
    if os.path.isfile(path):
        return path
    print(f"downloading HellaSwag's validation set from {HELLASWAG_URL}", file=sys.stderr)
    try:
        with urllib.request.urlopen(HELLASWAG_URL, timeout=DOWNLOAD_TIMEOUT_S) as response:
            data = response.read()
    # URLError is an OSError; a connection cut before its Content-Length, an IncompleteRead
    except (OSError, http.client.HTTPException, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise HellaSwagError(
            f"cannot download HellaSwag ({reason}); fetch {HELLASWAG_URL} "
            f"yourself and put it at {path}, or pass {option}=PATH"
        ) from None
    # a connection closed early, with no length to check, cuts the last example: every
    # example is read before the file is kept, or it would be used from then on
    try:
        lines = data.decode("utf-8").splitlines()
        examples = [
            _example(line, f"its line {i + 1}") for i, line in enumerate(lines) if line.strip()
        ]
    except (UnicodeDecodeError, HellaSwagError) as e:
        raise HellaSwagError(
            f"the download from {HELLASWAG_URL} is damaged ({e}); try again, or fetch it "
            f"yourself and put it at {path}, or pass {option}=PATH"
        ) from None
    if not examples:
        raise HellaSwagError(f"the download from {HELLASWAG_URL} holds no examples; try again")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return path


def _example(line, where):
    try:
        example = json.loads(line)
    except ValueError:
        raise HellaSwagError(f"{where} is not valid JSON") from None
    if not isinstance(example, dict):
        raise HellaSwagError(f"{where} is not a JSON object")
    ctx = example.get("ctx")
    endings = example.get("endings")
    label = example.get("label")
    if not isinstance(ctx, str):
        raise HellaSwagError(f"{where} has no 'ctx' text")
    if not isinstance(endings, list) or len(endings) != 4:
        raise HellaSwagError(f"{where} needs 'endings', a list of 4 texts")
    if not all(isinstance(ending, str) and ending for ending in endings):
        raise HellaSwagError(f"{where}: every ending must be a non-empty text")
    if isinstance(label, bool) or label not in (0, 1, 2, 3):
        raise HellaSwagError(f"{where} needs 'label', the right ending's index 0-3")
    return {"ctx": ctx, "endings": endings, "label": label}


def read_examples(path, limit=0):
    """The examples of a HellaSwag-format .jsonl file, all checked before any is scored."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise HellaSwagError(f"cannot read {path} ({getattr(e, 'strerror', None) or e})") from None
    if limit:
        lines = lines[:limit]
    if not lines:
        raise HellaSwagError(f"{path} holds no examples")
    return [_example(line, f"{path} line {i + 1}") for i, line in enumerate(lines)]


# ---------------------------------------------------------------- scoring


def render(tok, example, block_size):
    """tokens (4, T) of the context followed by each ending, right-padded, and
    mask (4, T), 1 on the ending's tokens: the ones whose loss is counted. A
    context too long for the model loses its start."""
    ctx = tok.encode(example["ctx"])
    # the ending follows the context after a space, as the text would read
    endings = [tok.encode(" " + ending)[:block_size] for ending in example["endings"]]
    rows = []
    for ending in endings:
        keep = block_size - len(ending)
        rows.append((ctx[len(ctx) - keep :] if keep else []) + ending)
    T = max(len(row) for row in rows)
    tokens = torch.zeros(4, T, dtype=torch.long)
    mask = torch.zeros(4, T)
    for i, (row, ending) in enumerate(zip(rows, endings)):
        tokens[i, : len(row)] = torch.tensor(row)
        mask[i, len(row) - len(ending) : len(row)] = 1
    return tokens, mask


@torch.no_grad()
def ending_losses(model, tokens, mask, autocast):
    """(summed, mean) loss (4,) over each ending's tokens."""
    with autocast():
        logits, _ = model(tokens)  # (4, T, vocab)
    losses = F.cross_entropy(
        logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none"
    ).view(4, -1)  # (4, T - 1): the loss of predicting token t + 1
    counted = mask[:, 1:]
    summed = (losses * counted).sum(dim=1)
    return summed, summed / counted.sum(dim=1)


def score(model, tok, examples, device, autocast, indices=None, progress=True, stop=None):
    """One record per example: its index, the 4 summed and mean losses,
    pred (by summed loss), pred_norm (by mean loss) and the label. stop, if given, is
    asked before each index; an index None is only that question. None if stop said so."""
    was_training = model.training
    model.eval()
    records = []
    indices = range(len(examples)) if indices is None else indices
    try:
        for i in tqdm(indices, desc="HellaSwag", unit="example", disable=not progress):
            if stop is not None and stop():
                return None
            if i is None:
                continue
            tokens, mask = render(tok, examples[i], model.config.block_size)
            summed, mean = ending_losses(model, tokens.to(device), mask.to(device), autocast)
            records.append(
                {
                    "index": i,
                    "losses": [round(x, 6) for x in summed.tolist()],
                    "mean_losses": [round(x, 6) for x in mean.tolist()],
                    "pred": int(summed.argmin()),
                    "pred_norm": int(mean.argmin()),
                    "label": examples[i]["label"],
                }
            )
    finally:
        model.train(was_training)
    return records


def accuracy(records):
    """(acc, acc_norm): the share of examples where the summed, and the mean,
    loss picks the right ending."""
    right = sum(r["pred"] == r["label"] for r in records)
    right_norm = sum(r["pred_norm"] == r["label"] for r in records)
    return right / len(records), right_norm / len(records)


# ---------------------------------------------------------------- during training


@functools.lru_cache(maxsize=2)
def training_examples(path):
    """The examples at path (None: the official file), read once per run."""
    return read_examples(path or fetch_official("--hellaswag_data"))


def check_vocabulary(path, tokenizer_desc):
    """HellaSwagError where the examples hold characters a character vocabulary lacks
    (a byte-level BPE encodes any text): found before training, not at its first
    evaluation, which would fail and lose the run."""
    if tokenizer_desc.get("kind") != "char":
        return
    texts = [text for example in training_examples(path) for text in example_texts(example)]
    missing = sorted(set("".join(texts)) - set(tokenizer_desc["chars"]))
    if missing:
        shown = "".join(missing[:12])
        more = "..." if len(missing) > 12 else ""
        raise HellaSwagError(
            f"hellaswag=True: HellaSwag's texts hold {len(missing)} characters this dataset's "
            f"vocabulary lacks ({shown!r}{more}); score it with a BPE dataset "
            "(--dataset=shakespeare, say), or leave hellaswag off"
        )


def example_texts(example):
    """The texts render() encodes: the context, and each ending after a space."""
    return [example["ctx"]] + [" " + ending for ending in example["endings"]]


def training_scores(model, tokenizer_desc, path, device, autocast, rank=0, world=1, stop=None):
    """{'hellaswag_acc', 'hellaswag_acc_norm'} for train.py's evaluation: each
    process scores every world-th example, and the counts are summed. stop (a
    collective under torchrun) is asked before every example, as often in every
    process; None if it said to stop."""
    examples = training_examples(path)
    tok = get_tokenizer(tokenizer_desc)
    mine = list(range(rank, len(examples), world))
    rounds = -(-len(examples) // world)
    # a process with one example fewer still asks stop in the last round
    indices = mine + [None] * (rounds - len(mine))
    records = score(model, tok, examples, device, autocast, indices, progress=False, stop=stop)
    if records is None:
        return None
    counts = torch.tensor(
        [
            sum(r["pred"] == r["label"] for r in records),
            sum(r["pred_norm"] == r["label"] for r in records),
            len(records),
        ],
        dtype=torch.float64,
        device=device,
    )
    if world > 1 and dist.is_initialized():
        dist.all_reduce(counts)
    return {
        "hellaswag_acc": (counts[0] / counts[2]).item(),
        "hellaswag_acc_norm": (counts[1] / counts[2]).item(),
    }


# ---------------------------------------------------------------- command line


def write_records(path, records):
    """One JSON line per example, written beside `path` and renamed into place."""
    try:
        with open(path + ".tmp", "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        os.replace(path + ".tmp", path)
    except OSError as e:
        raise HellaSwagError(f"cannot write {path} ({e.strerror or e})") from None


def main(cfg):
    if not isinstance(cfg.limit, int) or cfg.limit < 0:
        raise HellaSwagError(f"--limit must be 0 (all) or a positive number, got {cfg.limit!r}")
    path = str(cfg.data) if cfg.data else fetch_official()
    examples = read_examples(path, cfg.limit)
    device = pick_device(cfg.device)
    dtype = inference_dtype(cfg.dtype, device)
    model, tok, _ = load_model(cfg.init_from, cfg.out_dir)
    model.to(device=device, dtype=dtype)
    records = score(
        model, tok, examples, device, lambda: torch.autocast(device.type, enabled=False)
    )
    acc, acc_norm = accuracy(records)
    if cfg.out:
        write_records(str(cfg.out), records)
    print(f"HellaSwag on {len(records)} examples of {path}: acc {acc:.4f}, acc_norm {acc_norm:.4f}")


def run(argv):
    """The command: what `python -m support.hellaswag ...` exits with (cli.py)."""
    return cli.run(main, argv, __doc__, Settings, (HellaSwagError,))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
