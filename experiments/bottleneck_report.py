"""
What a run of experiments/bottleneck.py becomes on the page: the figures (accuracy against
length and the training losses; each attention model's heatmap on one sentence; the
Transformer's three attentions) and bottleneck.md, which reads them from the numbers.
Everything here takes the run's JSON (bottleneck.json's dict) and nothing else.
"""

import math
import textwrap

from experiments import toy_translation as task

LABELS = {
    "none": "no attention (the bottleneck)",
    "additive": "Bahdanau (additive)",
    "dot": "Luong (dot)",
    "general": "Luong (general)",
    "concat": "Luong (concat)",
    "transformer": "Transformer (cross-attention)",
    "gpt": "GPT (self-attention)",
}
COLORS = {
    "none": "black",
    "additive": "tab:red",
    "dot": "tab:blue",
    "general": "tab:green",
    "concat": "tab:orange",
    "transformer": "tab:brown",
    "gpt": "tab:purple",
}
# the models whose attention is in a recurrent decoder
RECURRENT = ("additive", "dot", "general", "concat")


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
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 4.9 * rows), squeeze=False)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        ex = data["examples"][name]
        a = data["alignment"][name]
        source_heatmap(ax, ex, ex["weights"])
        title = f"{LABELS[name]}\naligned mass {a['aligned_mass']:.2f}"
        if "layer" in a:
            title += f" (layer {a['layer']}, head {a['head']})"
        ax.set_title(title, fontsize=8)
        ax.set_ylabel("the model's output (red: wrong)", fontsize=8)
    fig.suptitle("Attention while decoding; circles: the true alignment", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def source_heatmap(ax, ex, weights):
    """Weights (T, S) of the steps that write the example's target words over its source
    words, the true alignment circled and the wrong outputs in red."""
    L = len(ex["reference"])
    ax.imshow(weights, cmap="Greys", vmin=0.0, vmax=1.0)
    # the true alignment: target word j translates source word align[j]
    ax.scatter(ex["align"], range(L), s=30, facecolors="none", edgecolors="tab:red", lw=1)
    ax.set_xticks(range(L))
    ax.set_xticklabels([task.source_name(w) for w in ex["source"]], rotation=90, fontsize=7)
    ax.set_yticks(range(L))
    ax.set_yticklabels([task.target_name(t) for t in ex["output"]], fontsize=7)
    for label, out, ref in zip(ax.get_yticklabels(), ex["output"], ex["reference"]):
        if out != ref:
            label.set_color("tab:red")
    ax.set_xlabel("source", fontsize=8)


def plot_three_attentions(data, path):
    """The Transformer's three attentions on the heatmaps' sentence, side by side: the
    encoder's self-attention (no causal mask), the decoder's (causal) and cross-attention.
    The dotted diagonal is the causal mask's edge: above it, keys after the query."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ex = data["examples"]["transformer"]
    picks = ex["attentions"]
    source = [task.source_name(w) for w in ex["source"]]
    # what the decoder read while writing: BOS, then its own output but the last word
    read = ["<bos>"] + [task.target_name(t) for t in ex["output"][:-1]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 5.6))
    panels = [
        ("encoder", "encoder self-attention: no causal mask", source, source),
        ("decoder", "decoder self-attention: the causal mask", read, read),
    ]
    for ax, (kind, title, queries, keys) in zip(axes, panels):
        p = picks[kind]
        ax.imshow(p["weights"], cmap="Greys", vmin=0.0, vmax=1.0)
        n = len(keys)
        ax.plot([-0.5, n - 0.5], [-0.5, n - 0.5], ":", color="tab:blue", lw=1)
        ax.set_xticks(range(n))
        ax.set_xticklabels(keys, rotation=90, fontsize=7)
        ax.set_yticks(range(len(queries)))
        ax.set_yticklabels(queries, fontsize=7)
        ax.set_title(
            f"{title}\nlayer {p['layer']}, head {p['head']} ({p['rule']}); "
            f"weight ahead {p['look_ahead']:.2f}",
            fontsize=8,
        )
        ax.set_xlabel("keys", fontsize=8)
        ax.set_ylabel("queries", fontsize=8)
    p = picks["cross"]
    source_heatmap(axes[2], ex, p["weights"])
    axes[2].set_title(
        "cross-attention: the decoder reads the encoder\n"
        f"layer {p['layer']}, head {p['head']} ({p['rule']}); circles: the true alignment",
        fontsize=8,
    )
    axes[2].set_ylabel("the step that writes (red: wrong)", fontsize=8)
    fig.suptitle("The Transformer's three attentions on one sentence", fontsize=10)
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


def page_head(title, intro, command, record):
    """The lines a page of an experiment starts with: its title, what it shows, the
    command that made it and the record of that run."""
    return [
        f"# {title}",
        "",
        paragraph(intro),
        "",
        "```sh",
        command,
        "```",
        "",
        paragraph(record),
        "",
    ]


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
    # the folder it wrote into, from the repository's root: docs for the shipped page
    command += f" --out_dir={cfg['out_dir']}"
    intro = (
        "The lectures start before the transformer: an RNN encoder reads the source into "
        "one fixed-size vector, the decoder writes the translation from that vector alone, "
        "and translation quality falls apart on long sentences. Bahdanau's attention lets "
        "the decoder read every encoder state at every step, weighted by how well each one "
        "matches what it is about to write (a soft alignment); Luong's scores make the match "
        "a product; the Transformer drops the recurrence and keeps three attentions: the "
        "encoder's self-attention over the whole source, the decoder's causal self-attention "
        "over what it has written, and cross-attention from the decoder to the encoder; a "
        "GPT keeps only the causal one. This page runs that story on a toy translation whose "
        "right alignment is known."
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
        f"**transformer**: Vaswani et al.'s encoder-decoder made of `model.py`'s parts "
        f"(`experiments/transformer.py`), {cfg['transformer_layers']} encoder and "
        f"{cfg['transformer_layers']} decoder blocks, {cfg['transformer_heads']} heads, "
        f"width {cfg['transformer_embd']}, the paper's sinusoidal positions. An encoder "
        "block is `model.py`'s `Block` given the source's padding mask in place of the "
        "causal mask, so every source word attends to the words after it too; a decoder "
        "block is causal self-attention (`MultiHeadAttention`, its own mask), then "
        "cross-attention, queries from the decoder and keys and values from the encoder "
        "through `attention()` (`CrossAttention`), then the MLP. It writes one word a step "
        "as the recurrent decoders do.",
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
        "that word over every step of every held-out sentence (for the Transformer, of its "
        "cross-attention head with the most, and for the GPT, of its head with the most; "
        "every head's is in the JSON); near_mass the weight on that word or a "
        "neighbour of it. At the steps whose word a swap moved, mass_at_swaps is the weight "
        "on the true word, and diagonal_at_swaps the weight on source word j at step j, "
        "where attention that ignores the swap would look."
    )
    title = "The bottleneck, measured: seq2seq without and with attention, the Transformer, a GPT"
    lines = [
        *page_head(title, intro, command, record),
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
        "`train_wall_seconds`; `alignment.<name>` with `aligned_mass` and the masses above "
        "(for the Transformer and the GPT the `layer` and `head` they are of, and `by_head`); "
        "`goals`, `examples` (the heatmaps' sentence; `examples.transformer.attentions`, the "
        "three attentions drawn, with every self-attention head's look-ahead), `settings` "
        "and `machine`."
    )
    for text in reading_alignment(data):
        lines += ["", paragraph(text)]
    if "transformer" in data["examples"]:
        lines += ["", "## The Transformer's three attentions", ""]
        lines += ["![the three attentions](bottleneck_transformer.png)", ""]
        lines += [paragraph(reading_three(data))]
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
    if "transformer" in models:
        parts.append(
            f"The Transformer, whose encoder and teacher-forced decoder run every position "
            f"of a sentence at once, took {models['transformer']['train_seconds']:.0f} CPU s."
        )
    return " ".join(parts)


def reading_three(data):
    """The paragraph under the three attentions, from the numbers."""
    ex = data["examples"]["transformer"]
    att = ex["attentions"]
    encoder = att["encoder"]["look_ahead_by_head"]
    decoder = att["decoder"]["look_ahead_by_head"]
    a = data["alignment"]["transformer"]
    return (
        "The Transformer translating the heatmaps' sentence: each panel is one head, "
        "picked by the rule in its title (of the self-attentions the sharpest, the lowest "
        "mean entropy of its rows; of cross-attention the head with the highest "
        "aligned_mass), and above the dotted diagonal are the keys after the query, which a "
        "causal mask hides. On this sentence the encoder's heads put between "
        f"{min(encoder):.2f} and {max(encoder):.2f} of their weight on later words, the "
        f"drawn one (layer {att['encoder']['layer']}, head {att['encoder']['head']}) "
        f"{att['encoder']['look_ahead']:.2f}; the decoder's heads put {max(decoder):.2f} "
        "there, since the causal mask's -inf leaves exactly no weight on what has not been "
        f"written. The cross-attention head (layer {a['layer']}, head {a['head']}) puts "
        f"{a['aligned_mass']:.2f} of its weight on the true source word over the held-out "
        f"sentences, and {a['mass_at_swaps']:.2f} at the steps a swap moved."
    )


def reading_alignment(data):
    """The two paragraphs that read the alignment table, from the numbers: the mass on the
    true word, then the swaps."""
    alignment = data["alignment"]
    cross = [n for n in alignment if n != "gpt"]
    parts = []
    held = [n for n in cross if alignment[n]["aligned_mass"] >= 0.5]
    fell = [n for n in cross if alignment[n]["aligned_mass"] < 0.5]
    if held:
        names = "; ".join(LABELS[n] for n in held)
        parts.append(f"At least half the weight on the true source word: {names}.")
    for n in fell:
        a = alignment[n]
        text = (
            f"{LABELS[n]} puts {a['aligned_mass']:.2f} of its weight on the true word and "
            f"{a['near_mass']:.2f} on it or a neighbour: its attention is a band around the "
            "alignment rather than a point on it."
        )
        if n in RECURRENT:
            text += (
                " The encoder reads both ways, so the state of a neighbouring word holds the "
                "word itself too; `--bidirectional=False` trains a left-to-right encoder "
                "instead, to see how much of the band that explains."
            )
        else:
            text += (
                " Its encoder's self-attention has no causal mask, so the output at a "
                "neighbouring word holds the word itself too."
            )
        parts.append(text)
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
            "near 1, so none of them follows the swap every time. In the heatmaps' sentence both "
            "steps of a pair read the same word of it; the other word reaches the output "
            "another way (an encoder state holds its neighbours too; the Transformer and the "
            "GPT have other heads)."
        )
    return [first, " ".join(parts)]
