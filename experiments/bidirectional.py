"""
Same module, different mask: model.py's blocks trained twice on tiny Shakespeare's
characters, at the same size, from the same initial weights, on the same windows of text,
for the same number of steps.

    python -m experiments.bidirectional [--quick] [--out_dir=DIR] [--input=PATH]
    python -m experiments.bidirectional --out_dir=docs   # docs/bidirectional.md and its figure

    causal         GPT's objective: every Block gets no mask, so model.py's causal mask;
                   each position sees itself and the characters before it and predicts
                   the next character
    bidirectional  BERT's (Devlin et al. 2019): every Block gets a mask that is all True,
                   so each position sees the whole window; 15% of the positions, drawn at
                   random, read a [MASK] character instead of theirs, and the model
                   predicts the characters there

Both are model.py's GPT, one class, one vocabulary (the characters and [MASK]), so one
parameter count. Scored on the same held-out windows: the causal model's next-character
loss and accuracy, the bidirectional model's at the masked characters, and the causal
model's on those same masked characters (each predicted from the position before it).
Then the attention maps: every head's look-ahead, the mean weight a query puts on the
characters after it, exactly 0 under the causal mask.

Writes into --out_dir (default out-experiments/bidirectional/; docs/ only when given
--out_dir=docs): bidirectional.json, bidirectional.png (the training losses, every head's
look-ahead, and the maps of the bidirectional head that looks ahead most beside the causal
model's head at the same place) and bidirectional.md, which reads them. --quick trains
fewer steps. The corpus: --input, $TINYSHAKESPEARE_PATH, or
data/shakespeare_char/input.txt, as train.py finds it.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn.functional as F

from bench.common import cpu_class
from data.tiny_shakespeare import shakespeare_dir, shakespeare_text
from experiments import SCRATCH, measured, write_results
from experiments.bottleneck import curve, learning_rate
from experiments.bottleneck_report import page_head, paragraph
from experiments.transformer import look_ahead
from model import GPT, GPTConfig
from support import cli
from support.configurator import ConfigError

KINDS = ("causal", "bidirectional")
MASK_SHARE = 0.15  # BERT's: the share of positions whose character is hidden and predicted
MASK_SIGN = "_"  # [MASK] where text is shown: tiny Shakespeare has no underscore

# the sizes a run has unless its options say otherwise
FULL = dict(steps=2000, eval_windows=256)
QUICK = dict(steps=300, eval_windows=64)


@dataclasses.dataclass
class Settings:
    out_dir: str = os.path.join(SCRATCH, "bidirectional")  # --out_dir=docs: the shipped figures
    # tiny Shakespeare; "": $TINYSHAKESPEARE_PATH or data/shakespeare_char/input.txt
    input: str = ""
    quick: bool = False  # the QUICK sizes instead of FULL
    steps: int | None = None  # training steps of each model; None: the sizes'
    eval_windows: int | None = None  # held-out windows scored; None: the sizes'
    block_size: int = 64  # characters per window
    batch_size: int = 32
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    lr: float = 2e-3  # AdamW's peak; warmed up over 100 steps, then cosine to a tenth
    jobs: int = 2  # the two models trained at once, in processes of one thread each
    seed: int = 0


# Settings ----------
def settings(cfg):
    """The options, the sizes filled in and checked; a ConfigError for anything wrong."""
    cfg = dataclasses.replace(cfg)  # a copy: the options as given stay as they were
    sizes = QUICK if cfg.quick else FULL
    for key, value in sizes.items():
        if getattr(cfg, key) is None:
            setattr(cfg, key, value)
    least = dict(block_size=2, steps=1, eval_windows=1, batch_size=1, jobs=1)
    for key in ("n_layer", "n_head", "n_embd"):
        least[key] = 1
    for key, low in least.items():
        value = getattr(cfg, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"--{key} must be a whole number of at least {low}, got {value!r}")
    if cfg.n_embd % cfg.n_head:
        raise ConfigError("--n_embd must be a multiple of --n_head")
    if not cfg.lr > 0:
        raise ConfigError(f"--lr must be positive, got {cfg.lr}")
    return cfg


# The text ----------
def corpus(cfg):
    """The characters, the vocabulary (the characters, then [MASK]) and the two splits:
    the first 90% of the text to train on, the last 10% held out."""
    text = shakespeare_text(shakespeare_dir("char"), cfg.input or None)
    chars = "".join(sorted(set(text)))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = int(0.9 * len(ids))
    if len(ids) - n < cfg.block_size + 1:
        raise ConfigError(
            f"the text's held-out tenth has {len(ids) - n} characters, fewer than a window "
            f"of --block_size={cfg.block_size} and one more"
        )
    return dict(chars=chars, mask_id=len(chars), train=ids[:n], val=ids[n:])


def windows(ids, B, T, gen):
    """B windows of T + 1 characters (B, T + 1) at random places."""
    starts = torch.randint(0, len(ids) - T, (B,), generator=gen)
    return torch.stack([ids[s : s + T + 1] for s in starts.tolist()])


def mask_characters(x, mask_id, gen):
    """BERT's masked input: in each row of x (B, T) round(0.15 T) positions, drawn at
    random, read mask_id. Returns the input (B, T) and the targets (B, T): the hidden
    characters there, -1 elsewhere (the loss skips -1)."""
    B, T = x.shape
    k = max(1, round(MASK_SHARE * T))
    order = torch.rand(B, T, generator=gen).argsort(dim=1)  # a random order of the positions
    hidden = torch.zeros(B, T, dtype=torch.bool)
    hidden.scatter_(1, order[:, :k], True)  # (B, T): k True in each row
    inputs = x.masked_fill(hidden, mask_id)
    targets = x.masked_fill(~hidden, -1)
    return inputs, targets


# The models ----------
def build(cfg, vocab_size):
    """A fresh GPT, its weights drawn from the run's seed: the same for both kinds."""
    torch.manual_seed(cfg.seed)
    config = GPTConfig(
        block_size=cfg.block_size,
        vocab_size=vocab_size,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_embd=cfg.n_embd,
        dropout=0.0,
    )
    return GPT(config)


def forward(model, idx, causal):
    """model.py's GPT forward, logits (B, T, vocab) for idx (B, T), with one difference at
    one place: every Block is given the mask None (the causal mask, GPT) or all True (no
    mask, BERT)."""
    T = idx.size(1)
    mask = None
    if not causal:
        mask = torch.ones(T, T, dtype=torch.bool, device=idx.device)  # (T, T)
    x, rotary = model.embed(idx, model.positions(idx))
    x = model.transformer.drop(x)
    for block in model.transformer.h:
        x = block(x, rotary=rotary, mask=mask)
    return model.lm_head(model.transformer.ln_f(x))


def batch(kind, chunk, mask_id, gen):
    """A window batch (B, T + 1) as each kind reads it: the input (B, T) and its targets,
    the next characters (causal) or the hidden ones (bidirectional)."""
    x = chunk[:, :-1]
    if kind == "causal":
        return x, chunk[:, 1:]
    return mask_characters(x, mask_id, gen)


def loss_of(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)


def train(kind, cfg, text):
    """cfg.steps AdamW steps on windows drawn from the run's seed, the same windows for
    both kinds. Returns the model, the losses and the CPU seconds spent."""
    model = build(cfg, text["mask_id"] + 1)
    gen = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    causal = kind == "causal"
    losses = []
    cpu = time.process_time()
    for step in range(cfg.steps):
        chunk = windows(text["train"], cfg.batch_size, cfg.block_size, gen)
        x, y = batch(kind, chunk, text["mask_id"], gen)
        loss = loss_of(forward(model, x, causal), y)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return model, losses, time.process_time() - cpu


# Scoring and the maps ----------
def held_out(cfg, text):
    """The windows every model is scored on (B, T + 1), and their masked version: the same
    for both kinds and every run with the same seed."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    chunk = windows(text["val"], cfg.eval_windows, cfg.block_size, gen)
    inputs, targets = mask_characters(chunk[:, :-1], text["mask_id"], gen)
    return chunk, inputs, targets


def scored(logits, targets):
    """Cross-entropy and accuracy over the positions whose target is not -1."""
    keep = targets != -1
    loss = F.cross_entropy(logits[keep], targets[keep]).item()
    accuracy = (logits[keep].argmax(-1) == targets[keep]).float().mean().item()
    return loss, accuracy


@torch.no_grad()
def evaluate(model, kind, cfg, text):
    """The model's loss and accuracy on its own objective; for the causal model also on
    the masked characters (character p predicted at position p - 1, for p >= 1)."""
    model.eval()
    chunk, masked, hidden = held_out(cfg, text)
    if kind == "bidirectional":
        loss, accuracy = scored(forward(model, masked, causal=False), hidden)
        return dict(loss=loss, accuracy=accuracy)
    logits = forward(model, chunk[:, :-1], causal=True)  # (B, T, vocab)
    loss, accuracy = scored(logits, chunk[:, 1:])
    # the logits at p - 1 predict character p: the hidden targets shifted one to the left
    loss_at_masked, accuracy_at_masked = scored(logits[:, :-1], hidden[:, 1:])
    return dict(
        loss=loss,
        accuracy=accuracy,
        loss_at_masked=loss_at_masked,
        accuracy_at_masked=accuracy_at_masked,
    )


@torch.no_grad()
def attention_maps(model, idx, causal):
    """forward() with every layer's attention written out: one (B, nh, T, T) per layer."""
    maps = []
    for block in model.transformer.h:
        block.attn.maps = maps
    try:
        forward(model, idx, causal)
    finally:
        for block in model.transformer.h:
            block.attn.maps = None
    return maps


def neighbour_weight(weights, offset):
    """The weight each query i puts on key i + offset, for weights (..., T, T) ->
    (..., T - |offset|): offset -1 is what a previous-token head attends to, +1 the next
    character, which no head can see under the causal mask."""
    return torch.diagonal(weights, offset=offset, dim1=-2, dim2=-1)


def run_kind(kind, cfg):
    """Train one kind, score it, and return what the JSON and the figure need."""
    torch.set_num_threads(1)
    text = corpus(cfg)
    model, losses, seconds = train(kind, cfg, text)
    result = evaluate(model, kind, cfg, text)
    chunk, masked, _ = held_out(cfg, text)
    idx = chunk[:, :-1] if kind == "causal" else masked
    maps = torch.stack(attention_maps(model, idx, kind == "causal"), dim=1)  # (B, L, nh, T, T)
    result.update(
        params=model.num_params(),
        train_seconds=round(seconds, 1),
        losses=losses,
        look_ahead=look_ahead(maps).mean(dim=(0, 3)).tolist(),  # (L, nh)
        next_character=neighbour_weight(maps, 1).mean(dim=(0, 3)).tolist(),  # (L, nh)
        previous_character=neighbour_weight(maps, -1).mean(dim=(0, 3)).tolist(),  # (L, nh)
        example_input=idx[0].tolist(),
        example_maps=maps[0],  # (L, nh, T, T)
    )
    return kind, result


# The run ----------
def train_both(cfg):
    """Both kinds, --jobs at a time. Returns {kind: result}."""
    if cfg.jobs == 1:
        return dict(run_kind(kind, cfg) for kind in KINDS)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(2, cfg.jobs), mp_context=context) as pool:
        futures = [pool.submit(run_kind, kind, cfg) for kind in KINDS]
        return dict(future.result() for future in futures)


def summary(cfg, results, chars, cpu_seconds, wall_seconds, loads):
    """The JSON: each kind's scores and look-ahead, the maps the figure draws, the record."""
    # the bidirectional head that reads the next character most (the mirror of a
    # previous-token head), and the causal model's head at its place
    ahead = torch.tensor(results["bidirectional"]["next_character"])  # (L, nh)
    layer, head = divmod(ahead.flatten().argmax().item(), cfg.n_head)
    models = {}
    for kind in KINDS:
        r = results[kind]
        models[kind] = {k: v for k, v in r.items() if not k.startswith(("losses", "example"))}
        models[kind]["loss_curve"] = curve(r["losses"])
    example = dict(
        layer=layer,
        head=head,
        text={kind: as_text(results[kind]["example_input"], chars) for kind in KINDS},
        maps={kind: rounded(results[kind]["example_maps"][layer, head]) for kind in KINDS},
    )
    return dict(
        models=models,
        example=example,
        settings={k: v for k, v in dataclasses.asdict(cfg).items() if k != "out_dir"},
        machine=dict(
            cpu=cpu_class(),
            load_average_before=loads[0],
            load_average_after=loads[1],
        ),
        cpu_seconds=round(cpu_seconds, 1),
        wall_seconds=round(wall_seconds, 1),
    )


def rounded(weights):
    """A map (T, T) as lists of 4-decimal numbers, for a JSON that stays small."""
    return [[round(w, 4) for w in row] for row in weights.tolist()]


def as_text(ids, chars):
    """Token ids as text, [MASK] as MASK_SIGN."""
    return "".join(chars[i] if i < len(chars) else MASK_SIGN for i in ids)


# The figure ----------
def flat(by_layer):
    """[[layer 0's heads], [layer 1's], ...] -> one list, layer by layer."""
    return [value for layer in by_layer for value in layer]


def uniform_look_ahead(data):
    """The look-ahead of a head that weighs every character alike: query i of T puts
    (T - 1 - i) / T ahead, (T - 1) / (2 T) on average."""
    T = data["settings"]["block_size"]
    return (T - 1) / (2 * T)


def tick(c):
    """A character as a tick label: a space and a newline made visible."""
    if c == " ":
        return "␣"
    if c == "\n":
        return "⏎"
    return c


def plot(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 12.5))
    colors = dict(causal="tab:purple", bidirectional="tab:green")
    curves, bars = axes[0]
    labels = dict(
        causal="causal: the next character",
        bidirectional="bidirectional: the masked characters",
    )
    for kind, m in data["models"].items():
        steps = [p[0] for p in m["loss_curve"]]
        loss = [p[1] for p in m["loss_curve"]]
        curves.plot(steps, loss, color=colors[kind], label=labels[kind])
    curves.set_xlabel("training step (the same windows for both)")
    curves.set_ylabel("training loss (nats per predicted character)")
    curves.set_title("Training")
    curves.legend(fontsize=8)
    curves.grid(alpha=0.3)
    n_head = data["settings"]["n_head"]
    series = [
        ("causal", "look_ahead", -0.27, colors["causal"], "causal: all later characters"),
        ("bidirectional", "look_ahead", 0.0, colors["bidirectional"], "bidirectional: all later"),
        ("bidirectional", "next_character", 0.27, "yellowgreen", "bidirectional: the next one"),
    ]
    for kind, key, offset, color, label in series:
        weights = flat(data["models"][kind][key])
        x = [i + offset for i in range(len(weights))]
        bars.bar(x, weights, width=0.27, color=color, label=label)
    heads = len(weights)
    bars.axhline(uniform_look_ahead(data), color="grey", ls="--", lw=1, label="uniform attention")
    bars.set_xticks(range(heads))
    bars.set_xticklabels([f"{i // n_head}.{i % n_head}" for i in range(heads)], fontsize=8)
    bars.set_ylim(0.0, 1.0)  # a weight: room above the bars for the legend
    bars.set_xlabel("layer.head")
    bars.set_ylabel("mean weight a query puts on the characters after it")
    bars.set_title("What the mask changes: weight ahead of the query (held-out windows)")
    bars.legend(fontsize=8, loc="upper right")
    bars.grid(alpha=0.3, axis="y")
    ex = data["example"]
    for ax, kind in zip(axes[1], ("causal", "bidirectional")):
        text = ex["text"][kind]
        ax.imshow(ex["maps"][kind], cmap="Greys", vmin=0.0, vmax=1.0)
        n = len(text)
        ax.plot([-0.5, n - 0.5], [-0.5, n - 0.5], ":", color="tab:blue", lw=1)
        ax.set_xticks(range(n))
        ax.set_xticklabels([tick(c) for c in text], fontsize=6)
        ax.set_yticks(range(n))
        ax.set_yticklabels([tick(c) for c in text], fontsize=6)
        m = data["models"][kind]
        ahead = m["look_ahead"][ex["layer"]][ex["head"]]
        following = m["next_character"][ex["layer"]][ex["head"]]
        ax.set_title(
            f"{kind}, layer {ex['layer']}, head {ex['head']}: weight on later characters "
            f"{ahead:.2f}, on the next one {following:.2f}",
            fontsize=9,
        )
        ax.set_xlabel(f"keys ({MASK_SIGN}: [MASK])", fontsize=8)
        ax.set_ylabel("queries", fontsize=8)
    fig.suptitle(
        "Same module, different mask: model.py's blocks with the causal mask and without it\n"
        "bottom: the bidirectional head with the most weight on the next character, and the "
        "causal model's head at the same place,\non one held-out window; dotted: the causal "
        "mask's edge",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# The page ----------


def write_page(data, path):
    """bidirectional.md: the numbers and the figure, read."""
    cfg = data["settings"]
    machine = data["machine"]
    causal = data["models"]["causal"]
    bi = data["models"]["bidirectional"]
    command = "python -m experiments.bidirectional"
    if cfg["quick"]:
        command += " --quick"
    # the folder it wrote into, from the repository's root: docs for the shipped page
    command += f" --out_dir={cfg['out_dir']}"
    intro = (
        "Lecture 004 sets the causal mask beside BERT's bidirectional attention and says the "
        "mask is the only difference: the same module, a different mask. Here the same "
        "model.py GPT is trained twice on tiny Shakespeare's characters, from the same "
        "initial weights, on the same windows of text, for the same steps; every Block gets "
        "the mask None (model.py's causal mask) in one run and a mask that is all True in "
        "the other (`experiments/bidirectional.py`: `forward`). The causal model predicts "
        "each next character, as GPT does; the bidirectional one reads windows in which "
        f"{MASK_SHARE:.0%} of the characters, drawn at random, are replaced by a [MASK] "
        "character and predicts the characters there, as BERT does (Devlin et al. 2019; "
        "BERT also leaves some of the chosen positions unchanged or random, which is left "
        "out here)."
    )
    record = (
        f"({cfg['n_layer']} layers, {cfg['n_head']} heads, width {cfg['n_embd']}, windows of "
        f"{cfg['block_size']} characters, {cfg['batch_size']} windows a step, {cfg['steps']} "
        f"AdamW steps at a peak learning rate of {cfg['lr']}; the two models trained "
        f"{min(2, cfg['jobs'])} at a time, one thread each; {machine['cpu']}. "
        f"{data['cpu_seconds']:.0f} s of CPU time in all, {data['wall_seconds']:.0f} s wall; "
        f"load average {machine['load_average_before']} before and "
        f"{machine['load_average_after']} after.)"
    )
    rows = [
        "| model | params | training CPU s | predicts | loss | accuracy |",
        "|---|---|---|---|---|---|",
        f"| causal | {causal['params']:,} | {causal['train_seconds']:.0f} | every next "
        f"character | {causal['loss']:.3f} | {causal['accuracy']:.3f} |",
        f"| causal | | | the masked characters, each from the position before it | "
        f"{causal['loss_at_masked']:.3f} | {causal['accuracy_at_masked']:.3f} |",
        f"| bidirectional | {bi['params']:,} | {bi['train_seconds']:.0f} | the masked "
        f"characters | {bi['loss']:.3f} | {bi['accuracy']:.3f} |",
    ]
    title = "Same module, different mask: causal (GPT) and bidirectional (BERT) attention"
    lines = [
        *page_head(title, intro, command, record),
        "## Loss and accuracy",
        "",
        paragraph(
            f"On the same {cfg['eval_windows']} held-out windows (the last tenth of the text), "
            "in nats per predicted character:"
        ),
        "",
        *rows,
        "",
        paragraph(reading(data)),
        "",
        "## What the mask changes in the maps",
        "",
        "![losses, look-ahead and maps](bidirectional.png)",
        "",
        paragraph(reading_maps(data)),
        "",
        paragraph(
            "The numbers are in `bidirectional.json`: `models.<kind>` with `loss`, "
            "`accuracy` (and for the causal model `loss_at_masked`, `accuracy_at_masked`), "
            "`params`, `train_seconds`, `look_ahead`, `next_character` and "
            "`previous_character` (each layer by head) and `loss_curve`; "
            "`example` (the drawn maps), `settings` and `machine`."
        ),
        "",
    ]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def reading(data):
    """The loss comparison, read from the numbers, with what each model sees."""
    causal = data["models"]["causal"]
    bi = data["models"]["bidirectional"]
    sees = (
        "each masked character is predicted from the characters on both sides of it (the "
        f"window less its {MASK_SHARE:.0%} hidden ones), where the causal model has only "
        "the characters before it"
    )
    if bi["loss"] < causal["loss_at_masked"]:
        return (
            f"The bidirectional model's loss on the masked characters is {bi['loss']:.3f} "
            f"(accuracy {bi['accuracy']:.3f}), against {causal['loss_at_masked']:.3f} "
            f"({causal['accuracy_at_masked']:.3f}) for the causal model on the same "
            f"characters and {causal['loss']:.3f} ({causal['accuracy']:.3f}) on every next "
            f"character: {sees}."
        )
    return (
        f"The bidirectional model's loss on the masked characters is {bi['loss']:.3f} "
        f"(accuracy {bi['accuracy']:.3f}), not below the causal model's "
        f"{causal['loss_at_masked']:.3f} on the same characters, although {sees}: at this "
        "size and number of steps the masked model, which learns from 15% of the positions "
        "of a window where the causal model learns from all of them, has not caught up."
    )


def reading_maps(data):
    """What the look-ahead measures and the drawn maps show."""
    ex = data["example"]
    causal = data["models"]["causal"]
    bi = data["models"]["bidirectional"]
    ahead = flat(bi["look_ahead"])
    following = flat(bi["next_character"])
    behind = flat(bi["previous_character"])
    uniform = uniform_look_ahead(data)
    broad = [a for a, b in zip(ahead, following) if abs(a - uniform) < 0.05 and b < 0.05]
    return (
        "For each head, the mean weight a query puts on the characters after it, over the "
        f"held-out windows. Under the causal mask it is {max(flat(causal['look_ahead'])):.2f} "
        "in every head, whatever the training: the mask's -inf leaves those weights exactly "
        f"0. Without the mask the heads put between {min(ahead):.2f} and {max(ahead):.2f} of "
        f"their weight ahead (a head that weighs every character alike: {uniform:.2f}; "
        f"{len(broad)} of the {len(ahead)} heads are within 0.05 of that and put under 0.05 "
        "on the next character, broad heads that read the whole window), and between "
        f"{min(following):.2f} and "
        f"{max(following):.2f} on the next character alone (on the previous one, between "
        f"{min(behind):.2f} and {max(behind):.2f}; the causal model's heads put up to "
        f"{max(flat(causal['previous_character'])):.2f} there). The maps are one held-out "
        f"window: layer {ex['layer']}, head {ex['head']}, the bidirectional head with the "
        f"most weight on the next character "
        f"({bi['next_character'][ex['layer']][ex['head']]:.2f}), and the causal model's head "
        "at the same place, all of whose weight is on or below the diagonal."
    )


def main(cfg):
    cfg = settings(cfg)
    cli.output_folder(cfg.out_dir)
    text = corpus(cfg)  # read here first, so that a missing corpus is one line before any work
    results, cpu_seconds, wall_seconds, loads = measured(lambda: train_both(cfg))
    data = summary(cfg, results, text["chars"], cpu_seconds, wall_seconds, loads)
    out = cfg.out_dir
    write_results(data, out, "bidirectional.json")
    plot(data, os.path.join(out, "bidirectional.png"))
    write_page(data, os.path.join(out, "bidirectional.md"))
    for kind, m in data["models"].items():
        print(f"{kind}: loss {m['loss']:.3f}, accuracy {m['accuracy']:.3f}")
    print(f"wrote bidirectional.json, .png and .md into {out}")


def run(argv):
    """The command: main() with --help, and bad input as one line (support/cli.py)."""
    return cli.run(main, argv, __doc__, Settings)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
