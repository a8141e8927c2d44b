"""
The lectures' first chapter, run: an RNN encoder-decoder squeezes the source into one
vector and collapses on long sentences; attention lets its decoder pull from every encoder
state; a decoder-only GPT does the same with self-attention over source and target at once.

    python -m experiments.bottleneck [--quick] [--out_dir=DIR]

One toy translation (experiments/toy_translation.py: a fixed dictionary, adjectives moved
after their noun, so the true alignment is known). Six models train on the same batches,
sentences of every length from 3 words to the longest scored, for the same number of steps:
    none                  the encoder-decoder without attention (experiments/seq2seq.py)
    additive              Bahdanau's decoder and score
    dot, general, concat  Luong's decoder with each of his scores
    gpt                   model.py's GPT: source, separator and target in one causal sequence
Each is then scored by greedy decoding (its own outputs fed back, no teacher forcing) on the
same held-out sentences of each length: the per-token accuracy. The attention weights of
that decoding give aligned_mass, the mean weight on the truly aligned source word (for the
GPT, of its best head: the query that predicts target word j against the source words).

Writes into --out_dir (default docs/): bottleneck.json, bottleneck.png (accuracy against
length; the training losses), bottleneck_alignment.png (one heatmap per attention model on
one sentence, the true alignment marked) and bottleneck.md, which reads them. --quick runs
shorter sentences for fewer steps. --jobs models train at once, one thread each.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import json
import math
import multiprocessing
import os
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch
import torch.nn.functional as F

from bench.common import cpu_class
from experiments import toy_translation as task
from experiments.explicit_attention import explicit_attention
from experiments.seq2seq import EOS, PAD, Seq2Seq, Seq2SeqConfig
from model import GPT, GPTConfig
from support import cli
from support.configurator import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = ("none", "additive", "dot", "general", "concat", "gpt")
CROSS_ATTENTION = ("additive", "dot", "general", "concat")
LABELS = {
    "none": "no attention (the bottleneck)",
    "additive": "Bahdanau (additive)",
    "dot": "Luong (dot)",
    "general": "Luong (general)",
    "concat": "Luong (concat)",
    "gpt": "GPT (self-attention)",
}
COLORS = {
    "none": "black",
    "additive": "tab:red",
    "dot": "tab:blue",
    "general": "tab:green",
    "concat": "tab:orange",
    "gpt": "tab:purple",
}

# the sizes a run has unless its options say otherwise
FULL = dict(lengths=(5, 10, 15, 20, 25, 30, 35, 40, 45, 50), steps=2500, eval_sentences=200)
QUICK = dict(lengths=(4, 8, 12, 16, 20, 24, 28), steps=1200, eval_sentences=100)

DEFAULTS = dict(
    out_dir=os.path.join(ROOT, "docs"),
    quick=False,  # the QUICK sizes instead of FULL
    lengths=None,  # the source lengths scored; None: the sizes'
    steps=None,  # training steps of every model; None: the sizes'
    eval_sentences=None,  # held-out sentences per length; None: the sizes'
    models=MODELS,  # which to train, any of these
    batch_size=64,
    lr=3e-3,  # Adam's peak; warmed up over 100 steps, then cosine to a tenth
    hidden_size=64,  # the encoder's per direction: encoder states and decoders are twice that
    bidirectional=True,  # the encoder reads both ways, as Bahdanau's; False: left to right
    gpt_layers=2,
    gpt_heads=4,
    gpt_embd=64,
    jobs=2,  # models trained at once, in processes of one thread each
    seed=0,
)


# Settings ----------
def settings(cfg):
    """The options, the sizes filled in and checked; a ConfigError for anything wrong."""
    cfg = dict(cfg)
    sizes = FULL
    if cfg["quick"]:
        sizes = QUICK
    for key, value in sizes.items():
        if cfg[key] is None:
            cfg[key] = value
    lengths = cfg["lengths"]
    if isinstance(lengths, int):
        lengths = (lengths,)
    if not isinstance(lengths, (tuple, list)) or not lengths:
        raise ConfigError(f"--lengths expects lengths like (5, 10, 20), got {lengths!r}")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 3 for n in lengths):
        raise ConfigError(f"--lengths must be whole numbers of at least 3, got {lengths!r}")
    cfg["lengths"] = sorted(set(lengths))
    models = cfg["models"]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        raise ConfigError(f"--models: {unknown or 'none given'}; choose from {', '.join(MODELS)}")
    cfg["models"] = [m for m in MODELS if m in models]
    for key in ("steps", "eval_sentences", "batch_size", "hidden_size", "jobs"):
        whole_number(cfg, key, 1)
    for key in ("gpt_layers", "gpt_heads", "gpt_embd"):
        whole_number(cfg, key, 1)
    if cfg["gpt_embd"] % cfg["gpt_heads"]:
        raise ConfigError("--gpt_embd must be a multiple of --gpt_heads")
    if not cfg["lr"] > 0:
        raise ConfigError(f"--lr must be positive, got {cfg['lr']}")
    return cfg


def whole_number(cfg, key, least):
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"--{key} must be a whole number of at least {least}, got {value!r}")


# The models ----------
def build(name, cfg):
    """A fresh model by name, its weights drawn from the run's seed."""
    torch.manual_seed(cfg["seed"])
    if name == "gpt":
        s_max = max(cfg["lengths"])
        config = GPTConfig(
            block_size=2 * s_max + 1,
            vocab_size=task.GPT_VOCAB,
            n_layer=cfg["gpt_layers"],
            n_head=cfg["gpt_heads"],
            n_embd=cfg["gpt_embd"],
            dropout=0.0,
            # rotary positions: what the layout asks of it is a fixed relative offset
            rope=True,
        )
        return GPT(config)
    config = Seq2SeqConfig(
        task.SRC_VOCAB,
        task.TGT_VOCAB,
        attention=name,
        hidden_size=cfg["hidden_size"],
        bidirectional=cfg["bidirectional"],
    )
    return Seq2Seq(config)


def loss_of(model, name, batch, s_max):
    """The cross-entropy of the target words and EOS, teacher-forced."""
    src, lengths, y_in, y_out = batch
    if name == "gpt":
        idx, targets = task.gpt_layout(src, y_out, s_max)
        _, loss = model(idx, targets)
        return loss
    logits, _ = model(src, lengths, y_in)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), y_out.flatten(), ignore_index=PAD)


def learning_rate(step, cfg):
    """Linear warmup over 100 steps, then a cosine from the peak down to a tenth of it."""
    peak = cfg["lr"]
    warmup = min(100, cfg["steps"] // 10 + 1)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg["steps"] - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, name, cfg, slot):
    """cfg["steps"] Adam steps on the run's batches (the same for every model). Returns the
    losses and the CPU and wall seconds spent."""
    from tqdm import tqdm

    s_max = max(cfg["lengths"])
    gen = torch.Generator().manual_seed(cfg["seed"])
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    losses = []
    cpu = time.process_time()
    wall = time.perf_counter()
    bar = tqdm(total=cfg["steps"], desc=f"{name:>8}", position=slot, leave=True, disable=None)
    for step in range(cfg["steps"]):
        lengths = task.training_lengths(cfg["batch_size"], 3, s_max, gen)
        src, y_in, y_out, _ = task.batch(lengths, gen)
        loss = loss_of(model, name, (src, lengths, y_in, y_out), s_max)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        optimizer.zero_grad()
        loss.backward()
        # the recurrent models' gradients can spike on a long batch
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        bar.update()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    bar.close()
    return losses, time.process_time() - cpu, time.perf_counter() - wall


# Greedy decoding and the alignment ----------
@torch.no_grad()
def decode(model, name, src, lengths, steps, s_max):
    """Greedy decoding of `steps` target words -> tokens (B, steps) in the target vocabulary,
    and the attention of each step over the source (B, heads, steps, S): one "head" for an
    encoder-decoder, every (layer, head) of the GPT; None without attention."""
    if name != "gpt":
        tokens, weights = model.greedy(src, lengths, steps)
        if weights is None:
            return tokens, None
        return tokens, weights[:, None]  # (B, 1, steps, S)
    S = src.size(1)
    idx = task.gpt_prompt(src, s_max)  # (B, s_max + 1)
    for _ in range(steps):
        logits, _ = model(idx)
        idx = torch.cat([idx, logits[:, -1:].argmax(-1)], dim=1)
    # the attention once more, in the open, over everything but the last word: the query at
    # s_max + j (SEP, then target word j - 1) predicts target word j
    hooks = explicit_attention(model)
    model(idx[:, :-1])
    maps = torch.cat([hook.weights for hook in hooks], dim=1)  # (B, layers heads, T, T)
    for hook in hooks:
        hook.remove()
    weights = maps[:, :, s_max : s_max + steps, :S]  # (B, layers heads, steps, S)
    tokens = idx[:, s_max + 1 :] - task.SRC_VOCAB  # (B, steps)
    return tokens, weights


def aligned_weight(weights, align):
    """The weight each step puts on its true source word: (B, heads, T, S) and align (B, T)
    -> (B, heads, T)."""
    index = align[:, None, :, None].expand(-1, weights.size(1), -1, 1)  # (B, heads, T, 1)
    return torch.gather(weights, 3, index).squeeze(-1)


def alignment_masses(weights, align):
    """Per head, summed over sentences and steps: the weight on the true source word
    ("aligned"), on it or a neighbour ("near"), and, at the steps whose word a swap moved,
    the weight on the true word ("at_swaps") and on source word j at step j
    ("diagonal_at_swaps": where attention that ignores the swap looks).
    weights (B, heads, T, S), align (B, T). Returns the sums and the swapped steps' count."""
    S = weights.size(-1)
    steps = torch.arange(align.size(1))  # (T,)
    swapped = align != steps  # (B, T)
    distance = (torch.arange(S)[None, None, :] - align[:, :, None]).abs()  # (B, T, S)
    aligned = aligned_weight(weights, align)  # (B, heads, T)
    near = (weights * (distance <= 1)[:, None]).sum(-1)  # (B, heads, T)
    diagonal = weights[:, :, steps, steps]  # (B, heads, T)
    sums = dict(
        aligned=aligned.sum(dim=(0, 2)),
        near=near.sum(dim=(0, 2)),
        at_swaps=(aligned * swapped[:, None]).sum(dim=(0, 2)),
        diagonal_at_swaps=(diagonal * swapped[:, None]).sum(dim=(0, 2)),
    )
    return sums, swapped.sum().item()


def evaluate(model, name, cfg):
    """Greedy accuracy per length, and per head the means of alignment_masses (None
    without attention)."""
    model.eval()
    s_max = max(cfg["lengths"])
    accuracy = {}
    sums = None
    count = 0
    swapped = 0
    for L in cfg["lengths"]:
        gen = torch.Generator().manual_seed(1000 + L)  # the same sentences for every model
        lengths = torch.full((cfg["eval_sentences"],), L)
        src, _, y_out, align = task.batch(lengths, gen)
        tokens, weights = decode(model, name, src, lengths, L, s_max)
        ended = (tokens == EOS).long().cumsum(dim=1) > 0  # a word after EOS was never said
        correct = (tokens == y_out[:, :L]) & ~ended  # (B, L)
        accuracy[str(L)] = correct.float().mean().item()
        if weights is None:
            continue
        masses, n_swapped = alignment_masses(weights, align)
        if sums is None:
            sums = {key: torch.zeros_like(value) for key, value in masses.items()}
        for key, value in masses.items():
            sums[key] += value
        count += L * cfg["eval_sentences"]
        swapped += n_swapped
    if sums is None:
        return accuracy, None
    means = {}
    for key, value in sums.items():
        steps = count
        if key in ("at_swaps", "diagonal_at_swaps"):
            steps = max(swapped, 1)
        means[key] = (value / steps).tolist()
    means["swapped_share"] = swapped / count
    return accuracy, means


def example_sentence(length):
    """The sentence every heatmap shows: the first drawn with at least two swapped pairs."""
    gen = torch.Generator().manual_seed(7)
    while True:
        src, _, y_out, align = task.batch(torch.full((1,), length), gen)
        swaps = (align[0] != torch.arange(length)).sum().item() // 2
        if swaps >= 2:
            return src, y_out, align


def example(model, name, cfg, head):
    """The model's greedy translation of the example sentence and its weights there."""
    L = min(16, max(cfg["lengths"]))
    src, y_out, align = example_sentence(L)
    tokens, weights = decode(model, name, src, torch.tensor([L]), L, max(cfg["lengths"]))
    return dict(
        source=src[0].tolist(),
        reference=y_out[0, :L].tolist(),
        align=align[0].tolist(),
        output=tokens[0].tolist(),
        weights=weights[0, head].tolist(),  # (L, L)
    )


def run_model(name, cfg, slot):
    """Train one model, score it, and return what the JSON and the figures need."""
    torch.set_num_threads(1)
    model = build(name, cfg)
    losses, cpu_seconds, wall_seconds = train(model, name, cfg, slot)
    eval_cpu = time.process_time()
    accuracy, masses = evaluate(model, name, cfg)
    result = dict(
        accuracy=accuracy,
        params=model.num_params(),
        train_seconds=cpu_seconds,
        train_wall_seconds=wall_seconds,
        losses=losses,
    )
    if masses is not None:
        per_head = masses["aligned"]
        head = max(range(len(per_head)), key=per_head.__getitem__)
        alignment = dict(
            aligned_mass=per_head[head],
            near_mass=masses["near"][head],
            mass_at_swaps=masses["at_swaps"][head],
            diagonal_at_swaps=masses["diagonal_at_swaps"][head],
            swapped_share=masses["swapped_share"],
        )
        if name == "gpt":
            n_head = model.config.n_head
            alignment.update(layer=head // n_head, head=head % n_head, by_head=per_head)
        result["alignment"] = alignment
        result["example"] = example(model, name, cfg, head)
    result["eval_seconds"] = time.process_time() - eval_cpu
    return name, result


# The run ----------
def train_all(cfg):
    """Every model, --jobs at a time; the dearest start first so that the last ones to
    finish are short. Returns {name: result}."""
    cost = ["gpt", "additive", "concat", "none", "general", "dot"]
    order = sorted(cfg["models"], key=cost.index)
    results = {}
    if cfg["jobs"] == 1:
        for slot, name in enumerate(order):
            results[name] = run_model(name, cfg, slot)[1]
        return results
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=cfg["jobs"], mp_context=context) as pool:
        futures = [pool.submit(run_model, name, cfg, slot) for slot, name in enumerate(order)]
        for future in as_completed(futures):
            name, result = future.result()
            results[name] = result
    return results


def summary(cfg, results, cpu_seconds, wall_seconds, loads):
    """The JSON: the contract's keys (lengths, models, alignment) and the run's record."""
    models = {}
    alignment = {}
    for name in cfg["models"]:
        r = results[name]
        models[name] = dict(
            accuracy=r["accuracy"],
            params=r["params"],
            train_seconds=round(r["train_seconds"], 1),
            train_wall_seconds=round(r["train_wall_seconds"], 1),
            eval_seconds=round(r["eval_seconds"], 1),
            loss_curve=curve(r["losses"]),
        )
        if "alignment" in r:
            alignment[name] = r["alignment"]
    return dict(
        lengths=cfg["lengths"],
        models=models,
        alignment=alignment,
        goals=goals(cfg, models, alignment),
        examples={name: results[name]["example"] for name in alignment},
        settings={k: v for k, v in cfg.items() if k != "out_dir"},
        machine=dict(
            cpu=cpu_class(),
            load_average_before=loads[0],
            load_average_after=loads[1],
        ),
        cpu_seconds=round(cpu_seconds, 1),
        wall_seconds=round(wall_seconds, 1),
    )


def curve(losses, points=100):
    """The training loss averaged over `points` equal spans of steps: [step, loss] pairs."""
    span = max(1, len(losses) // points)
    out = []
    for start in range(0, len(losses) - span + 1, span):
        chunk = losses[start : start + span]
        out.append([start + span // 2, sum(chunk) / len(chunk)])
    return out


def goals(cfg, models, alignment):
    """The issue's goals, each with what was measured and whether it was met."""
    shortest = str(cfg["lengths"][0])
    longest = str(cfg["lengths"][-1])
    rows = []
    if "none" in models:
        a = models["none"]["accuracy"]
        rows.append(goal(f"none >= 0.9 at length {shortest}", a[shortest], a[shortest] >= 0.9))
        rows.append(goal(f"none <= 0.5 at length {longest}", a[longest], a[longest] <= 0.5))
    for name in models:
        if name == "none":
            continue
        lowest = min(models[name]["accuracy"].values())
        rows.append(goal(f"{name} >= 0.9 at every length", lowest, lowest >= 0.9))
    for name in CROSS_ATTENTION:
        if name in alignment:
            mass = alignment[name]["aligned_mass"]
            rows.append(goal(f"{name} aligned_mass >= 0.5", mass, mass >= 0.5))
    return rows


def goal(text, measured, met):
    return dict(goal=text, measured=round(measured, 4), met=bool(met))


# The figures ----------
def plot_accuracy(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    lengths = data["lengths"]
    for name, m in data["models"].items():
        acc = [m["accuracy"][str(L)] for L in lengths]
        style = "--" if name == "gpt" else "-"
        left.plot(lengths, acc, style, marker="o", color=COLORS[name], label=LABELS[name])
        steps = [p[0] for p in m["loss_curve"]]
        loss = [p[1] for p in m["loss_curve"]]
        right.plot(steps, loss, style, color=COLORS[name], label=LABELS[name])
    left.axhline(0.9, color="grey", ls=":", lw=1)
    left.axhline(0.5, color="grey", ls=":", lw=1)
    left.set_ylim(-0.02, 1.02)
    left.set_xlabel("source length (words)")
    left.set_ylabel("per-token accuracy, greedy decoding")
    left.set_title("Accuracy against source length")
    left.legend(fontsize=8, loc="lower left")
    left.grid(alpha=0.3)
    right.set_yscale("log")
    right.set_xlabel("training step (the same batches for every model)")
    right.set_ylabel("training loss (teacher-forced)")
    right.set_title("Training")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_alignment(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(data["examples"])
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        ex = data["examples"][name]
        L = len(ex["reference"])
        ax.imshow(ex["weights"], cmap="Greys", vmin=0.0, vmax=1.0)
        # the true alignment: target word j translates source word align[j]
        ax.scatter(ex["align"], range(L), s=30, facecolors="none", edgecolors="tab:red", lw=1)
        ax.set_xticks(range(L))
        ax.set_xticklabels([task.source_name(w) for w in ex["source"]], rotation=90, fontsize=7)
        ax.set_yticks(range(L))
        ax.set_yticklabels([task.target_name(t) for t in ex["output"]], fontsize=7)
        for label, out, ref in zip(ax.get_yticklabels(), ex["output"], ex["reference"]):
            if out != ref:
                label.set_color("tab:red")
        title = f"{LABELS[name]}\naligned mass {data['alignment'][name]['aligned_mass']:.2f}"
        if name == "gpt":
            a = data["alignment"][name]
            title += f" (layer {a['layer']}, head {a['head']})"
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("source", fontsize=8)
    axes[0][0].set_ylabel("the model's output (red: wrong)", fontsize=8)
    fig.suptitle("Attention while decoding; circles: the true alignment", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# The page ----------
def table(data):
    lengths = data["lengths"]
    head = "| model | params | training CPU s | " + " | ".join(str(n) for n in lengths) + " |"
    rule = "|---|---|---|" + "---|" * len(lengths)
    lines = [head, rule]
    for name, m in data["models"].items():
        cells = " | ".join(f"{m['accuracy'][str(n)]:.3f}" for n in lengths)
        lines.append(f"| {LABELS[name]} | {m['params']:,} | {m['train_seconds']:.0f} | {cells} |")
    return lines


def paragraph(text):
    """One paragraph of the page, wrapped."""
    return textwrap.fill(text, width=90, break_on_hyphens=False)


def item(text):
    """One list item of the page, wrapped under its dash."""
    return textwrap.fill(
        text, width=90, initial_indent="- ", subsequent_indent="  ", break_on_hyphens=False
    )


def write_page(data, path):
    """bottleneck.md: the figures and the tables, read in the lectures' words."""
    cfg = data["settings"]
    lengths = data["lengths"]
    machine = data["machine"]
    command = "python -m experiments.bottleneck"
    if cfg["quick"]:
        command += " --quick"
    intro = (
        "The lectures start before the transformer: an RNN encoder reads the source into "
        "one fixed-size vector, the decoder writes the translation from that vector alone, "
        "and translation quality falls apart on long sentences. Bahdanau's attention lets "
        "the decoder read every encoder state at every step, weighted by how well each one "
        "matches what it is about to write (a soft alignment); Luong's scores make the match "
        "a product; self-attention drops the recurrence. This page runs that story on a toy "
        "translation whose right alignment is known."
    )
    record = (
        f"(`experiments/bottleneck.py`, the models trained {cfg['jobs']} at a time, one "
        "thread each; "
        f"{machine['cpu']}. {data['cpu_seconds']:.0f} s of CPU time in all, "
        f"{data['wall_seconds']:.0f} s wall; load average {machine['load_average_before']} "
        f"before and {machine['load_average_after']} after.)"
    )
    task_text = (
        "`experiments/toy_translation.py`: a source sentence is a string of nouns `n1..n60` "
        "and adjectives `a1..a40`; its translation replaces each word by its dictionary entry "
        "(`n7` -> `N7`) and moves an adjective after the noun it precedes, as French does "
        "(`a3 n7` -> `N7 A3`). Target word j translates exactly one source word: the true "
        "alignment is a diagonal with local swaps."
    )
    training = (
        f"Every model trains for {cfg['steps']} Adam steps (peak learning rate {cfg['lr']}) "
        f"on the same batches of {cfg['batch_size']} sentences, each batch of lengths within "
        f"4 words of a length drawn evenly from 3 to {lengths[-1]}, and is scored on "
        f"{cfg['eval_sentences']} held-out sentences of each length by greedy decoding: each "
        "word it writes is fed back as its next input, and a word counts when it equals the "
        "reference at its place."
    )
    models = [
        f"**none**: a bidirectional GRU encoder ({cfg['hidden_size']} wide each way); the "
        f"decoder, a GRU of width {2 * cfg['hidden_size']}, gets the encoder's final states "
        "as its first state and again beside every input: the fixed vector "
        "(`experiments/seq2seq.py`: `BottleneckDecoder`).",
        "**additive**: Bahdanau: the previous decoder state scores every encoder state with "
        "`v^T tanh(W s + U h)`, and the context enters the GRU step (`BahdanauDecoder`, "
        "`AdditiveScore`); the steps run in a loop.",
        "**dot**, **general**, **concat**: Luong: the GRU steps first, its new state scores "
        "the encoder states with `s^T h`, `s^T W h` or `v^T tanh(W [s; h])`, and the context "
        "shapes the output (`LuongDecoder`, `DotScore`, `GeneralScore`, `ConcatScore`); a "
        "whole target is one GRU call and one batched matmul.",
        f"**gpt**: `model.py`'s GPT ({cfg['gpt_layers']} layers, {cfg['gpt_heads']} heads, "
        f"width {cfg['gpt_embd']}, rotary positions) reads the source padded to "
        f"{lengths[-1]} slots, a separator and the target as one sequence under the causal "
        "mask, and is trained on the target's words only. The padding puts target word j a "
        "fixed distance after source word j, so that position alone can find it.",
    ]
    heatmaps = (
        "Each panel is one model translating the same sentence: row j is the attention of "
        "the step that writes target word j, over the source words, and a red circle marks "
        "the source word that target word j translates. aligned_mass is the mean weight on "
        "that word over every step of every held-out sentence (for the GPT, of its head with "
        "the most; every head's is in the JSON); near_mass the weight on that word or a "
        "neighbour of it. At the steps whose word a swap moved, mass_at_swaps is the weight "
        "on the true word, and diagonal_at_swaps the weight on source word j at step j, "
        "where attention that ignores the swap would look."
    )
    lines = [
        "# The bottleneck, measured: seq2seq without and with attention, and a GPT",
        "",
        paragraph(intro),
        "",
        "```sh",
        command,
        "```",
        "",
        paragraph(record),
        "",
        "## The task and the models",
        "",
        paragraph(task_text),
        "",
        paragraph(training),
        "",
    ]
    lines += [item(text) for text in models]
    lines += ["", "## Accuracy against length", "", "![accuracy against length](bottleneck.png)"]
    lines += [""] + table(data)
    lines += ["", "The goals set for this run:", "", "| goal | measured | met |", "|---|---|---|"]
    for g in data["goals"]:
        lines.append(f"| {g['goal']} | {g['measured']:.3f} | {'yes' if g['met'] else 'no'} |")
    lines += ["", paragraph(reading(data)), "", "## Soft alignment", ""]
    lines += ["![alignment heatmaps](bottleneck_alignment.png)", "", paragraph(heatmaps), ""]
    lines += [
        "| model | aligned_mass | near_mass | mass_at_swaps | diagonal_at_swaps |",
        "|---|---|---|---|---|",
    ]
    for name, a in data["alignment"].items():
        lines.append(
            f"| {LABELS[name]} | {a['aligned_mass']:.3f} | {a['near_mass']:.3f} | "
            f"{a['mass_at_swaps']:.3f} | {a['diagonal_at_swaps']:.3f} |"
        )
    keys = (
        "The numbers are in `bottleneck.json`: `lengths`; `models.<name>` with `accuracy` "
        "(by length), `params`, `train_seconds` (CPU seconds of training) and "
        "`train_wall_seconds`; `alignment.<name>` with `aligned_mass` and the masses above; "
        "`goals`, `examples` (the heatmaps' sentence), `settings` and `machine`."
    )
    for text in reading_alignment(data):
        lines += ["", paragraph(text)]
    lines += ["", paragraph(keys), ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def reading(data):
    """The paragraph that reads the accuracy table, from the numbers."""
    lengths = data["lengths"]
    models = data["models"]
    shortest = str(lengths[0])
    longest = str(lengths[-1])
    parts = []
    if "none" in models:
        a = models["none"]["accuracy"]
        below = [n for n in lengths if a[str(n)] < 0.5]
        text = (
            f"Without attention the decoder scores {a[shortest]:.2f} on {shortest}-word "
            f"sentences and {a[longest]:.2f} on {longest}-word ones"
        )
        if below:
            text += f"; it is below one word in two from {below[0]} words on"
        parts.append(text + ".")
    attention = [n for n in models if n != "none"]
    if attention:
        lows = {n: min(models[n]["accuracy"].values()) for n in attention}
        held = [LABELS[n] for n in attention if lows[n] >= 0.9]
        fell = [f"{LABELS[n]} (lowest {lows[n]:.2f})" for n in attention if lows[n] < 0.9]
        if held:
            parts.append(f"At least 0.9 at every length: {'; '.join(held)}.")
        if fell:
            parts.append(f"Below 0.9 somewhere: {'; '.join(fell)}.")
    if all(n in models for n in ("additive", "dot", "general", "concat")):
        seconds = {n: models[n]["train_seconds"] for n in models}
        parts.append(
            f"Training took {seconds['additive']:.0f} CPU s for Bahdanau's decoder, which "
            f"loops over the target's steps, against {seconds['dot']:.0f} and "
            f"{seconds['general']:.0f} for Luong's dot and general scores, whose decoder runs "
            "a whole target as one GRU call and one batched matmul; concat, whose small "
            f"network runs on every (step, word) pair, took {seconds['concat']:.0f}."
        )
    return " ".join(parts)


def reading_alignment(data):
    """The two paragraphs that read the alignment table, from the numbers: the mass on the
    true word, then the swaps."""
    alignment = data["alignment"]
    cross = [n for n in CROSS_ATTENTION if n in alignment]
    parts = []
    held = [n for n in cross if alignment[n]["aligned_mass"] >= 0.5]
    fell = [n for n in cross if alignment[n]["aligned_mass"] < 0.5]
    if held:
        names = "; ".join(LABELS[n] for n in held)
        parts.append(f"At least half the weight on the true source word: {names}.")
    for n in fell:
        a = alignment[n]
        parts.append(
            f"{LABELS[n]} puts {a['aligned_mass']:.2f} of its weight on the true word and "
            f"{a['near_mass']:.2f} on it or a neighbour: its attention is a band around the "
            "alignment rather than a point on it. The encoder reads both ways, so the state "
            "of a neighbouring word holds the word itself too; `--bidirectional=False` trains "
            "a left-to-right encoder instead, to see how much of the band that explains."
        )
    pairs = [
        LABELS[n]
        for n in alignment
        if alignment[n]["mass_at_swaps"] + alignment[n]["diagonal_at_swaps"] >= 0.8
        and min(alignment[n]["mass_at_swaps"], alignment[n]["diagonal_at_swaps"]) >= 0.25
    ]
    share = next(iter(alignment.values()))["swapped_share"]
    first = " ".join(parts)
    parts = []
    parts.append(
        f"A swap moves {share:.0%} of the target words. Attention that follows the "
        "reordering puts its weight on the moved word there too (mass_at_swaps); attention "
        "that reads source word j at step j, and leaves the swap to the context its state "
        "carries, puts it on the diagonal (diagonal_at_swaps)."
    )
    follow = [LABELS[n] for n in alignment if alignment[n]["mass_at_swaps"] >= 0.5]
    ignore = [
        LABELS[n]
        for n in alignment
        if alignment[n]["diagonal_at_swaps"] > alignment[n]["mass_at_swaps"]
    ]
    if follow:
        parts.append(f"Following the swaps: {'; '.join(follow)}.")
    if ignore:
        parts.append(f"More on the diagonal than on the moved word: {'; '.join(ignore)}.")
    if pairs:
        parts.append(
            f"{'; '.join(pairs)}: at a swapped step the two masses sum to 0.8 or more, so "
            "nearly all the weight is on one of the pair's two words, and neither mass is "
            "near 1, so no model follows the swap every time. In the heatmaps' sentence both "
            "steps of a pair read the same word of it; the other word reaches the output "
            "another way (an encoder state holds its neighbours too; the GPT has other heads)."
        )
    return [first, " ".join(parts)]


def main(cfg):
    cfg = settings(cfg)
    cli.output_folder(cfg["out_dir"])
    torch.set_num_threads(1)
    loads = [round(os.getloadavg()[0], 2)]
    cpu = time.process_time()
    wall = time.perf_counter()
    results = train_all(cfg)
    children = os.times()
    cpu_seconds = time.process_time() - cpu + children.children_user + children.children_system
    loads.append(round(os.getloadavg()[0], 2))
    data = summary(cfg, results, cpu_seconds, time.perf_counter() - wall, loads)
    data["settings"]["out_dir"] = os.path.relpath(cfg["out_dir"], ROOT)
    out = cfg["out_dir"]
    with open(os.path.join(out, "bottleneck.json"), "w") as f:
        json.dump(data, f, indent=1)
    plot_accuracy(data, os.path.join(out, "bottleneck.png"))
    if data["examples"]:
        plot_alignment(data, os.path.join(out, "bottleneck_alignment.png"))
    write_page(data, os.path.join(out, "bottleneck.md"))
    for g in data["goals"]:
        print(f"{g['goal']}: {g['measured']:.3f} {'met' if g['met'] else 'NOT met'}")
    print(f"wrote bottleneck.json, .png, _alignment.png and .md into {out}")


def run(argv):
    """The command: main() with --help, and bad input as one line (support/cli.py)."""
    return cli.run(main, argv, __doc__, DEFAULTS)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
