"""
Why attention divides its scores by sqrt(d), measured.

    python -m experiments.why_sqrt_d [--out_dir=DIR]
    python -m experiments.why_sqrt_d --out_dir=docs   # the figures of docs/why_sqrt_d.md

Part 1, the lecture's argument with random vectors. For q and k with independent
unit-variance entries, q . k is a sum of d terms of variance 1: its variance is d, and
divided by sqrt(d) it is 1. For each d from 4 to 1024, n keys per query:
    - the variance of the scores, unscaled and scaled;
    - the softmax over the n keys: its largest weight and its entropy (ln n when uniform);
    - the gradient reaching the scores, dL/ds, for a fixed downstream loss
      L = sum_i alpha_i u_i (u_i a fixed random value per key): its norm per query,
      mean and median;
    - the gradient reaching q itself, dL/dq = sum_i dL/ds_i dk_i: the keys' norm grows
      like sqrt(d) and partly makes up for a smaller dL/ds.
Computed in float64, so that the tiny gradients of a saturated softmax are not rounded to 0.

Part 2, model.py's GPT with one head of a large size (--head_size) on the toy translation
of experiments/toy_translation.py, trained --steps steps with the scale and without it.
Its attention is recomputed in the open by hooks (ExplicitAttention), so that the scores
exist as a tensor with a gradient; the unscaled run differs only in the factor. Two
initialisations: GPT-2's (weights of std 0.02, which makes q and k small) and one that
gives q and k unit-variance entries (the lecture's assumption). At initialisation and after
training: the scores' variance, the largest weight, the entropy, the gradient reaching the
scores and the one reaching W_Q; during training the loss; at the end greedy accuracy.

Writes why_sqrt_d.json and why_sqrt_d.png into --out_dir (default out-experiments/why_sqrt_d/);
docs/why_sqrt_d.md reads the ones in docs/.
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import json
import math
import time

import torch

from bench.common import cpu_class
from experiments import SCRATCH
from experiments import toy_translation as task
from experiments.explicit_attention import explicit_attention
from experiments.seq2seq import EOS
from model import GPT, GPTConfig
from support import cli
from support.configurator import ConfigError


@dataclasses.dataclass
class Settings:
    out_dir: str = os.path.join(SCRATCH, "why_sqrt_d")  # --out_dir=docs: the shipped figures
    d_max: int = 1024  # part 1: d = 4, 8, ..., d_max
    n_keys: int = 64  # part 1: keys per query
    samples: int = 2000  # part 1: queries per d
    head_size: int = 256  # part 2: the GPT's one head (n_embd = head_size)
    n_layer: int = 2  # part 2
    steps: int = 300  # part 2: training steps per run
    batch_size: int = 32  # part 2
    longest: int = 16  # part 2: the longest source sentence
    lr: float = 1e-3  # part 2: Adam
    seed: int = 0


# Part 1 ----------
def random_attention(d, n, samples, gen, chunk=250):
    """The part-1 measures for one d, unscaled and scaled on the same random q, k, u."""
    sums = {}
    for start in range(0, samples, chunk):
        m = min(chunk, samples - start)
        q = torch.randn(m, d, generator=gen, dtype=torch.float64)  # (m, d)
        k = torch.randn(m, n, d, generator=gen, dtype=torch.float64)  # (m, n, d)
        u = torch.randn(m, n, generator=gen, dtype=torch.float64)  # (m, n) a value per key
        for scaled in (False, True):
            for name, values in softmax_measures(q, k, u, scaled).items():
                sums.setdefault((name, scaled), []).append(values)
    out = {}
    for (name, scaled), parts in sums.items():
        values = torch.cat(parts)  # (samples,)
        suffix = "scaled" if scaled else "unscaled"
        if name == "scores":
            out[f"var_{suffix}"] = values.var().item()
            continue
        out[f"{name}_{suffix}"] = values.mean().item()
        if name in ("grad", "grad_q"):
            out[f"{name}_median_{suffix}"] = values.median().item()
    return out


def softmax_measures(q, k, u, scaled):
    """Per query: its scores, largest weight, entropy, |dL/ds| and |dL/dq| for
    L = sum_i alpha_i u_i, by autograd."""
    q = q.clone().requires_grad_(True)
    s = (k @ q[:, :, None]).squeeze(-1)  # (m, n, d) @ (m, d, 1) -> (m, n): q . k_i
    if scaled:
        s = s / math.sqrt(q.size(-1))
    s.retain_grad()
    alpha = torch.softmax(s, dim=-1)  # (m, n)
    L = (alpha * u).sum()  # the queries are independent, so their gradients are their own
    L.backward()
    entropy = -(alpha * torch.log(alpha.clamp_min(1e-300))).sum(-1)  # (m,)
    return dict(
        scores=s.detach().flatten(),
        max_weight=alpha.detach().amax(-1),
        entropy=entropy.detach(),
        grad=s.grad.norm(dim=-1),
        grad_q=q.grad.norm(dim=-1),
    )


def part_random(cfg):
    gen = torch.Generator().manual_seed(cfg.seed)
    d = 4
    rows = []
    while d <= cfg.d_max:
        row = random_attention(d, cfg.n_keys, cfg.samples, gen)
        row["d"] = d
        rows.append(row)
        print(
            f"d = {d:4d}: var {row['var_unscaled']:.1f} / {row['var_scaled']:.2f}", file=sys.stderr
        )
        d *= 2
    return {key: [row[key] for row in rows] for key in rows[0]}


# Part 2 ----------
def make_gpt(cfg, init, scaled):
    """The part-2 model and its hooks. init "gpt2": model.py's own; "unit": W_Q and W_K of
    std 1/sqrt(C), so that q and k of a LayerNormed input have unit-variance entries."""
    torch.manual_seed(cfg.seed)
    C = cfg.head_size
    config = GPTConfig(
        block_size=2 * cfg.longest + 1,
        vocab_size=task.GPT_VOCAB,
        n_layer=cfg.n_layer,
        n_head=1,
        n_embd=C,
        dropout=0.0,
        rope=True,  # as in bottleneck.py: the task's lookup is a fixed relative offset
    )
    model = GPT(config)
    if init == "unit":
        with torch.no_grad():
            for block in model.transformer.h:
                block.attn.c_attn.weight[: 2 * C].normal_(0.0, 1.0 / math.sqrt(C))
    scale = None  # the model's own, 1 / sqrt(C)
    if not scaled:
        scale = 1.0
    return model, explicit_attention(model, scale)


def gpt_measures(model, hooks, idx, targets, s_max):
    """Per layer, on one batch: the variance of q . k and of the scores as used, the largest
    weight and the entropy of the target positions' rows, and the gradient norms reaching
    the scores (per row, mean) and W_Q (the whole matrix)."""
    model.zero_grad()
    _, loss = model(idx, targets)
    loss.backward()
    C = model.config.n_embd
    layers = []
    for block, hook in zip(model.transformer.h, hooks):
        raw = hook.q @ hook.k.transpose(-2, -1)  # (B, 1, T, T)
        T = raw.size(-1)
        seen = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T) the causal pairs
        rows = hook.weights[:, :, s_max:]  # (B, 1, T - s_max, T): the target part's rows
        entropy = -(rows * torch.log(rows.clamp_min(1e-30))).sum(-1)
        grad_rows = hook.scores.grad[:, :, s_max:].norm(dim=-1)  # (B, 1, T - s_max)
        layers.append(
            dict(
                var_qk=raw.detach()[..., seen].var().item(),
                var_scores=hook.scores.detach()[..., seen].var().item(),
                max_weight=rows.detach().amax(-1).mean().item(),
                entropy=entropy.detach().mean().item(),
                grad_scores=grad_rows.mean().item(),
                grad_scores_median=grad_rows.median().item(),
                grad_W_Q=block.attn.c_attn.weight.grad[:C].norm().item(),
            )
        )
    model.zero_grad()
    return layers


@torch.no_grad()
def gpt_accuracy(model, s_max, length, n, gen):
    """Greedy per-token accuracy on n sentences of one length, as bottleneck.py scores it."""
    src, _, y_out, _ = task.batch(torch.full((n,), length), gen)
    idx = task.gpt_prompt(src, s_max)  # (n, s_max + 1)
    for _ in range(length):
        logits, _ = model(idx)
        idx = torch.cat([idx, logits[:, -1:].argmax(-1)], dim=1)
    pred = idx[:, s_max + 1 :] - task.SRC_VOCAB  # (n, length)
    ended = (pred == EOS).long().cumsum(1) > 0
    return ((pred == y_out[:, :length]) & ~ended).float().mean().item()


def train_gpt(cfg, init, scaled):
    model, hooks = make_gpt(cfg, init, scaled)
    s_max = cfg.longest
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    probe_lengths = torch.full((cfg.batch_size,), s_max)
    src, _, y_out, _ = task.batch(probe_lengths, torch.Generator().manual_seed(123))
    probe = task.gpt_layout(src, y_out, s_max)
    before = gpt_measures(model, hooks, *probe, s_max)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses = []
    t0 = time.process_time()
    for step in range(cfg.steps):
        lengths = task.training_lengths(cfg.batch_size, 3, s_max, gen)
        src, _, y_out, _ = task.batch(lengths, gen)
        idx, targets = task.gpt_layout(src, y_out, s_max)
        _, loss = model(idx, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    seconds = time.process_time() - t0
    after = gpt_measures(model, hooks, *probe, s_max)
    accuracy = gpt_accuracy(model, s_max, s_max, 200, torch.Generator().manual_seed(99))
    return dict(
        losses=losses,
        before=before,
        after=after,
        accuracy=accuracy,
        cpu_seconds=seconds,
    )


def part_gpt(cfg):
    runs = {}
    for init in ("gpt2", "unit"):
        for scaled in (True, False):
            name = f"{init}_{'scaled' if scaled else 'unscaled'}"
            print(f"training the GPT, {name} ...", file=sys.stderr)
            runs[name] = train_gpt(cfg, init, scaled)
    return runs


# The figure ----------
def plot(results, path):
    """One figure: five panels of part 1 against d, and part 2's training losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = results["d"]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.5))
    uniform = math.log(results["n_keys"])
    panels = [
        ("var", "variance of the scores", "log"),
        ("max_weight", "largest softmax weight", "linear"),
        ("entropy", f"softmax entropy (nats; uniform = {uniform:.2f})", "linear"),
        ("grad", "|dL/ds| per query: mean (solid), median (dashed)", "log"),
        ("grad_q", "|dL/dq| per query: mean (solid), median (dashed)", "log"),
    ]
    for ax, (key, title, yscale) in zip(axes.flat, panels):
        ax.plot(d, results[f"{key}_unscaled"], "o-", color="tab:red", label="q . k")
        ax.plot(d, results[f"{key}_scaled"], "o-", color="tab:blue", label="q . k / sqrt(d)")
        if key.startswith("grad"):
            ax.plot(d, results[f"{key}_median_unscaled"], "o--", color="tab:red")
            ax.plot(d, results[f"{key}_median_scaled"], "o--", color="tab:blue")
        ax.set_xscale("log", base=2)
        ax.set_yscale(yscale)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("d")
        ax.grid(alpha=0.3)
    axes[0, 0].legend()

    ax = axes[1, 2]
    colors = {"gpt2": "tab:green", "unit": "tab:purple"}
    for name, run in results["gpt"].items():
        init, _, scaling = name.partition("_")
        window = max(1, len(run["losses"]) // 30)
        smooth = torch.tensor(run["losses"]).unfold(0, window, window).mean(1)
        steps = torch.arange(len(smooth)) * window + window / 2
        style = "-"
        if scaling == "unscaled":
            style = "--"
        label = f"{init} init, {scaling}: accuracy {run['accuracy']:.2f}"
        ax.plot(steps, smooth, style, color=colors[init], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss")
    ax.set_title(f"model.py's GPT, one head of size {results['head_size']}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.suptitle(
        f"Random q, k with unit-variance entries, {results['n_keys']} keys per query, "
        "and a GPT trained with and without the scale",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path + ".png", dpi=80)
    plt.close(fig)


def main(cfg):
    for key in ("d_max", "n_keys", "samples", "head_size", "n_layer", "steps", "batch_size"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"--{key} must be at least 1, got {getattr(cfg, key)}")
    if cfg.d_max < 4:
        raise ConfigError(f"--d_max must be at least 4, got {cfg.d_max}")
    if cfg.longest < 3:
        raise ConfigError(f"--longest must be at least 3, got {cfg.longest}")
    cli.output_folder(cfg.out_dir)
    torch.set_num_threads(1)
    t0 = time.process_time()
    results = part_random(cfg)
    results["n_keys"] = cfg.n_keys
    results["samples"] = cfg.samples
    results["head_size"] = cfg.head_size
    results["gpt"] = part_gpt(cfg)
    results["cpu_seconds"] = round(time.process_time() - t0, 1)
    results["machine"] = dict(cpu=cpu_class(), load_average=round(os.getloadavg()[0], 2))
    path = os.path.join(cfg.out_dir, "why_sqrt_d")
    with open(path + ".json", "w") as f:
        json.dump(results, f, indent=1)
    plot(results, path)
    print(f"wrote {path}.json and {path}.png")


def run(argv):
    """The command: main() with --help, and bad input as one line (support/cli.py)."""
    return cli.run(main, argv, __doc__, Settings)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
