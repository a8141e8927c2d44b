"""
TransformerLens's own tools on a model trained here: the checkpoint as a HookedTransformer
(support/export_lens.py), run_with_cache on a text, one head's attention pattern from its
cache beside the explorer's map of the same head and text (explore.py's /api/analyze,
computed by model.py's GPT.attention_maps), and TransformerLens's K-composition scores
beside heads.py's. docs/export.md shows the output and the picture.

    python -m experiments.lens_example --out_dir=out-shakespeare-char-cpu \\
        --png=docs/export_lens.png
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import warnings

import matplotlib

matplotlib.use("Agg")  # write files; no display needed
import matplotlib.pyplot as plt
import numpy as np
import torch

from explorer.server import DIGITS, Explorer
from support import cli
from support.attention_maps import display_token
from support.composition import composition_scores, strongest
from support.export_lens import LensError, hooked_transformer
from support.loading import load_model


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-shakespeare-char-cpu"  # the checkpoint's folder
    text: str = "ROMEO:\nBut soft, what light through yonder window breaks?"
    layer: int | None = None  # the head to draw; None: the explorer's first labelled head
    head: int | None = None
    png: str = "export_lens.png"


def draw(lens_pattern, explorer_map, strings, title, path):
    """The two (T, T) maps side by side, token strings on the axes."""
    labels = [display_token(s) for s in strings]
    fig, axes = plt.subplots(1, 2, figsize=(13, 6.4), constrained_layout=True)
    for ax, weights, name in (
        (axes[0], lens_pattern, 'TransformerLens: cache["pattern", layer][0, head]'),
        (axes[1], explorer_map, 'explorer: /api/analyze "attention"[layer][head]'),
    ):
        image = ax.imshow(weights, cmap="viridis", vmin=0, vmax=1)
        ax.set_title(name, fontsize=10)
        ax.set_xticks(range(len(labels)), labels, fontsize=6, rotation=90)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)


@torch.no_grad()
def main(cfg):
    warnings.filterwarnings("ignore", "HookedTransformer is deprecated")
    model, tok, _ = load_model("", cfg.out_dir)
    model.eval()
    lens = hooked_transformer(model, tok)
    ids = tok.encode(cfg.text)
    if len(ids) > model.config.block_size:
        raise LensError(
            f"--text is {len(ids)} tokens, and this model reads {model.config.block_size} "
            "at most (its block_size): pass a shorter --text"
        )
    # TransformerLens's own entry point: a string, through the model's own tokenizer
    logits, cache = lens.run_with_cache(cfg.text)
    same_tokens = lens.to_tokens(cfg.text, prepend_bos=False)[0].tolist() == ids
    ours, maps = model.attention_maps(torch.tensor([ids]))
    print(f"{len(ids)} tokens, the checkpoint's own: {same_tokens}")
    print(f"logits {tuple(logits.shape)}: largest difference from model.py's ", end="")
    print(f"{(logits - ours).abs().max():.2e}")
    for layer, weights in enumerate(maps):
        pattern = cache["pattern", layer]
        diff = (pattern - weights).abs().max()
        print(f'cache["pattern", {layer}] {tuple(pattern.shape)}: largest difference from ', end="")
        print(f"GPT.attention_maps's {diff:.2e}")
    answer = Explorer(model, tok).analyze({"prompt": cfg.text})
    labelled = []
    for layer, heads in enumerate(answer["labels"]):
        for head, info in enumerate(heads):
            labelled.append((layer, head, info["label"]))
    print("the explorer's labels:", ", ".join(f"{a}.{b} {label}" for a, b, label in labelled))
    layer, head = cfg.layer, cfg.head
    if layer is None or head is None:
        # one that reads earlier heads, for the composition scores below (layer 0's only
        # in a one-layer model)
        later = [h for h in labelled if h[2] != "mixed" and h[0] > 0]
        layer, head, _ = later[0] if later else labelled[-1]
    c = model.config
    if not (0 <= layer < c.n_layer and 0 <= head < c.n_head):
        raise LensError(
            f"--layer={layer} --head={head}: this model has layers 0 to {c.n_layer - 1} "
            f"and heads 0 to {c.n_head - 1}"
        )
    pattern = cache["pattern", layer][0, head].numpy()
    shown = np.array(answer["attention"][layer][head])
    print(f"head {layer}.{head}: its pattern against the explorer's map (rounded to ", end="")
    print(f"{DIGITS} decimals): largest difference {np.abs(pattern - shown).max():.2e}")
    # the composition scores in TransformerLens's own convention, on the weights as its
    # from_pretrained processes them (LayerNorm folded, writing weights centred): the
    # convention heads.py's support/composition.py follows
    processed = hooked_transformer(model, tok, processed=True)
    theirs = processed.all_composition_scores("K")  # (L, H, L, H)
    found = composition_scores(model)["k"]
    n_head = model.config.n_head
    if layer == 0:
        print(f"head {layer}.{head} is in layer 0: no earlier head composes into it")
    for reader in range(n_head if layer > 0 else 0):
        writer, score = strongest(found, layer, reader)
        into = theirs[:layer, :, layer, reader]
        best = int(torch.argmax(into))
        print(
            f"K-composition into head {layer}.{reader}: TransformerLens's strongest writer "
            f"{best // n_head}.{best % n_head} ({into.max():.4f}), heads.py's "
            f"{writer[0]}.{writer[1]} ({score:.4f})"
        )
    title = f"{cfg.out_dir}: layer {layer}, head {head}"
    draw(pattern, shown, tok.token_strings(ids), title, cfg.png)
    print(f"wrote {cfg.png}")


def run(argv):
    return cli.run(main, argv, __doc__, Settings, (LensError,))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
