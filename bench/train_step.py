"""
One optimizer step (forward, backward, AdamW) for three model sizes: ours against
transformers' GPT2LMHeadModel holding the same weights, on the same machine in the
same run.

    python -m bench.train_step [--device=cpu|cuda] [--quick] [--compile] [--threads=N]
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import time
from statistics import median

import torch

from bench import common
from model import GPT, GPTConfig
from support.mfu import estimate_mfu, flops_per_token
from support.optim import configure_optimizers


@dataclasses.dataclass
class Settings(common.Settings):
    compile: bool = False  # torch.compile our model for the training section (cuda only)


# name, model shape, batch on CPU, batch on GPU
TRAIN_CASES = [
    ("nanoGPT CPU settings", common.NANOGPT_CPU, 12, 12),
    ("baby model", common.BABY, 8, 64),
    ("GPT-2 124M", common.GPT2_124M, 1, 12),
]

# Target for the CPU figures (docs/benchmarks.md says whether it is met)
TARGET_TRAIN_VS_HF = 1.25  # nanoGPT CPU settings: HF ms/step / ours ms/step


def adamw(model, device):
    """AdamW with weight decay on matrices only, as support.optim.configure_optimizers does."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), fused=device == "cuda")


def train_step_fn(model, loss_fn, optimizer, device):
    """One training step as a callable, for alternate()."""

    def step():
        with common.autocast(device):
            loss = loss_fn(model)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def our_loss(x, y):
    """Our model's training loss: it takes the targets."""

    def loss(model):
        return model(x, y)[1]

    return loss


def hf_loss(x):
    """Hugging Face's training loss: it shifts the labels itself."""

    def loss(model):
        return model(input_ids=x, labels=x).loss

    return loss


def repeat_counts(name, device, quick):
    """(warm-up steps, repeats, steps per repeat) for one case, or None to skip it.
    On a CPU the larger models get fewer: GPT-2 124M takes about ten seconds a step
    on two cores."""
    if device == "cuda":
        return 10, 10, 10
    if name == "GPT-2 124M":
        if quick:
            return None
        return 1, 3, 1
    if name == "baby model":
        if quick:
            return 1, 1, 1
        return 2, 7, 2
    if quick:
        return 1, 3, 2
    return 3, 15, 5


def bench_case(name, shape, batch, counts, args):
    """One model size: ours and both Hugging Face variants, alternating. A function
    of its own so that each size's models are freed before the next is built."""
    device = args.device
    gpu = device == "cuda"
    warmup, repeats, calls = counts
    T = shape["block_size"]
    torch.manual_seed(0)
    ours = GPT(GPTConfig(dropout=0.0, bias=True, **shape)).to(device)
    hf = common.to_hf(ours)  # gelu_new: what GPT-2's config.json asks for
    # Hugging Face's fused-kernel option
    hf_fused = common.to_hf(ours, activation="gelu_pytorch_tanh")
    seq = torch.randint(0, shape["vocab_size"], (batch, T + 1), device=device)
    x, y = seq[:, :-1], seq[:, 1:]
    logit_diff = common.check_same_logits(ours, hf, x[:1], name)

    compiled = gpu and args.compile
    our_module = ours
    if compiled:
        our_module = torch.compile(ours)
    our_optimizer = configure_optimizers(ours, 0.1, 1e-4, (0.9, 0.95), device)
    fns = {
        "ours": train_step_fn(our_module, our_loss(x, y), our_optimizer, device),
        "hf": train_step_fn(hf, hf_loss(x), adamw(hf, device), device),
        "hf_fused_gelu": train_step_fn(hf_fused, hf_loss(x), adamw(hf_fused, device), device),
    }
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = common.alternate(fns, repeats, calls, device)

    tokens = batch * T
    autocast = None
    if gpu:
        autocast = "bf16"
    row = dict(
        name=name,
        model=shape,
        batch=batch,
        tokens_per_step=tokens,
        warmup_steps=warmup,
        repeats=repeats,
        steps_per_repeat=calls,
        compiled=compiled,
        autocast=autocast,
        max_logit_diff_vs_hf=logit_diff,
    )
    for key, ts in times.items():
        dt = median(ts)
        mfu = None
        if gpu:
            mfu = estimate_mfu(ours, tokens, dt)  # same FLOPs for every contender
        row[key] = dict(
            ms_per_step=dt * 1e3,
            tokens_per_s=tokens / dt,
            mfu=mfu,
            samples_ms=[t * 1e3 for t in ts],
        )
    row["hf_over_ours"] = row["hf"]["ms_per_step"] / row["ours"]["ms_per_step"]
    row["hf_fused_gelu_over_ours"] = (
        row["hf_fused_gelu"]["ms_per_step"] / row["ours"]["ms_per_step"]
    )
    return row


def bench_ours(shape, batch, counts, device, compiled):
    """Our model's training step alone, as train.py runs it (AdamW, bf16 autocast on a
    GPU, compiled on request), on random tokens: the GPU figures' GPT-2 124M. The first
    step, where compiling happens, is timed apart from the warm-up and the repeats."""
    warmup, repeats, calls = counts
    T = shape["block_size"]
    torch.manual_seed(0)
    model = GPT(GPTConfig(dropout=0.0, bias=True, **shape)).to(device)
    module = model
    if compiled:
        module = torch.compile(model)
    optimizer = configure_optimizers(model, 0.1, 1e-4, (0.9, 0.95), device)
    seq = torch.randint(0, shape["vocab_size"], (batch, T + 1), device=device)
    step = train_step_fn(module, our_loss(seq[:, :-1], seq[:, 1:]), optimizer, device)
    common.sync(device)
    t0 = time.perf_counter()
    step()
    common.sync(device)
    first_step_s = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    times = common.alternate({"ours": step}, repeats, calls, device)["ours"]
    dt = median(times)
    tokens = batch * T
    autocast = None
    if device == "cuda":
        autocast = "bf16"
    return dict(
        model=shape,
        parameters=model.num_params(),
        batch=batch,
        tokens_per_step=tokens,
        compiled=compiled,
        autocast=autocast,
        first_step_s=first_step_s,
        warmup_steps=warmup,
        repeats=repeats,
        steps_per_repeat=calls,
        ms_per_step=dt * 1e3,
        tokens_per_s=tokens / dt,
        flops_per_token=flops_per_token(model),
        mfu=estimate_mfu(model, tokens, dt),
        samples_ms=[t * 1e3 for t in times],
    )


def bench_train(args, log):
    device = args.device
    rows = []
    for name, shape, cpu_batch, gpu_batch in TRAIN_CASES:
        counts = repeat_counts(name, device, args.quick)
        if counts is None:
            log(f"train: {name} skipped (--quick on CPU)")
            continue
        batch = cpu_batch
        if device == "cuda":
            batch = gpu_batch
        elif args.quick and name == "baby model":
            batch = 1  # --quick judges nothing: one sequence keeps its steps to a second
        log(f"train: {name}, batch {batch} x {shape['block_size']} ...")
        rows.append(bench_case(name, shape, batch, counts, args))
    return rows


def train_table(rows, gpu):
    head = [
        "model",
        "batch x block",
        "ours ms/step",
        "HF ms/step",
        "HF fused-GELU ms/step",
        "ours tok/s",
        "HF tok/s",
        "HF/ours",
        "HF fused-GELU/ours",
    ]
    if gpu:
        head += ["ours MFU", "HF MFU"]
    lines = [head]
    for r in rows:
        line = [
            r["name"],
            f"{r['batch']} x {r['model']['block_size']}",
            f"{r['ours']['ms_per_step']:.1f}",
            f"{r['hf']['ms_per_step']:.1f}",
            f"{r['hf_fused_gelu']['ms_per_step']:.1f}",
            f"{r['ours']['tokens_per_s']:,.0f}",
            f"{r['hf']['tokens_per_s']:,.0f}",
            f"{r['hf_over_ours']:.2f}x",
            f"{r['hf_fused_gelu_over_ours']:.2f}x",
        ]
        if gpu:
            line += [common.percent(r["ours"]["mfu"]), common.percent(r["hf"]["mfu"])]
        lines.append(line)
    return common.markdown(lines)


def train_targets(rows, quick):
    """The CPU target with its measured value and whether it is met (None for --quick)."""
    found = []
    by_name = {r["name"]: r for r in rows}
    if "nanoGPT CPU settings" in by_name:
        x = by_name["nanoGPT CPU settings"]["hf_over_ours"]
        text = (
            f"training step, nanoGPT CPU settings: >= {TARGET_TRAIN_VS_HF}x "
            "faster than Hugging Face"
        )
        found.append(common.target(text, x, x >= TARGET_TRAIN_VS_HF, quick))
    return found


def section(args, log):
    """The figures, the table and (on a CPU) the target, for common.run."""
    gpu = args.device == "cuda"
    rows = bench_train(args, log)
    table = "## Training step (forward, backward, AdamW)\n\n" + train_table(rows, gpu)
    found = []
    if not gpu:
        found = train_targets(rows, args.quick)
    return dict(train=rows), [table], found


def sections(args):
    return [section]


if __name__ == "__main__":
    sys.exit(common.main("bench.train_step", __doc__, Settings, sections, sys.argv[1:]))
