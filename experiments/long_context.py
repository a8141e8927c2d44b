"""
Long context on the CPU recipe's rope model: does a window without attention
sinks collapse, as StreamingLLM reports, and do 4 sinks hold it?

    python train.py config/shakespeare_cpu.py --out_dir=out-long-context-dense \\
        --n_layer=4 --max_iters=180 --lr_decay_iters=180 --muon_ns_steps=5
    python train.py config/shakespeare_cpu.py --out_dir=out-long-context-window \\
        --sliding_window=32 --sink_tokens=4 \\
        --n_layer=4 --max_iters=180 --lr_decay_iters=180 --muon_ns_steps=5

(docs/long_context.md's figures: the CPU recipe as it was then, 4 layers and 180 iters.)
    python -m experiments.long_context --dense=out-long-context-dense \\
        --windowed=out-long-context-window --out_dir=docs

Every val token from the start of the split is scored one at a time, as
generation would see it, through:
  (a) dense       the full-attention model with generate's rule: the window of
                  block_size tokens slides by a quarter and the cache is rebuilt
  (b) window      the same model, a StreamingLLM cache of the last S + W tokens,
                  no sinks
  (c) sinks       the same cache size, the first S tokens kept as sinks
  (d) trained     the model trained with sliding_window and sink_tokens, rolling cache
(b) and (c) are repeated with the heads that put most weight on the first token
(heads.py's "first" class, the attention sinks if the model has any) ablated.
Prints markdown, writes long_context.png and long_context.json into --out_dir
(default out-experiments/long_context/; docs/ only when given --out_dir=docs).
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import json
import math
import time

import torch
import torch.nn.functional as F

from experiments import SCRATCH
from support import cli
from support.head_measures import ablated, patterns, val_tokens, windows
from support.loading import load_model


@dataclasses.dataclass
class Settings:
    dense: str = "out-shakespeare-char-cpu"  # the CPU recipe's checkpoint folder
    # the same recipe with --sliding_window --sink_tokens
    windowed: str = "out-shakespeare-char-cpu-window"
    blocks: int = 80  # tokens scored: this many times block_size
    sinks: int = 4  # StreamingLLM's sinks for (c); (b) has the same cache size with none
    # how many heads to ablate: those with the largest share of attention on the first token
    ablate: int = 3
    out_dir: str = os.path.join(SCRATCH, "long_context")  # --out_dir=docs: the shipped figures


def load(folder):
    model, tok, _ = load_model("", folder)
    return model.eval(), tok


@torch.no_grad()
def score(model, tokens, window=None, sinks=0, slide=False):
    """(nll per token (n - 1,), tokens/s, cache bytes): each next token's loss given
    what the cache holds, fed one token at a time."""
    cache = model.make_kv_cache(1, window=window, sinks=sinks)
    nll = []
    start = 0
    t0 = time.perf_counter()
    for t in range(len(tokens) - 1):
        new_start = model.context_start(t + 1, start) if slide else start
        if (
            t == 0 or new_start != start
        ):  # the prompt, or a slide: rebuild the cache from the window
            start = new_start
            cache.reset()
            logits = model(tokens[None, start : t + 1], kv_cache=cache, last_only=True)[0]
        else:
            logits = model(tokens[None, t : t + 1], kv_cache=cache)[0]
        nll.append(F.cross_entropy(logits[0, -1:].float(), tokens[t + 1 : t + 2]).item())
    return torch.tensor(nll), (len(tokens) - 1) / (time.perf_counter() - t0), cache.nbytes


def sink_heads(model, tok, data, k):
    """(layer, head) of the k heads with the largest share of their attention on the
    first token, and every head's share, over the val windows heads.py reads."""
    spans = windows(len(data), model.config.block_size, max_windows=200)
    pats = patterns(model, tok, data, spans, batch_size=32)
    shares = [[p["scores"]["first"] for p in layer] for layer in pats]
    ranked = sorted(
        ((s, i, h) for i, row in enumerate(shares) for h, s in enumerate(row)), reverse=True
    )
    return [(i, h) for _, i, h in ranked[:k]], shares


def ppl(nll):
    return math.exp(nll.mean().item())


def main(cfg):
    cli.output_folder(cfg.out_dir)
    torch.manual_seed(0)
    dense, tok = load(cfg.dense)
    trained, _ = load(cfg.windowed)
    data, _ = val_tokens(cfg.dense, tok)
    block = dense.config.block_size
    tokens = torch.from_numpy(data[: cfg.blocks * block + 1].astype("int64"))
    W, S = trained.config.sliding_window, cfg.sinks
    runs = {
        "(a) dense, slides": lambda: score(dense, tokens, slide=True),
        f"(b) window {S + W}, no sinks": lambda: score(dense, tokens, window=S + W, sinks=0),
        f"(c) window {W} + {S} sinks": lambda: score(dense, tokens, window=W, sinks=S),
        f"(d) trained with window {W} + {trained.config.sink_tokens} sinks": lambda: score(
            trained, tokens
        ),
    }
    results = {}
    for name, fn in runs.items():
        print(f"scoring {name} ...", file=sys.stderr)
        nll, rate, nbytes = fn()
        results[name] = dict(nll=nll, tokens_per_s=rate, cache_bytes=nbytes)

    heads, shares = sink_heads(dense, tok, data, cfg.ablate)
    print(f"the {cfg.ablate} heads most on the first token: {heads}", file=sys.stderr)
    ablations = {}
    if heads:
        with ablated(dense, heads):
            for name in list(runs)[:3]:
                print(f"scoring {name}, sink heads ablated ...", file=sys.stderr)
                ablations[name] = runs[name]()[0]

    # the table
    n = len(tokens) - 1
    lines = [
        f"{n} val tokens ({cfg.blocks} x block_size {block}), scored one at a time; "
        f"perplexity over all of them, and over the first and last {block}:",
        "",
        "| run | perplexity | first block | last block | tokens/s | cache bytes |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        nll = r["nll"]
        lines.append(
            f"| {name} | {ppl(nll):.3f} | {ppl(nll[:block]):.3f} | {ppl(nll[-block:]):.3f} | "
            f"{r['tokens_per_s']:.0f} | {r['cache_bytes']:,} |"
        )
    lines += [
        "",
        "Share of each head's attention on the first token (heads.py, val windows; even "
        "attention over a window gives it about 1 / position), layer by layer:",
        "",
    ]
    lines += [f"- layer {i}: " + ", ".join(f"{s:.2f}" for s in row) for i, row in enumerate(shares)]
    if heads:
        lines += [
            "",
            f"Ablating the {len(heads)} heads with the largest first-token share, (layer, head) "
            f"{heads}:",
            "",
            "| run | perplexity intact | ablated |",
            "|---|---|---|",
        ]
        for name, nll in ablations.items():
            lines.append(f"| {name} | {ppl(results[name]['nll']):.3f} | {ppl(nll):.3f} |")
    print("\n".join(lines))

    # the picture: running perplexity in windows of block_size tokens against position
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    pos = torch.arange(n // block) * block + block // 2
    for name, r in results.items():
        binned = r["nll"][: n // block * block].view(-1, block).mean(1).exp()
        ax.plot(pos, binned, label=name)
    ax.axvline(block, color="grey", ls=":", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("position in the val split (tokens)")
    ax.set_ylabel(f"perplexity over each {block} tokens")
    ax.set_title("Scoring past block_size: slide, window, window + sinks, trained window")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(cfg.out_dir, "long_context")
    fig.savefig(path + ".png", dpi=110)
    with open(path + ".json", "w") as f:
        json.dump(
            dict(
                tokens=n,
                block_size=block,
                sink_heads=heads,
                first_share=shares,
                runs={
                    k: dict(
                        perplexity=ppl(v["nll"]),
                        tokens_per_s=v["tokens_per_s"],
                        cache_bytes=v["cache_bytes"],
                    )
                    for k, v in results.items()
                },
                ablated={k: ppl(v) for k, v in ablations.items()},
            ),
            f,
            indent=1,
        )


if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], __doc__, Settings))
