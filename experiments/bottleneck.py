"""
The lectures' first chapter, run: an RNN encoder-decoder squeezes the source into one
vector and collapses on long sentences; attention lets its decoder pull from every encoder
state; the Transformer drops the recurrence and keeps three attentions; a decoder-only GPT
does the same with self-attention over source and target at once.

    python -m experiments.bottleneck [--quick] [--out_dir=DIR]
    python -m experiments.bottleneck --out_dir=docs   # docs/bottleneck.md and its figures

One toy translation (experiments/toy_translation.py: a fixed dictionary, adjectives moved
after their noun, so the true alignment is known). Seven models train on the same batches,
sentences of every length from 3 words to the longest scored, for the same number of steps:
    none                  the encoder-decoder without attention (experiments/seq2seq.py)
    additive              Bahdanau's decoder and score
    dot, general, concat  Luong's decoder with each of his scores
    transformer           Vaswani et al.'s encoder-decoder of model.py's blocks: the encoder
                          without the causal mask, the decoder with it, and cross-attention
                          from decoder to encoder (experiments/transformer.py)
    gpt                   model.py's GPT: source, separator and target in one causal sequence
Each is then scored by greedy decoding (its own outputs fed back, no teacher forcing) on the
same held-out sentences of each length: the per-token accuracy. The attention weights of
that decoding give aligned_mass, the mean weight on the truly aligned source word (for the
Transformer, of its best cross-attention head; for the GPT, of its best head: the query that
predicts target word j against the source words).

Writes into --out_dir (default out-experiments/bottleneck/; docs/ only when given
--out_dir=docs): bottleneck.json, bottleneck.png (accuracy against length; the training
losses), bottleneck_alignment.png (one heatmap per attention model on one sentence, the
true alignment marked), bottleneck_transformer.png (the Transformer's three attentions on
that sentence) and bottleneck.md, which reads them (experiments/bottleneck_report.py).
--quick runs shorter sentences for fewer steps. --jobs models train at once, one thread
each.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch
import torch.nn.functional as F

from bench.common import cpu_class
from experiments import SCRATCH, measured, write_results
from experiments import bottleneck_report as report
from experiments import toy_translation as task
from experiments.explicit_attention import explicit_attention
from experiments.seq2seq import EOS, PAD, Seq2Seq, Seq2SeqConfig
from experiments.transformer import Transformer, TransformerConfig, look_ahead, target_input
from model import GPT, GPTConfig
from support import cli
from support.configurator import ConfigError

MODELS = ("none", "additive", "dot", "general", "concat", "transformer", "gpt")
CROSS_ATTENTION = ("additive", "dot", "general", "concat", "transformer")

# the sizes a run has unless its options say otherwise
FULL = dict(lengths=(5, 10, 15, 20, 25, 30, 35, 40, 45, 50), steps=2500, eval_sentences=200)
QUICK = dict(lengths=(4, 8, 12, 16, 20, 24, 28), steps=1200, eval_sentences=100)


@dataclasses.dataclass
class Settings:
    out_dir: str = os.path.join(SCRATCH, "bottleneck")  # --out_dir=docs: the shipped figures
    quick: bool = False  # the QUICK sizes instead of FULL
    lengths: tuple | None = None  # the source lengths scored; None: the sizes'
    steps: int | None = None  # training steps of every model; None: the sizes'
    eval_sentences: int | None = None  # held-out sentences per length; None: the sizes'
    models: tuple = MODELS  # which to train, any of these
    batch_size: int = 64
    lr: float = 3e-3  # Adam's peak; warmed up over 100 steps, then cosine to a tenth
    hidden_size: int = 64  # the encoder's per direction: encoder states and decoders are twice that
    bidirectional: bool = True  # the encoder reads both ways, as Bahdanau's; False: left to right
    transformer_layers: int = 2  # in the encoder, and as many in the decoder
    transformer_heads: int = 4
    transformer_embd: int = 64
    gpt_layers: int = 2
    gpt_heads: int = 4
    gpt_embd: int = 64
    jobs: int = 2  # models trained at once, in processes of one thread each
    seed: int = 0


# Settings ----------
def settings(cfg):
    """The options, the sizes filled in and checked; a ConfigError for anything wrong."""
    cfg = dataclasses.replace(cfg)  # a copy: the options as given stay as they were
    sizes = FULL
    if cfg.quick:
        sizes = QUICK
    for key, value in sizes.items():
        if getattr(cfg, key) is None:
            setattr(cfg, key, value)
    lengths = cfg.lengths
    if isinstance(lengths, int):
        lengths = (lengths,)
    if not isinstance(lengths, (tuple, list)) or not lengths:
        raise ConfigError(f"--lengths expects lengths like (5, 10, 20), got {lengths!r}")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 3 for n in lengths):
        raise ConfigError(f"--lengths must be whole numbers of at least 3, got {lengths!r}")
    cfg.lengths = sorted(set(lengths))
    models = cfg.models
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        raise ConfigError(f"--models: {unknown or 'none given'}; choose from {', '.join(MODELS)}")
    cfg.models = [m for m in MODELS if m in models]
    for key in ("steps", "eval_sentences", "batch_size", "hidden_size", "jobs"):
        whole_number(cfg, key, 1)
    for prefix in ("transformer", "gpt"):
        for key in (f"{prefix}_layers", f"{prefix}_heads", f"{prefix}_embd"):
            whole_number(cfg, key, 1)
        if getattr(cfg, f"{prefix}_embd") % (2 * getattr(cfg, f"{prefix}_heads")):
            raise ConfigError(
                f"--{prefix}_embd must be a multiple of twice --{prefix}_heads (an even head size)"
            )
    if not cfg.lr > 0:
        raise ConfigError(f"--lr must be positive, got {cfg.lr}")
    return cfg


def whole_number(cfg, key, least):
    value = getattr(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"--{key} must be a whole number of at least {least}, got {value!r}")


# The models ----------
def build(name, cfg):
    """A fresh model by name, its weights drawn from the run's seed."""
    torch.manual_seed(cfg.seed)
    if name == "gpt":
        s_max = max(cfg.lengths)
        config = GPTConfig(
            block_size=2 * s_max + 1,
            vocab_size=task.GPT_VOCAB,
            n_layer=cfg.gpt_layers,
            n_head=cfg.gpt_heads,
            n_embd=cfg.gpt_embd,
            dropout=0.0,
            # rotary positions: what the layout asks of it is a fixed relative offset
            rope=True,
        )
        return GPT(config)
    if name == "transformer":
        config = TransformerConfig(
            task.SRC_VOCAB,
            task.TGT_VOCAB,
            n_layer=cfg.transformer_layers,
            n_head=cfg.transformer_heads,
            n_embd=cfg.transformer_embd,
        )
        return Transformer(config)
    config = Seq2SeqConfig(
        task.SRC_VOCAB,
        task.TGT_VOCAB,
        attention=name,
        hidden_size=cfg.hidden_size,
        bidirectional=cfg.bidirectional,
    )
    return Seq2Seq(config)


def loss_of(model, name, batch, s_max):
    """The cross-entropy of the target words and EOS, teacher-forced."""
    src, lengths, y_in, y_out = batch
    if name == "gpt":
        idx, targets = task.gpt_layout(src, y_out, s_max)
        _, loss = model(idx, targets)
        return loss
    if name == "transformer":
        logits = model(src, lengths, y_in)  # (B, T, V)
    else:
        logits, _ = model(src, lengths, y_in)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), y_out.flatten(), ignore_index=PAD)


def learning_rate(step, cfg):
    """Linear warmup over 100 steps, then a cosine from the peak down to a tenth of it."""
    peak = cfg.lr
    warmup = min(100, cfg.steps // 10 + 1)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, name, cfg, slot):
    """cfg.steps Adam steps on the run's batches (the same for every model). Returns the
    losses and the CPU and wall seconds spent."""
    from tqdm import tqdm

    s_max = max(cfg.lengths)
    gen = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses = []
    cpu = time.process_time()
    wall = time.perf_counter()
    bar = tqdm(total=cfg.steps, desc=f"{name:>8}", position=slot, leave=True, disable=None)
    for step in range(cfg.steps):
        lengths = task.training_lengths(cfg.batch_size, 3, s_max, gen)
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
    and the attention of each step over the source (B, heads, steps, S): one "head" for a
    recurrent encoder-decoder, every (layer, head) of the Transformer's cross-attention and
    of the GPT; None without attention."""
    if name == "transformer":
        tokens = model.greedy(src, lengths, steps)  # (B, steps)
        # the attention once more, in the open, over what the decoder read while writing
        maps = model.attention_maps(src, lengths, target_input(tokens))
        return tokens, torch.cat(maps["cross"], dim=1)  # (B, layers heads, steps, S)
    if name != "gpt":
        tokens, weights = model.greedy(src, lengths, steps)
        if weights is None:
            return tokens, None
        return tokens, weights[:, None]  # (B, 1, steps, S)
    S = src.size(1)
    prompt = task.gpt_prompt(src, s_max)  # (B, s_max + 1)
    idx = model.generate(prompt, steps, temperature=0)  # greedy, through the KV cache
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
    s_max = max(cfg.lengths)
    accuracy = {}
    sums = None
    count = 0
    swapped = 0
    for L in cfg.lengths:
        gen = torch.Generator().manual_seed(1000 + L)  # the same sentences for every model
        lengths = torch.full((cfg.eval_sentences,), L)
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
        count += L * cfg.eval_sentences
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
    """The model's greedy translation of the example sentence and its weights there; for
    the Transformer, its three attentions too."""
    L = min(16, max(cfg.lengths))
    src, y_out, align = example_sentence(L)
    lengths = torch.tensor([L])
    tokens, weights = decode(model, name, src, lengths, L, max(cfg.lengths))
    result = dict(
        source=src[0].tolist(),
        reference=y_out[0, :L].tolist(),
        align=align[0].tolist(),
        output=tokens[0].tolist(),
        weights=weights[0, head].tolist(),  # (L, L)
    )
    if name == "transformer":
        maps = model.attention_maps(src, lengths, target_input(tokens))
        result["attentions"] = three_attentions(maps, head, model.config.n_head)
    return result


def three_attentions(maps, cross_head, n_head):
    """One head of each of the Transformer's attentions on one sentence: of the encoder's
    and the decoder's self-attention the sharpest (the lowest mean entropy of its rows), of
    cross-attention the head with the highest aligned_mass; and every self-attention
    head's look-ahead, the mean weight on later words, which the causal mask makes 0."""
    out = {}
    for kind in ("encoder", "decoder", "cross"):
        weights = torch.cat(maps[kind], dim=1)[0]  # (layers heads, T, S or T)
        entropy = -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean(-1)  # (layers heads,)
        flat = entropy.argmin().item()
        rule = "sharpest"
        if kind == "cross":
            flat = cross_head
            rule = "highest aligned_mass"
        out[kind] = dict(layer=flat // n_head, head=flat % n_head, rule=rule)
        if kind != "cross":
            by_head = look_ahead(weights).mean(-1).tolist()  # (layers heads,)
            out[kind].update(look_ahead=by_head[flat], look_ahead_by_head=by_head)
        out[kind]["weights"] = weights[flat].tolist()
    return out


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
        if name in ("transformer", "gpt"):
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
    cost = ["gpt", "transformer", "additive", "concat", "none", "general", "dot"]
    order = sorted(cfg.models, key=cost.index)
    results = {}
    if cfg.jobs == 1:
        for slot, name in enumerate(order):
            results[name] = run_model(name, cfg, slot)[1]
        return results
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=cfg.jobs, mp_context=context) as pool:
        futures = [pool.submit(run_model, name, cfg, slot) for slot, name in enumerate(order)]
        for future in as_completed(futures):
            name, result = future.result()
            results[name] = result
    return results


def summary(cfg, results, cpu_seconds, wall_seconds, loads):
    """The JSON: the contract's keys (lengths, models, alignment) and the run's record."""
    models = {}
    alignment = {}
    for name in cfg.models:
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
        lengths=cfg.lengths,
        models=models,
        alignment=alignment,
        goals=goals(cfg, models, alignment),
        examples={name: results[name]["example"] for name in alignment},
        settings={k: v for k, v in dataclasses.asdict(cfg).items() if k != "out_dir"},
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
    shortest = str(cfg.lengths[0])
    longest = str(cfg.lengths[-1])
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


def main(cfg):
    cfg = settings(cfg)
    cli.output_folder(cfg.out_dir)
    results, cpu_seconds, wall_seconds, loads = measured(lambda: train_all(cfg))
    data = summary(cfg, results, cpu_seconds, wall_seconds, loads)
    out = cfg.out_dir
    write_results(data, out, "bottleneck.json")
    report.plot_accuracy(data, os.path.join(out, "bottleneck.png"))
    if data["examples"]:
        report.plot_alignment(data, os.path.join(out, "bottleneck_alignment.png"))
    if "transformer" in data["examples"]:
        report.plot_three_attentions(data, os.path.join(out, "bottleneck_transformer.png"))
    report.write_page(data, os.path.join(out, "bottleneck.md"))
    for g in data["goals"]:
        print(f"{g['goal']}: {g['measured']:.3f} {'met' if g['met'] else 'NOT met'}")
    print(f"wrote bottleneck.json, the figures and bottleneck.md into {out}")


def run(argv):
    """The command: main() with --help, and bad input as one line (support/cli.py)."""
    return cli.run(main, argv, __doc__, Settings)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
