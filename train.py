"""
Train a GPT on a prepared dataset, on one device or data-parallel.

    python train.py config/shakespeare.py                  # a GPU: the character-level baby GPT
    python train.py config/shakespeare_cpu.py              # a small version for a CPU
    python train.py config/shakespeare.py --batch_size=32  # any key can be overridden
    python train.py config/shakespeare.py --init_from=resume          # continue exactly
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py  # DistributedDataParallel
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_cpu.py --context_parallel=2
    (each sequence split over the 2 processes: ring attention, docs/ring_attention.md)

Settings: DEFAULTS below, then config files (Python), then --key=value; see
`python train.py --help`. Each evaluation is printed and appended to
out_dir/log.jsonl; out_dir/ckpt.pt holds what resuming or sampling needs.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import contextlib
import copy
import dataclasses
import datetime
import functools
import json
import math
import os
import signal
import sys
import threading
import time
import types

import torch
import torch.distributed as dist
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from data.prepare import DataError, ensure_dataset, load_meta
from model import GPT, GPTConfig
from support import hellaswag
from support.batches import get_batch, load_split, step_batches
from support.checkpoint import (
    CheckpointError,
    checkpoint_path,
    clean_state_dict,
    first_line,
    load_checkpoint,
    save_checkpoint,
)
from support.configurator import ConfigError, describe, parse_args
from support.context_parallel import ContextParallel
from support.context_parallel import check as check_context_parallel
from support.hardware import auto_dtype, bf16_error, faster_cpu_dtype, native_bf16
from support.optim import get_lr, make_optimizers
from support.tokenizer import TokenizerError

# -----------------------------------------------------------------------------
# Configuration, with nanoGPT's key names. The defaults train GPT-2 124M.

DEFAULTS = dict(
    # evaluation, logging, checkpoints
    out_dir="out",
    eval_interval=2000,
    log_interval=1,
    eval_iters=200,
    eval_only=False,  # evaluate once and exit
    eval_full_val=False,  # the final evaluation also scores the whole val split (the val loss of record)
    hellaswag=False,  # also score HellaSwag at every evaluation (support/hellaswag.py)
    hellaswag_data=None,  # a HellaSwag .jsonl; None: the official val file, fetched on first use
    eval_at_start=True,  # False: a fresh run's first evaluation is at eval_interval, not before the first step
    muon_ns_steps=5,  # Newton-Schulz iterations per Muon step (torch.optim.Muon's ns_steps)
    always_save_checkpoint=True,  # False: save only when val loss improves, and at the end
    init_from="scratch",  # 'scratch', 'resume' (from out_dir), a Hugging Face GPT-2 folder, or 'gpt2*'
    wandb_log=False,
    wandb_project="gpt",
    wandb_run_name=None,  # None: wandb picks a name
    # data
    dataset="shakespeare_char",
    data_root=None,  # the folder of dataset folders; None: data/ in this repo
    gradient_accumulation_steps=5 * 8,  # micro-steps per iter in all, shared by the DDP processes
    batch_size=12,
    block_size=1024,
    # model; n_kv_head None: as many as n_head
    n_layer=12,
    n_head=12,
    n_embd=768,
    dropout=0.0,
    bias=True,
    n_kv_head=None,
    rope=False,
    qk_norm=False,
    activation="gelu",
    attention="softmax",  # or 'linear': phi(q).phi(k) attention, O(T), a fixed-size state when generating
    sliding_window=None,
    sink_tokens=0,  # each query sees its last W positions and the first S (model.py)
    # optimizer: 'adamw', or 'muon' (Muon for the hidden matrices, AdamW for the rest)
    optimizer="adamw",
    learning_rate=6e-4,
    max_iters=600000,
    weight_decay=1e-1,
    beta1=0.9,
    beta2=0.95,
    grad_clip=1.0,  # grad_clip 0: no clipping
    # learning rate: linear warmup, then cosine decay to min_lr
    decay_lr=True,
    warmup_iters=2000,
    lr_decay_iters=600000,
    min_lr=6e-5,
    max_time=0.0,  # seconds of training after which to evaluate, save and stop; 0: no limit
    # system
    device="auto",  # 'auto' (cuda, then mps, then cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
    dtype="auto",  # 'auto': bfloat16 where it runs natively (and on a CPU, is faster), else float16 on CUDA, float32
    compile=None,  # torch.compile; None: on for CUDA only
    seed=1337,
    ddp_timeout=600,  # seconds a process waits for the others before it fails
    # processes per sequence, each holding 1/context_parallel of it (context_parallel.py)
    context_parallel=1,
    context_parallel_layout="zigzag",  # or 'contiguous'
)

MODEL_KEYS = (
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "bias",
    "dropout",
    "n_kv_head",
    "rope",
    "qk_norm",
    "activation",
    "attention",
    "sliding_window",
    "sink_tokens",
)
DTYPES = ("auto", "float32", "bfloat16", "float16")
USER_ERRORS = (ConfigError, DataError, CheckpointError, TokenizerError, ValueError)


class TrainingError(Exception):
    """Training cannot go on (the loss diverged); the message is for the user."""


def check_config(cfg):
    """Refuse bad values before anything slow happens."""
    for key, value in cfg.items():  # the parser lets None through for any key
        if value is None and DEFAULTS[key] is not None:
            raise ValueError(f"{key} cannot be None; give it a value like {DEFAULTS[key]!r}")
    for key in (
        "batch_size",
        "block_size",
        "gradient_accumulation_steps",
        "eval_interval",
        "eval_iters",
        "log_interval",
        "ddp_timeout",
        "context_parallel",
        "muon_ns_steps",
    ):
        if cfg[key] < 1:
            raise ValueError(f"{key} must be a positive integer, got {cfg[key]}")
    for key in (
        "max_iters",
        "warmup_iters",
        "lr_decay_iters",
        "learning_rate",
        "min_lr",
        "weight_decay",
        "grad_clip",
        "max_time",
    ):
        if not 0 <= cfg[key] < math.inf:
            raise ValueError(f"{key} must be a finite number >= 0, got {cfg[key]}")
    if not -(2**63) <= cfg["seed"] < 2**63:
        raise ValueError(f"seed must fit in a signed 64-bit integer, got {cfg['seed']}")
    if cfg["ddp_timeout"] > 10**9:
        raise ValueError(f"ddp_timeout must be at most 1e9 seconds, got {cfg['ddp_timeout']}")
    for key in ("beta1", "beta2"):
        if not 0 <= cfg[key] < 1:
            raise ValueError(f"{key} must be in [0, 1), got {cfg[key]}")
    if cfg["dtype"] not in DTYPES:
        raise ValueError(f"unknown dtype {cfg['dtype']!r}; use one of {', '.join(DTYPES)}")
    if cfg["optimizer"] not in ("adamw", "muon"):
        raise ValueError(f"unknown optimizer {cfg['optimizer']!r}; use 'adamw' or 'muon'")
    if cfg["optimizer"] == "muon" and not hasattr(torch.optim, "Muon"):
        raise ValueError(
            "optimizer='muon' needs torch.optim.Muon (torch >= 2.9); use --optimizer=adamw"
        )
    if cfg["compile"] not in (None, True, False):
        raise ValueError(f"compile must be True, False or None (auto), got {cfg['compile']!r}")
    for key in ("data_root", "wandb_run_name"):
        if cfg[key] is not None and not isinstance(cfg[key], str):
            raise ValueError(f"{key} must be a string or None, got {cfg[key]!r}")
    if cfg["attention"] != "softmax" and cfg["init_from"] not in ("scratch", "resume"):
        raise ValueError(
            f"init_from={cfg['init_from']!r} loads GPT-2's weights, which need softmax attention; "
            f"train --attention={cfg['attention']} from scratch"
        )
    if cfg["init_from"] == "scratch":
        GPTConfig(**model_args(cfg, vocab_size=1))  # raises on bad model sizes


def model_args(cfg, vocab_size):
    return dict({key: cfg[key] for key in MODEL_KEYS}, vocab_size=vocab_size)


def pick_device(cfg, local_rank, ddp):
    """(device, dtype name, why that dtype): CUDA, then MPS, then CPU; dtype 'auto'
    is bfloat16 autocast where the hardware has native bfloat16 (hardware.py).
    A CUDA device becomes the current one."""
    available = {
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
        "cpu": True,
    }
    name = (
        next(kind for kind, ok in available.items() if ok)
        if cfg["device"] == "auto"
        else cfg["device"]
    )
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in available:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    if not available[device.type]:
        raise ValueError(f"{device.type.upper()} is not available; use --device=cpu")
    if device.type == "cuda" and (ddp or device.index is None):
        device = torch.device("cuda", local_rank)  # one GPU per process
    if device.type == "cuda":
        if device.index >= torch.cuda.device_count():
            raise ValueError(
                f"there is no {device}: this machine has {torch.cuda.device_count()} GPU(s); "
                "use --device=cuda:N with N below that, or fewer processes"
            )
        # synchronize, pinned copies, the MFU's device name and the bf16 check
        # below all act on the current device, which is otherwise GPU 0
        torch.cuda.set_device(device)
    dtype, why = cfg["dtype"], "as set"
    if dtype == "auto":
        dtype, why = auto_dtype(device.type)
    if dtype == "float16" and device.type != "cuda":
        raise ValueError("float16 training needs CUDA; use --dtype=bfloat16 or --dtype=float32")
    if dtype == "bfloat16" and (error := bf16_error(device.type)):
        raise ValueError(error)  # where bfloat16 would die with SIGILL
    return device, dtype, why


def time_cpu_dtypes(cfg, model, data):
    """('bfloat16' or 'float32', why) for dtype='auto' on a CPU with native bfloat16:
    whichever runs a forward and backward of this model faster (best of 4, on up
    to 2048 tokens at the run's shapes), timed once per shape (hardware.py)."""
    n = max(1, min(cfg["batch_size"], 2048 // cfg["block_size"]))
    x, y = get_batch(data, torch.zeros(n, dtype=torch.long), cfg["block_size"], torch.device("cpu"))

    def seconds(dtype):
        best = float("inf")
        with torch.random.fork_rng(
            devices=[]
        ):  # dropout draws here must not shift the run's random numbers
            for _ in range(4):  # the first picks kernels and allocates
                t0 = time.perf_counter()
                with precision_context("cpu", dtype, cfg["block_size"]):
                    loss = model(x, y)[1]
                loss.backward()
                best = min(best, time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        return best

    key = (
        ",".join(f"{k}={cfg[k]}" for k in MODEL_KEYS + ("batch_size",))
        + f",threads={torch.get_num_threads()}"
    )
    return faster_cpu_dtype(key, seconds)


@contextlib.contextmanager
def precision_context(device_type, dtype, block_size):
    """Autocast for the forward pass (nothing in float32). On CPU, for contexts of
    128 or less, attention takes PyTorch's math path: there the CPU flash-attention
    kernel is 2-3x slower in bfloat16 than in float32, while the math path's
    matrix multiplies run at bfloat16 speed (docs/benchmarks.md, 'Training on CPU
    in bfloat16'). Longer contexts keep the fused kernel, which wins there."""
    if dtype == "float32":
        yield
        return
    math_attention = device_type == "cpu" and block_size <= 128
    with (
        torch.autocast(device_type, getattr(torch, dtype)),
        sdpa_kernel(SDPBackend.MATH) if math_attention else contextlib.nullcontext(),
    ):
        yield


# -----------------------------------------------------------------------------
# Evaluation: the mean loss over batches (batches.py draws them)


def all_sum(t, world):
    if world > 1:
        dist.all_reduce(t)
    return t


@torch.no_grad()
def mean_loss(r, model, data, batches, desc):
    """Mean loss per token over batches [(starts (N,), length)], shared by the
    processes, with a progress bar; a stop signal ends it (Stopped) within a batch."""
    total = torch.zeros(2, device=r.device)  # (loss summed over tokens, tokens)
    mine = batches[r.dp_rank :: r.dp_world]  # the ranks of one sequence share its batches
    rounds = -(-len(batches) // r.dp_world)  # every process checks for a stop in every round
    model.eval()
    try:
        for i in tqdm(
            range(rounds), desc=desc, leave=False, disable=not r.master, dynamic_ncols=True
        ):
            if stop_requested(r, agree=True):
                raise Stopped()
            if i < len(mine):
                x, y = map(r.split, get_batch(data, *mine[i], r.device))
                with r.ctx():
                    total[0] += model(x, y)[1].float() * y.numel()
                total[1] += y.numel()
    finally:
        model.train()
    total = all_sum(total, r.world)
    return (total[0] / total[1]).item()


def estimate_loss(r, seed):
    """Loss on eval_iters random batches per split. The generator is a fresh one,
    so evaluating never shifts the training batches."""
    gen, B, T = torch.Generator().manual_seed(seed), r.cfg["batch_size"], r.cfg["block_size"]
    losses = {}
    for split, data in r.splits.items():
        starts = torch.randint(
            len(data) - T, (r.cfg["eval_iters"], B), generator=gen
        )  # (eval_iters, B)
        losses[split] = mean_loss(
            r, r.model, data, [(row, T) for row in starts], f"evaluating {split}"
        )
    return losses


def full_val_loss(r):
    """Loss on every token of the val split, in non-overlapping block_size
    windows (the last one shorter): the val loss of record, without sampling noise."""
    data, B, T = r.splits["val"], r.cfg["batch_size"], r.cfg["block_size"]
    n = len(data) - 1  # tokens with a next token to predict
    starts = torch.arange(0, n, T)
    batches = [(batch, T) for batch in starts[: n // T].split(B)]
    tail = n % T // r.split_unit * r.split_unit  # context parallelism leaves out < 2P tokens
    if tail:
        batches.append((starts[-1:], tail))
    return mean_loss(r, r.raw, data, batches, "whole val split")


# -----------------------------------------------------------------------------
# Model (optim.py holds the optimizers)


# What resuming reads from a checkpoint, and the type each must have.
RESUME_FIELDS = {
    "model": dict,
    "model_args": dict,
    "optimizer": (dict, list),
    "iter_num": int,
    "best_val_loss": (int, float),
    "config": dict,
    "rng": dict,
    "data": dict,
}
# What loading a damaged (but unpicklable) checkpoint or weights file raises.
LOAD_ERRORS = (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError, EOFError)


def out_of_memory(e):
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(e)


def check_resumable(ckpt, path):
    missing = sorted(set(RESUME_FIELDS) - set(ckpt))
    if missing:
        raise CheckpointError(f"cannot resume from {path}: it lacks {', '.join(missing)}")
    bad = [
        key
        for key, kind in RESUME_FIELDS.items()
        if not isinstance(ckpt[key], kind) or isinstance(ckpt[key], bool)
    ]
    if bad:
        raise CheckpointError(
            f"cannot resume from {path}: its {', '.join(bad)} entry has the wrong type; "
            "the file is damaged, resume from another copy"
        )


def load_pretrained(init, cfg):
    """GPT-2 weights from a Hugging Face folder or by name; any failure is one line naming it."""
    try:
        return GPT.from_pretrained(
            init, dropout=cfg["dropout"], block_size=cfg["block_size"], attention=cfg["attention"]
        )
    except (OSError, *LOAD_ERRORS) as e:
        if out_of_memory(e):
            raise
        raise ValueError(f"could not load GPT-2 weights from {init}: {first_line(e)}") from None


def init_model(cfg, meta, device):
    """(model, checkpoint or None); cfg's model keys are set to the model's own."""
    init, ckpt = cfg["init_from"], None
    if init == "scratch":
        model = GPT(GPTConfig(**model_args(cfg, meta["vocab_size"])))
    elif init == "resume":
        ckpt, path = load_checkpoint(cfg["out_dir"]), checkpoint_path(cfg["out_dir"])
        check_resumable(ckpt, path)
        if ckpt.get("tokenizer") != meta["tokenizer"]:
            raise ValueError(
                f"the checkpoint in {cfg['out_dir']} was trained on another tokenizer "
                f"(dataset {ckpt.get('dataset')!r}); pass --dataset={ckpt.get('dataset')}"
            )
        try:
            model = GPT(GPTConfig(**dict(ckpt["model_args"], dropout=cfg["dropout"])))
            model.load_state_dict(ckpt["model"])
        except LOAD_ERRORS as e:
            if out_of_memory(e):
                raise
            raise CheckpointError(
                f"{path} does not match this model.py ({first_line(e)}); "
                "resume from another copy or train again"
            ) from None
    elif os.path.isdir(init) or init.startswith("gpt2"):
        if meta["tokenizer"]["kind"] != "gpt2":
            raise ValueError(
                f"init_from={init!r} needs a dataset tokenized with GPT-2 BPE, and "
                f"{cfg['dataset']!r} is not; try --dataset=shakespeare"
            )
        model = load_pretrained(init, cfg)
    else:
        raise ValueError(
            f"init_from must be 'scratch', 'resume', a GPT-2 folder or a 'gpt2*' name, not {init!r}"
        )
    if model.config.vocab_size < meta["vocab_size"]:
        raise ValueError(
            f"the model's vocabulary ({model.config.vocab_size}) is smaller than the "
            f"dataset's ({meta['vocab_size']})"
        )
    cfg.update({key: getattr(model.config, key) for key in MODEL_KEYS})
    return model.to(device), ckpt


def rng_state(device):
    rng = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def set_rng_state(rng, device):
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)


def restore(ckpt, cfg, optimizers, scaler, data_gen, device, rank):
    """Optimizer, RNG and data-sampling state as they were right before iter ckpt['iter_num']."""
    if ckpt["iter_num"] >= cfg["max_iters"] and not cfg["eval_only"]:
        raise ValueError(
            f"the checkpoint is at iter {ckpt['iter_num']} and max_iters is {cfg['max_iters']}; "
            "raise --max_iters to train further"
        )
    states = ckpt["optimizer"] if isinstance(ckpt["optimizer"], list) else [ckpt["optimizer"]]
    if len(states) != len(optimizers):
        raise ValueError(
            f"the checkpoint was trained with optimizer={ckpt['config'].get('optimizer')!r}; "
            "resume with the same one"
        )
    try:
        for opt, state in zip(optimizers, states):
            opt.load_state_dict(state)
        if "scaler" in ckpt:
            scaler.load_state_dict(ckpt["scaler"])
        data_gen.set_state(ckpt["data"]["generator"])
        if rank > 0:  # only rank 0's RNG is saved; the others need dropout masks of their own
            torch.manual_seed(cfg["seed"] + rank + 1000 * ckpt["iter_num"])
            return
        set_rng_state(ckpt["rng"], device)
    except LOAD_ERRORS as e:
        raise CheckpointError(
            f"cannot resume from {checkpoint_path(cfg['out_dir'])}: its optimizer, RNG or "
            f"data-sampling state is damaged ({first_line(e)}); resume from another copy"
        ) from None


def explain_device(cfg, device, dtype):
    """What a CPU run should know before it starts: no GPU was found (and what to
    run instead), or bfloat16 was asked for where this CPU only emulates it."""
    if cfg["device"] == "auto" and device.type == "cpu":
        print(
            "no GPU found: training on the CPU. For a model sized for a CPU, run "
            "python train.py config/shakespeare_cpu.py",
            flush=True,
        )
    if device.type == "cpu" and dtype == "bfloat16" and not native_bf16("cpu")[0]:
        print(
            f"warning: this CPU has {native_bf16('cpu')[1]}, so bfloat16 is emulated and matrix multiplies "
            "run many times slower than in float32; --dtype=auto picks float32 here",
            file=sys.stderr,
        )


def start_wandb(cfg):
    try:
        import wandb  # here only: a slow import that most runs do not need
    except ImportError:
        raise ValueError("wandb_log=True needs wandb: pip install wandb") from None
    try:
        wandb.init(project=cfg["wandb_project"], name=cfg["wandb_run_name"], config=cfg)
    except wandb.errors.UsageError as e:
        # no API key, and no terminal to ask for one: say so before any work starts
        raise ValueError(
            f"wandb_log=True, but wandb cannot start ({first_line(e)}): run `wandb login` "
            "once, or set WANDB_MODE=offline to log locally and `wandb sync` later"
        ) from None
    return wandb


# -----------------------------------------------------------------------------
# Setup: everything that can fail because of the settings happens here


def join_processes(device, timeout):
    """Join the other processes: NCCL between GPUs, gloo between CPUs."""
    if device.type != "cuda":
        dist.init_process_group("gloo", timeout=timeout)
        return
    # By default a collective that fails or outlives the timeout makes NCCL's
    # watchdog thread abort the whole process, before train.py can say what
    # happened. Mode 2 aborts only the communicator; the next collective then
    # raises in Python, and main() prints one line. torchrun sets 1 (abort the
    # process) unless told otherwise, so this overrides it (docs/reliability.md).
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
    # device_id: this process's GPU, so NCCL connects now rather than at the
    # first collective, and barrier() need not guess the device from the rank
    dist.init_process_group("nccl", timeout=timeout, device_id=device)


def wrap_model(raw, device, world, use_compile):
    """(model, ddp_model): model is raw, compiled if use_compile (evaluation runs
    it); ddp_model is what trains. The compiled module goes inside DDP, the order
    PyTorch's guide "Where to apply torch.compile?" gives: compiled inside DDP's
    forward, the graph is split at DDP's gradient buckets (DDPOptimizer), so each
    bucket's all-reduce overlaps the rest of the backward pass."""
    model = torch.compile(raw) if use_compile else raw
    if world == 1:
        return model, model
    return model, DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def setup(cfg):
    rank, local_rank, world = (
        int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1))
    )  # set by torchrun
    check_context_parallel(cfg, world)
    dp_world = world // cfg["context_parallel"]  # the ranks of one sequence share its batches
    if cfg["gradient_accumulation_steps"] % dp_world:
        raise ValueError(
            f"gradient_accumulation_steps ({cfg['gradient_accumulation_steps']}) must be "
            f"divisible by the number of data-parallel processes ({dp_world})"
        )
    device, dtype, why = pick_device(cfg, local_rank, world > 1)
    if rank == 0:
        explain_device(cfg, device, dtype)
    # first: a logger that cannot start should stop the run before any data or model work
    wandb = start_wandb(cfg) if cfg["wandb_log"] and rank == 0 else None
    if world > 1:
        join_processes(device, datetime.timedelta(seconds=cfg["ddp_timeout"]))
    cp = (
        ContextParallel(cfg["context_parallel"], cfg["context_parallel_layout"] == "zigzag")
        if cfg["context_parallel"] > 1
        else None
    )
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
    torch.manual_seed(cfg["seed"] + rank)  # model init, then dropout

    if local_rank == 0:  # prepares a missing dataset while the other processes wait
        ensure_dataset(cfg["dataset"], cfg["data_root"])
    if world > 1:
        dist.barrier()
    dataset_dir = ensure_dataset(cfg["dataset"], cfg["data_root"])
    meta = load_meta(dataset_dir)
    if cfg["hellaswag"]:  # a missing or malformed file stops the run before it starts
        hellaswag.training_examples(cfg["hellaswag_data"])
    raw, ckpt = init_model(cfg, meta, device)
    splits = {
        split: load_split(dataset_dir, split, cfg["block_size"], meta["vocab_size"], device)
        for split in ("train", "val")
    }
    if cfg["dtype"] == "auto" and device.type == "cpu" and dtype == "bfloat16":
        # timed on rank 0 alone, so before the ring is attached: it would wait for the others
        choice = [time_cpu_dtypes(cfg, raw, splits["val"]) if rank == 0 else None]
        if world > 1:
            dist.broadcast_object_list(choice)  # every process trains in the same precision
        dtype, why = choice[0]
    if cp is not None:
        cp.attach(raw)
    optimizers = make_optimizers(raw, cfg, device.type, dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == "float16")
    data_gen = torch.Generator().manual_seed(cfg["seed"])  # the same on every process
    if ckpt is not None:
        restore(ckpt, cfg, optimizers, scaler, data_gen, device, rank)

    use_compile = device.type == "cuda" and cp is None if cfg["compile"] is None else cfg["compile"]
    model, ddp_model = wrap_model(raw, device, world, use_compile)
    ctx = functools.partial(precision_context, device.type, dtype, cfg["block_size"])
    tokens_per_iter = cfg["gradient_accumulation_steps"] * cfg["batch_size"] * cfg["block_size"]
    if rank == 0:
        try:
            os.makedirs(cfg["out_dir"], exist_ok=True)
            if ckpt is None:  # a new run starts a new log; a resumed run goes on with its own
                open(os.path.join(cfg["out_dir"], "log.jsonl"), "w").close()
        except OSError as e:
            raise ValueError(
                f"cannot write into out_dir {cfg['out_dir']!r} ({e.strerror or e}); "
                "pass an --out_dir that can be created and written"
            ) from None
        split = f" ({dp_world} x {cfg['context_parallel']} per sequence)" if cp else ""
        print(
            f"{raw.num_params() / 1e6:.2f}M parameters | {device}, {dtype} ({why}) | {world} process(es){split} | "
            f"{tokens_per_iter:,} tokens per iter | {dataset_dir}"
        )
    return types.SimpleNamespace(
        cfg=cfg,
        rank=rank,
        world=world,
        master=rank == 0,
        device=device,
        dtype=dtype,
        ctx=ctx,
        raw=raw,
        model=model,
        # context parallelism: the data-parallel place, and this rank's part of a sequence
        dp_rank=rank // cfg["context_parallel"],
        dp_world=dp_world,
        split=cp.split if cp else (lambda t: t),
        split_unit=cp.unit if cp else 1,
        ddp_model=ddp_model,
        optimizers=optimizers,
        scaler=scaler,
        data_gen=data_gen,
        splits=splits,
        meta=meta,
        tokens_per_iter=tokens_per_iter,
        resumed=ckpt is not None,
        wandb=wandb,
        # a checkpoint saved by a stop signal has not been evaluated at its iter (older ones always were)
        # (eval_at_start=False: a fresh run counts as evaluated, its loss being about ln(vocab_size))
        start_evaluated=ckpt.get("evaluated", True)
        if ckpt is not None
        else not cfg["eval_at_start"],
        start_iter=ckpt["iter_num"] if ckpt else 0,
        best_val_loss=ckpt["best_val_loss"] if ckpt else float("inf"),
    )


# -----------------------------------------------------------------------------
# Training


def train_step(r, lr):
    """One iter: all micro-steps, then one optimizer step. Returns this
    process's loss summed over its micro-steps, left on the device."""
    for opt in r.optimizers:
        for group in opt.param_groups:
            group["lr"] = lr
    before = rng_state(r.device), r.data_gen.get_state()  # to undo a step cut short
    x, y = map(
        r.split, step_batches(r.splits["train"], r.data_gen, r.cfg, r.dp_rank, r.dp_world, r.device)
    )
    n = x.size(0)
    loss_sum = torch.zeros((), device=r.device)
    for micro in range(n):
        # one process stops between micro-steps; processes of DDP finish the step
        # (stopping there would need a collective per micro-step)
        if micro > 0 and r.world == 1 and stop_requested(r):
            for opt in r.optimizers:
                opt.zero_grad(set_to_none=True)
            set_rng_state(before[0], r.device)
            r.data_gen.set_state(before[1])
            raise Stopped()
        # DDP averages the gradients across processes on the last micro-step only
        sync = r.ddp_model.no_sync() if r.world > 1 and micro < n - 1 else contextlib.nullcontext()
        with sync:
            with r.ctx():
                _, loss = r.ddp_model(x[micro], y[micro])
            loss_sum += loss.detach().float()
            r.scaler.scale(loss / n).backward()
    if r.cfg["grad_clip"] > 0:
        for opt in r.optimizers:
            r.scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(r.raw.parameters(), r.cfg["grad_clip"])
    for opt in r.optimizers:
        r.scaler.step(opt)
    r.scaler.update()
    for opt in r.optimizers:
        opt.zero_grad(set_to_none=True)
    return loss_sum


def save(r, iter_num, best_val_loss, evaluated=True):
    """The state right before iter iter_num, so that resuming repeats it exactly;
    evaluated: whether iter_num's evaluation, if it has one, is in the log."""
    if not r.master:
        return
    rng = rng_state(r.device)
    states = [opt.state_dict() for opt in r.optimizers]
    ckpt = dict(
        model=clean_state_dict(r.raw.state_dict()),
        optimizer=states[0] if len(states) == 1 else states,
        model_args=dataclasses.asdict(r.raw.config),
        iter_num=iter_num,
        best_val_loss=best_val_loss,
        config=dict(r.cfg),
        tokenizer=r.meta["tokenizer"],
        dataset=r.cfg["dataset"],
        rng=rng,
        evaluated=evaluated,
        data={"generator": r.data_gen.get_state()},
    )
    if r.scaler.is_enabled():
        ckpt["scaler"] = r.scaler.state_dict()
    save_checkpoint(ckpt, checkpoint_path(r.cfg["out_dir"]))


def diverged(loss, iter_num):
    return TrainingError(
        f"the loss is {loss} at iter {iter_num}: training diverged; "
        "try a lower --learning_rate (the last checkpoint is kept)"
    )


def evaluate(r, iter_num, elapsed, final):
    """Evaluate; print and log one line to out_dir/log.jsonl (and wandb)."""
    losses = estimate_loss(r, r.cfg["seed"] + iter_num)
    rec = dict(
        iter=iter_num,
        train_loss=losses["train"],
        val_loss=losses["val"],
        lr=get_lr(iter_num, r.cfg),
        elapsed_s=round(elapsed, 3),
        tokens=iter_num * r.tokens_per_iter,
    )
    if final and r.cfg["eval_full_val"]:
        rec["val_loss_full"] = full_val_loss(r)
    if r.cfg["hellaswag"]:
        rec.update(
            hellaswag.training_scores(
                r.raw,
                r.meta["tokenizer"],
                r.cfg["hellaswag_data"],
                r.device,
                r.ctx,
                r.dp_rank,
                r.dp_world,
            )
        )
    if not (math.isfinite(rec["train_loss"]) and math.isfinite(rec["val_loss"])):
        raise diverged(rec["val_loss"], iter_num)
    if r.master:
        full = f", whole val split {rec['val_loss_full']:.4f}" if "val_loss_full" in rec else ""
        tqdm.write(
            f"iter {iter_num}: train loss {rec['train_loss']:.4f}, val loss {rec['val_loss']:.4f}{full}"
        )
        path = os.path.join(r.cfg["out_dir"], "log.jsonl")
        try:
            with open(path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:
            raise TrainingError(
                f"cannot write {path} ({e.strerror or e}); the last checkpoint is kept"
            ) from None
        if r.wandb is not None:
            r.wandb.log(rec, step=iter_num)
    return rec


class Stopped(Exception):
    """A stop signal arrived during an evaluation or between micro-steps."""


def stop_requested(r, agree=False):
    """Whether SIGINT or SIGTERM has arrived. With agree, whether it has in any
    process: a collective, so every process must ask at the same point."""
    asked = getattr(r, "signals", None) is not None and r.signals.name is not None
    if agree and r.world > 1:
        return all_sum(torch.tensor([float(asked)], device=r.device), r.world).item() > 0
    return asked


class StopSignals:
    """SIGINT and SIGTERM ask training to stop: after the current step, or inside
    an evaluation or between micro-steps (Stopped); a second signal stops at once."""

    def __init__(self):
        self.name, self.saved = None, {}

    def handle(self, signum, frame):
        self.name = signal.Signals(signum).name
        signal.signal(signum, self.saved[signum] or signal.SIG_DFL)

    def __enter__(self):
        if (
            threading.current_thread() is threading.main_thread()
        ):  # signals reach the main thread only
            self.saved = {
                sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)
            }
        return self

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler or signal.SIG_DFL)


def time_iter(r, fraction=2):
    """(seconds per training iter, seconds per evaluation batch) here, timed on a
    copy of the model with optimizers of its own, so the run's weights, optimizer
    state, RNG and batches stay as they were. The passes run on 1/fraction of a
    micro-batch and are scaled up, so the estimate comes within seconds even where
    a step takes a minute; each is timed on its second call (the first picks
    kernels and allocates)."""
    cfg, rng = r.cfg, rng_state(r.device)
    model = copy.deepcopy(r.raw)
    optimizers = make_optimizers(model, cfg, r.device.type, r.dtype)
    n = max(1, cfg["batch_size"] // fraction)
    x, y = get_batch(r.splits["val"], torch.zeros(n, dtype=torch.long), cfg["block_size"], r.device)

    def forward_backward():
        with r.ctx():
            model(x, y)[1].backward()

    def optimizer_step():
        for opt in optimizers:
            opt.step()

    @torch.no_grad()
    def evaluation():
        with r.ctx():
            model(x, y)

    def seconds(fn):
        for _ in range(2):
            if r.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
        if r.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    try:
        scale = cfg["batch_size"] / n
        step = cfg["gradient_accumulation_steps"] // r.world * scale * seconds(forward_backward)
        step += seconds(optimizer_step)
        model.eval()
        return step, scale * seconds(evaluation)
    finally:
        set_rng_state(rng, r.device)


def run_seconds(cfg, start_iter, start_evaluated, step_s, eval_batch_s, val_tokens):
    """(seconds, how) the rest of a run takes at step_s per iter and eval_batch_s
    per evaluation batch: its iters (up to max_time), the evaluations at every
    eval_interval (but an evaluated start) and the final one, with the whole val
    split if eval_full_val."""
    iters, every = cfg["max_iters"] - start_iter, cfg["eval_interval"]
    evals = (
        -(-cfg["max_iters"] // every) - -(-start_iter // every) + 1
    )  # multiples of every, then the final
    evals -= int(start_evaluated and start_iter % every == 0)
    batches = evals * 2 * cfg["eval_iters"]
    if cfg["eval_full_val"]:
        batches += -(-(val_tokens - 1) // (cfg["block_size"] * cfg["batch_size"]))
    train_s = iters * step_s if cfg["max_time"] <= 0 else min(iters * step_s, cfg["max_time"])
    how = f"{iters:,} iters x {step_s:.3g} s + {evals} evaluations, {batches:,} batches x {eval_batch_s:.3g} s"
    return train_s + batches * eval_batch_s, how


def print_run_estimate(r):
    seconds, how = run_seconds(
        r.cfg, r.start_iter, r.start_evaluated, *time_iter(r), len(r.splits["val"])
    )
    for unit, size in (("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or unit == "s":
            break
    tqdm.write(
        f"this run should take about {seconds / size:.1f} {unit} here ({how}; timed on this machine)"
    )


def train(r):
    cfg, iter_num, best = r.cfg, r.start_iter, r.best_val_loss
    clock = {"start": time.perf_counter(), "paused": 0.0}  # training time leaves evaluations out

    def elapsed():
        return time.perf_counter() - clock["start"] - clock["paused"]

    def evaluate_and_save(final):
        nonlocal best
        if r.device.type == "cuda":
            torch.cuda.synchronize()  # charge the queued steps to training time
        paused_at = time.perf_counter()
        rec = evaluate(r, iter_num, elapsed(), final)
        improved, best = rec["val_loss"] < best, min(best, rec["val_loss"])
        if final or (iter_num > 0 and (improved or cfg["always_save_checkpoint"])):
            save(r, iter_num, best)
        clock["paused"] += time.perf_counter() - paused_at

    last_log, stop, phase = (
        (iter_num, 0.0),
        None,
        "training",
    )  # (iter, elapsed) at the last log step
    with (
        StopSignals() as signals,
        tqdm(
            total=cfg["max_iters"],
            initial=iter_num,
            dynamic_ncols=True,
            disable=not r.master or cfg["eval_only"],
        ) as bar,
    ):
        r.signals = signals  # evaluations and steps look at it too (stop_requested)
        try:
            if cfg["eval_only"]:
                phase = "evaluation"
                evaluate(r, iter_num, 0.0, final=True)
                return
            if r.master and r.world == 1 and cfg["device"] == "auto" and r.device.type == "cpu":
                tqdm.write("timing one step for an estimate of the run time...")
                print_run_estimate(r)  # no GPU was found: say what that costs
                clock["start"] = time.perf_counter()  # timing the estimate is not training
            while iter_num < cfg["max_iters"] and stop is None:
                # a resumed run was usually evaluated just before its checkpoint was saved
                if iter_num % cfg["eval_interval"] == 0 and not (
                    r.start_evaluated and iter_num == r.start_iter
                ):
                    evaluate_and_save(final=False)
                loss_sum = train_step(r, get_lr(iter_num, cfg))
                iter_num += 1
                bar.update()
                wants_stop = signals.name is not None or 0 < cfg["max_time"] <= elapsed()
                if iter_num % cfg["log_interval"] == 0 or iter_num == cfg["max_iters"]:
                    # the processes agree on the mean loss and on stopping (this waits for the device)
                    # (every micro-batch's loss is the mean of its context_parallel ranks' losses)
                    t = torch.stack(
                        [
                            loss_sum
                            / (cfg["gradient_accumulation_steps"] * cfg["context_parallel"]),
                            torch.tensor(float(wants_stop), device=r.device),
                        ]
                    )
                    loss, wants_stop = all_sum(t, r.world).tolist()
                    if not math.isfinite(loss):
                        raise diverged(loss, iter_num - 1)
                    dt = (elapsed() - last_log[1]) / (iter_num - last_log[0])  # seconds per iter
                    last_log = (iter_num, elapsed())
                    # the MFU of a GPU's peak; a CPU run on a machine with a GPU has none
                    mfu = (
                        r.raw.estimate_mfu(r.tokens_per_iter // r.world, dt)
                        if r.device.type == "cuda"
                        else None
                    )
                    bar.set_postfix_str(
                        f"loss {loss:.4f}, lr {get_lr(iter_num - 1, cfg):.2e}, "
                        f"{r.tokens_per_iter / dt:,.0f} tok/s" + (f", MFU {mfu:.1%}" if mfu else "")
                    )
                elif r.world > 1:
                    wants_stop = False  # not before the processes agree, at the next log step
                if wants_stop:
                    stop = signals.name or "max_time"
            if signals.name is None:
                phase = "final evaluation"
                evaluate_and_save(final=True)
                phase = "done"
        except Stopped:  # in an evaluation, or between micro-steps (the step is undone)
            stop = signals.name
            if phase == "evaluation":  # eval_only
                if r.master:
                    print(f"stopped by {stop} during the evaluation; nothing was saved")
                return
    steps, seconds = iter_num - r.start_iter, elapsed()
    if phase != "done":
        stopped(r, stop, iter_num, best, during_final=phase == "final evaluation")
    elif r.master:
        per_iter = f" ({1000 * seconds / steps:.1f} ms/iter)" if steps else ""
        print(
            f"done at iter {iter_num}{' (max_time reached)' if stop else ''}: best val loss {best:.4f}, "
            f"{seconds:.1f}s of training{per_iter}; checkpoint {checkpoint_path(cfg['out_dir'])}"
        )


def stopped(r, signal_name, iter_num, best, during_final):
    """After SIGINT or SIGTERM: save the state at iter_num, unless nothing was
    trained since the run began (the checkpoint on disk, if any, already holds it).
    No evaluation: the process may have little time left."""
    where = f"stopped by {signal_name} at iter {iter_num}"
    if iter_num == r.start_iter:
        if r.master:
            kept = "the checkpoint is unchanged" if r.resumed else "nothing was saved"
            print(f"{where}: nothing trained since the run began, so {kept}")
        return
    save(r, iter_num, best, evaluated=False)
    if r.master:
        path = checkpoint_path(r.cfg["out_dir"])
        then = (
            "evaluate it with --init_from=resume --eval_only=True"
            if during_final
            else "continue with --init_from=resume"
        )
        print(
            f"{where}{' during the final evaluation' if during_final else ''}; saved {path}; {then}"
        )


def lost_peer(e, world):
    """Whether e is a collective that failed because another process died or hung."""
    text = str(e)
    return world > 1 and (isinstance(e, dist.DistError) or "gloo" in text or "NCCL" in text)


def get_config(argv):
    """The settings from DEFAULTS, config files and --key=value; raises ConfigError or ValueError."""
    cfg = parse_args(DEFAULTS, argv)
    check_config(cfg)
    return cfg


def fail(message, code):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--help" in argv or "-h" in argv:
        print(__doc__.strip() + "\n\nkeys and their defaults:\n" + describe(DEFAULTS))
        return
    try:
        try:
            run = setup(get_config(argv))
        except USER_ERRORS as e:
            fail(e, 2)
        except (RuntimeError, MemoryError) as e:
            if not out_of_memory(e):
                raise
            fail(
                "out of memory building the model or loading the data; use a smaller model, "
                "--block_size or --batch_size",
                2,
            )
        try:
            train(run)
        except (CheckpointError, TrainingError) as e:
            fail(e, 1)
        except (RuntimeError, MemoryError) as e:
            if out_of_memory(e):
                fail(
                    "out of memory while training; lower --batch_size (raise --gradient_accumulation_steps "
                    "to keep the batch) or --block_size; the last checkpoint is kept",
                    1,
                )
            if not lost_peer(e, run.world):
                raise
            fail(
                f"process {run.rank} lost contact with the others ({first_line(e)}); another process "
                "failed or stopped responding (see its error above); the last checkpoint is kept",
                1,
            )
        finally:
            if run.wandb is not None:
                run.wandb.finish()
    except KeyboardInterrupt:
        fail("interrupted", 130)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # All is saved, logged and closed. The interpreter's own teardown would now
    # free torch's objects one by one, about a second on a small CPU
    # (docs/benchmarks.md): leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
