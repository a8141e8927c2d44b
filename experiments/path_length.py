"""
Self-attention against recurrence: the path a signal travels, and the steps that must run
one after another, measured.

    python -m experiments.path_length [--out_dir=DIR]
    python -m experiments.path_length --out_dir=docs   # the figures of docs/path_length.md

Part 1, path length. A sequence opens with one marked token (one of 8), then n - 1
unmarked ones (16 others, drawn at random), then a query; the answer at the query is the
marked token, n positions back. In a recurrent network it has to survive n steps of the
state being rewritten; in one attention layer the query reaches it in one step, whatever
n. Each model trains --steps steps per n (fresh sequences, Adam), then answers 500 new ones:
    rnn        a plain tanh RNN (nn.RNN), the recurrence of the lectures' diagrams
    gru        a gated one (nn.GRU), the kind the encoder-decoder of seq2seq.py uses
    attention  one causal attention layer, softmax(Q K^T / sqrt(d)) V, no position input
All of the same width, each reading out the answer from the query's position.

Part 2, parallelism. A forward and backward pass of a GRU layer (T steps, one after the
other) and of one attention layer (its T x T scores in one batched matmul), same width,
batch 8, one thread, against T: the median CPU time of --repeats passes.

Writes path_length.json and path_length.png into --out_dir (default out-experiments/path_length/);
docs/path_length.md reads the ones in docs/.
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import json
import math
import statistics
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

from bench.common import cpu_class
from experiments import SCRATCH
from support import cli
from support.configurator import ConfigError


@dataclasses.dataclass
class Settings:
    out_dir: str = os.path.join(SCRATCH, "path_length")  # --out_dir=docs: the shipped figures
    distances: tuple = (2, 4, 8, 16, 32, 64, 128, 256)  # part 1: n
    steps: int = 400  # part 1: training steps per model and n
    batch_size: int = 64
    width: int = 64
    lengths: tuple = (16, 32, 64, 128, 256, 512, 1024, 2048)  # part 2: T
    timing_width: int = 128
    repeats: int = 5  # part 2: timings per T, the median kept
    seed: int = 0


MARKED = 8  # tokens 0..7 are the marked ones, the answers
UNMARKED = 16  # tokens 8..23 fill the gap
QUERY = MARKED + UNMARKED  # token 24 asks for the answer
VOCAB = QUERY + 1
KINDS = ("rnn", "gru", "attention")


class Recurrent(nn.Module):
    """An embedding, one recurrent layer, and a readout of the last state."""

    def __init__(self, kind, width):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        if kind == "rnn":
            self.rnn = nn.RNN(width, width, batch_first=True)
        else:
            self.rnn = nn.GRU(width, width, batch_first=True)
        self.out = nn.Linear(width, MARKED)

    def forward(self, x):
        h, _ = self.rnn(self.embed(x))  # (B, T, C): state t has read tokens 0..t
        return self.out(h[:, -1])  # (B, MARKED)


class AttentionLayer(nn.Module):
    """One causal attention layer: each position's query against the keys at or before it,
    the weights from softmax(Q K^T / sqrt(d)), the output a mix of the values, added to its
    input. No position input: the marked token is found by what it is, not where."""

    def __init__(self, width):
        super().__init__()
        self.W_Q = nn.Linear(width, width, bias=False)
        self.W_K = nn.Linear(width, width, bias=False)
        self.W_V = nn.Linear(width, width, bias=False)

    def forward(self, x):
        T = x.size(1)
        q = self.W_Q(x)  # (B, T, C)
        k = self.W_K(x)  # (B, T, C)
        v = self.W_V(x)  # (B, T, C)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.size(-1))  # (B, T, T), one batched matmul
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)  # (T, T)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # (B, T, T)
        return x + weights @ v  # (B, T, C)


class Attending(nn.Module):
    """An embedding, one AttentionLayer, and a readout at the last position."""

    def __init__(self, width):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.attn = AttentionLayer(width)
        self.out = nn.Linear(width, MARKED)

    def forward(self, x):
        h = self.attn(self.embed(x))  # (B, T, C)
        return self.out(h[:, -1])  # (B, MARKED)


def make(kind, width):
    if kind == "attention":
        return Attending(width)
    return Recurrent(kind, width)


def sequences(n, count, gen):
    """(count, n + 1) token ids: a marked token, n - 1 unmarked ones, the query; and the
    answers (count,), the marked tokens."""
    answers = torch.randint(0, MARKED, (count,), generator=gen)
    gap = torch.randint(MARKED, QUERY, (count, n - 1), generator=gen)
    query = torch.full((count, 1), QUERY)
    return torch.cat([answers[:, None], gap, query], dim=1), answers


def recall(kind, n, cfg):
    """Train a fresh model on distance n; its accuracy on 500 new sequences."""
    torch.manual_seed(cfg.seed)
    model = make(kind, cfg.width)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(cfg.seed + n)
    for _ in range(cfg.steps):
        x, y = sequences(n, cfg.batch_size, gen)
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    x, y = sequences(n, 500, torch.Generator().manual_seed(10_000 + n))
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


def part_recall(cfg):
    from tqdm import tqdm

    out = {kind: [] for kind in KINDS}
    jobs = [(kind, n) for n in cfg.distances for kind in KINDS]
    for kind, n in tqdm(jobs, desc="recall", disable=None):
        out[kind].append(recall(kind, n, cfg))
    return out


def time_pass(layer, x, repeats):
    """The median CPU seconds of a forward and backward pass of layer on x. CPU time of
    this process, one thread: on a machine other jobs share, the wall clock would count
    their turns too."""
    times = []
    for i in range(repeats + 1):
        start = time.process_time()
        out = layer(x)
        if isinstance(out, tuple):
            out = out[0]  # nn.GRU returns (states, last state)
        out.sum().backward()
        if i > 0:  # the first pass warms up
            times.append(time.process_time() - start)
    return statistics.median(times)


def part_timing(cfg):
    """Forward + backward seconds of a GRU layer and an attention layer against T."""
    C = cfg.timing_width
    torch.manual_seed(cfg.seed)
    gru = nn.GRU(C, C, batch_first=True)
    attention = AttentionLayer(C)
    out = dict(T=list(cfg.lengths), gru_seconds=[], attention_seconds=[])
    for T in cfg.lengths:
        x = torch.randn(8, T, C, requires_grad=True)
        out["gru_seconds"].append(time_pass(gru, x, cfg.repeats))
        out["attention_seconds"].append(time_pass(attention, x, cfg.repeats))
        print(
            f"T = {T}: GRU {out['gru_seconds'][-1] * 1e3:.1f} ms, "
            f"attention {out['attention_seconds'][-1] * 1e3:.1f} ms",
            file=sys.stderr,
        )
    return out


def plot(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    n = data["distances"]
    styles = {
        "rnn": ("tab:gray", "plain RNN"),
        "gru": ("black", "GRU"),
        "attention": ("tab:red", "one attention layer"),
    }
    for kind, (color, label) in styles.items():
        left.plot(n, data["recall"][kind], "o-", color=color, label=label)
    left.axhline(1 / MARKED, color="grey", ls=":", lw=1)
    left.text(n[0], 1 / MARKED + 0.02, "chance", color="grey", fontsize=8)
    left.set_xscale("log", base=2)
    left.set_ylim(-0.02, 1.02)
    left.set_xlabel("n: how far back the answer is")
    left.set_ylabel("accuracy")
    left.set_title(f"Recalling a token n positions back ({data['settings']['steps']} steps each)")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    t = data["timing"]
    lines = [
        ("gru_seconds", "black", "GRU layer (T steps in order)"),
        ("attention_seconds", "tab:red", "attention layer (one matmul)"),
    ]
    for key, color, label in lines:
        right.plot(t["T"], [s * 1e3 for s in t[key]], "o-", color=color, label=label)
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("T (sequence length)")
    right.set_ylabel("forward + backward, CPU ms (median)")
    right.set_title(f"Batch 8, width {data['settings']['timing_width']}, one thread")
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def check(cfg):
    for key in ("distances", "lengths"):
        values = getattr(cfg, key)
        if isinstance(values, int):
            values = (values,)
        if not isinstance(values, (tuple, list)) or not values:
            raise ConfigError(f"--{key} expects numbers like (2, 4, 8), got {values!r}")
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise ConfigError(f"--{key} must be whole numbers of at least 1, got {values!r}")
        setattr(cfg, key, sorted(set(values)))
    for key in ("steps", "batch_size", "width", "timing_width", "repeats"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"--{key} must be at least 1, got {getattr(cfg, key)}")


def main(cfg):
    check(cfg)
    cli.output_folder(cfg.out_dir)
    torch.set_num_threads(1)
    load_before = round(os.getloadavg()[0], 2)
    cpu = time.process_time()
    data = dict(distances=cfg.distances, recall=part_recall(cfg), timing=part_timing(cfg))
    data["settings"] = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "out_dir"}
    data["machine"] = dict(
        cpu=cpu_class(),
        load_average_before=load_before,
        load_average_after=round(os.getloadavg()[0], 2),
    )
    data["cpu_seconds"] = round(time.process_time() - cpu, 1)
    path = os.path.join(cfg.out_dir, "path_length")
    with open(path + ".json", "w") as f:
        json.dump(data, f, indent=1)
    plot(data, path + ".png")
    print(f"wrote {path}.json and {path}.png")


def run(argv):
    """The command: main() with --help, and bad input as one line (support/cli.py)."""
    return cli.run(main, argv, __doc__, Settings)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
