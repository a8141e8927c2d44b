"""
How exactly the exports hold trained models: for each run, the largest difference between
model.py's float32 logits and those of the model in transformers (the class export.py
chose), in TransformerLens's HookedTransformer (support/export_lens.py) and, for the
stock classes, in TransformerLens's TransformerBridge; whether greedy decoding gives the
same tokens; and whether the folder reads back as the checkpoint. docs/export.md has the
table, measured on runs of the configs there.

    python -m experiments.export_exactness \\
        --runs=cpu=out-shakespeare-char-cpu,classic=out-shakespeare-char-cpu-classic \\
        --json=docs/export.json

Each run's logits are over --windows windows of block_size tokens spread over its val
split; greedy decoding starts from the split's first 16 tokens (half of a shorter
block_size) and runs to block_size,
or twice past it where the positions have no end (a window, linear attention).
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import json
import tempfile
import warnings

import numpy as np
import torch

from support import cli
from support.export_hf import ARCHITECTURES, export, hf_class, read_model
from support.export_lens import LensError, hooked_transformer
from support.head_measures import val_tokens
from support.loading import load_model


@dataclasses.dataclass
class Settings:
    runs: str = ""  # name=folder pairs, comma-separated: each a checkpoint's folder
    windows: int = 8  # windows of block_size tokens from each run's val split
    prompt_tokens: int = 16  # the greedy decoding's prompt, from the val split's start
    json: str = ""  # where to write the figures too ("" = only the table)


class ExactnessError(Exception):
    """Bad settings; one line saying what to do."""


def largest(a, b):
    return float((a - b).abs().max())


@torch.no_grad()
def measure(name, folder_of_run, cfg):
    """One row: the largest differences, and what greedy decoding and reading back gave."""
    import transformers

    model, tok, _ = load_model("", folder_of_run)
    model.eval()
    c = model.config
    data, _ = val_tokens(folder_of_run, tok)
    starts = np.linspace(0, len(data) - c.block_size - 1, cfg.windows).astype(int)
    idx = torch.tensor(np.stack([data[s : s + c.block_size] for s in starts]).astype(np.int64))
    ours, maps = model.attention_maps(idx)
    row = {"config": name, "class": ARCHITECTURES[hf_class(c)]}
    folder = tempfile.mkdtemp(prefix="export-") + "/hf"
    export(model, tok, folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    row["transformers"] = largest(ours, hf(idx).logits)
    # a model shorter than twice the prompt decodes from its first half
    prompt = idx[:1, : min(cfg.prompt_tokens, max(1, c.block_size // 2))]
    n = max(1, c.block_size - prompt.size(1))
    if c.context > c.block_size:
        n = 2 * c.block_size
    greedy = hf.generate(prompt, do_sample=False, max_new_tokens=n, min_new_tokens=n)
    row["greedy_tokens"] = n
    row["greedy_equal"] = bool(torch.equal(greedy, model.generate(prompt, n, temperature=0)))
    back = read_model(folder).state_dict()
    same = back.keys() == model.state_dict().keys()
    row["round_trip_equal"] = same and all(
        torch.equal(back[k], t) for k, t in model.state_dict().items()
    )
    try:
        lens = hooked_transformer(model)
        logits, cache = lens.run_with_cache(idx)
        row["lens_logits"] = largest(ours, logits)
        row["lens_patterns"] = max(largest(cache["pattern", i], m) for i, m in enumerate(maps))
    except LensError as e:
        row["lens_refused"] = str(e)
    if hf_class(c) != "hackable_gpt":
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(folder, device="cpu")
        logits, cache = bridge.run_with_cache(idx)
        row["bridge_logits"] = largest(ours, logits)
        row["bridge_patterns"] = max(
            largest(cache[f"blocks.{i}.attn.hook_pattern"], m) for i, m in enumerate(maps)
        )
    return row


def cell(row, key):
    if key not in row:
        return "-"
    return f"{row[key]:.1e}"


def table(rows):
    lines = [
        "| config | class | transformers | greedy tokens | HookedTransformer: logits, "
        "patterns | TransformerBridge: logits, patterns | round trip |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lens = f"{cell(row, 'lens_logits')}, {cell(row, 'lens_patterns')}"
        if "lens_refused" in row:
            lens = "refused"
        bridge = f"{cell(row, 'bridge_logits')}, {cell(row, 'bridge_patterns')}"
        if "bridge_logits" not in row:
            bridge = "-"
        greedy = f"{row['greedy_tokens']} equal"
        if not row["greedy_equal"]:
            greedy = f"{row['greedy_tokens']} DIFFER"
        trip = "equal" if row["round_trip_equal"] else "DIFFERS"
        lines.append(
            f"| {row['config']} | {row['class']} | {cell(row, 'transformers')} | {greedy} "
            f"| {lens} | {bridge} | {trip} |"
        )
    return "\n".join(lines)


def main(cfg):
    pairs = [pair.split("=", 1) for pair in cfg.runs.split(",") if pair]
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise ExactnessError("pass --runs=name=folder,name=folder,... (checkpoint folders)")
    torch.manual_seed(0)
    warnings.filterwarnings("ignore")
    rows = [measure(name, folder, cfg) for name, folder in pairs]
    print(table(rows))
    if cfg.json:
        with open(cfg.json, "w") as f:
            json.dump({"settings": dataclasses.asdict(cfg), "rows": rows}, f, indent=1)
            f.write("\n")


def run(argv):
    return cli.run(main, argv, __doc__, Settings, (ExactnessError,))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
