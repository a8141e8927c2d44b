"""
Train a GPT on a prepared dataset, on one device or data-parallel.

    python train.py config/shakespeare.py                  # a GPU: the character-level baby GPT
    python train.py config/shakespeare_cpu.py              # a small version for a CPU
    python train.py config/shakespeare.py --batch_size=32  # any key can be overridden
    python train.py config/shakespeare.py --init_from=resume          # continue exactly
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py  # DistributedDataParallel
    torchrun --standalone --nproc_per_node=2 train.py config/shakespeare_cpu.py --context_parallel=2
    (each sequence split over the 2 processes: ring attention, docs/ring_attention.md)

Settings: the defaults in support/settings.py, then config files (Python), then
--key=value; see `python train.py --help`. Each evaluation is printed and appended
to out_dir/log.jsonl; out_dir/ckpt.pt holds what resuming or sampling needs.

The file reads top to bottom: the settings, the setup (where the features a setting
turns on are imported, and only there), the training loop with its evaluation and
what a stop signal does (the signals are caught in support/stop_signals.py, the
progress bar drawn in support/run_log.py), saving, then the command.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import contextlib
import dataclasses
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

from data import DataError
from data.dataset import ensure_dataset, get_batch, load_meta, load_split, step_batches
from model import GPT, GPTConfig, MultiHeadAttention
from support.checkpoint import (
    CheckpointError,
    checkpoint_path,
    first_line,
    out_of_memory,
    rng_state,
    save_checkpoint,
    set_rng_state,
    what_is_kept,
)
from support.configurator import (
    BAD_INPUT,
    FAILED,
    INTERRUPTED,
    ConfigError,
    error,
    parse_settings,
    wants_help,
)
from support.device import (
    explain_device,
    keep_freed_memory,
    pick_device,
    precision_context,
    training_dtype,
)
from support.optim import get_lr, late_dropout_on, make_optimizers, seq_warmup_cut
from support.run_log import (
    LogError,
    advance,
    log_evaluation,
    log_record,
    progress,
    progress_bar,
    start_log,
    start_wandb,
)
from support.settings import MODEL_KEYS, Settings, check, model_args
from support.stop_signals import Stopped, StopSignals, stop_requested

# what the user can fix: a bad option, file, dataset or checkpoint (the settings' checks,
# the device's, the tokenizer's, the head probe's and a model's loading raise ValueError)
USER_ERRORS = (ConfigError, DataError, CheckpointError, ValueError)


class TrainingError(Exception):
    """Training cannot go on (the loss diverged); the message is for the user."""


# -----------------------------------------------------------------------------
# Settings


def get_config(argv):
    """The settings from the defaults, config files and --key=value; raises
    ConfigError or ValueError."""
    cfg = parse_settings(Settings, argv)
    check(cfg)
    return cfg


# -----------------------------------------------------------------------------
# Setup: everything that can fail because of the settings happens here


class Run:
    """Everything setup() builds for the training loop, evaluation and saving.
    setup() makes each attribute and says there what it holds."""

    @property
    def master(self):
        return self.rank == 0

    def ctx(self):
        """A new precision_context for this run's device, dtype and block_size."""
        return precision_context(self.device.type, self.dtype, self.cfg.block_size)


def setup(cfg):
    """The Run that cfg describes: processes joined, data loaded, model built (or
    resumed) and wrapped, optimizers ready."""
    # a new run would replace an earlier one's checkpoint, and its log at once
    if cfg.init_from != "resume" and os.path.exists(checkpoint_path(cfg.out_dir)):
        import shlex  # here only: the advice names a path to paste into a shell

        raise ValueError(
            f"{cfg.out_dir} holds an earlier run's checkpoint, which this run would replace: "
            "continue that run with --init_from=resume, or give this one another --out_dir "
            f"(or delete {shlex.quote(checkpoint_path(cfg.out_dir))} to start over)"
        )
    run = Run()
    run.signals = None  # StopSignals while training, which evaluations and steps look at
    # torchrun sets these: rank 0 of world processes prints, logs and saves
    run.rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    run.world = int(os.environ.get("WORLD_SIZE", 1))
    run.device = pick_device(cfg.device, local_rank, run.world > 1)
    # 'float32', 'bfloat16' or 'float16': the forward pass's autocast
    run.dtype, why = training_dtype(cfg.dtype, run.device)

    # The features a setting turns on: each module is imported here, when its setting is
    # on, and nowhere else, so that a plain run loads none of them
    # (tests/test_footprint.py). Their checks come before any process group, data or model.
    # run.features holds each feature's module by name, for the loop to call.
    run.features = {}
    context_parallel = None
    if cfg.context_parallel > 1:
        from support import context_parallel

        context_parallel.check(cfg, run.world)
    if cfg.hellaswag:
        from support import hellaswag  # scored at every evaluation

        # a missing or malformed file stops the run before it starts
        hellaswag.training_examples(cfg.hellaswag_data)
        run.features["hellaswag"] = hellaswag
    if cfg.snapshots or cfg.log_heads:
        from support import timeline  # snapshots, and the heads logged at each evaluation

        timeline.check_settings(cfg)
        run.features["timeline"] = timeline
    if run.device.type == "cuda":
        from support import mfu  # the GPU's model FLOPs utilisation, at log steps

        run.features["mfu"] = mfu
    if cfg.device == "auto" and run.device.type == "cpu" and run.world == 1:
        from support import run_estimate  # what a run costs where no GPU was found

        run.features["run_estimate"] = run_estimate
    use_compile = cfg.compile
    if use_compile is None:
        use_compile = run.device.type == "cuda" and cfg.context_parallel == 1
    distributed = None
    if run.world > 1 or use_compile:
        from support import distributed  # torchrun's processes, and the model compiled or in DDP

        run.features["distributed"] = distributed

    # this process's data-parallel place, among dp_world: the ranks of one sequence
    # share it, and its batches
    run.dp_rank = run.rank // cfg.context_parallel
    run.dp_world = run.world // cfg.context_parallel
    if cfg.gradient_accumulation_steps % run.dp_world:
        fits = -(-cfg.gradient_accumulation_steps // run.dp_world) * run.dp_world
        raise ValueError(
            f"gradient_accumulation_steps ({cfg.gradient_accumulation_steps}) must be "
            f"divisible by the number of data-parallel processes ({run.dp_world}), which "
            f"share its micro-steps: pass --gradient_accumulation_steps={fits}"
        )
    if run.master and cfg.note:
        print(cfg.note, flush=True)
    if run.master:
        explain_device(cfg, run.device, run.dtype)
    # first: a logger that cannot start should stop the run before any data or model work
    # (run.wandb: the wandb module once a run is started there)
    run.wandb = None
    if cfg.wandb_log and run.master:
        run.wandb = start_wandb(cfg)
    if run.world > 1:
        distributed.join_processes(run.device, cfg.ddp_timeout)
    cp = None
    # this rank's part of a sequence under context parallelism (else all of it), and the
    # unit a sequence's length is a multiple of
    run.split = lambda t: t
    run.split_unit = 1
    if context_parallel is not None:
        cp = context_parallel.ContextParallel(
            cfg.context_parallel, cfg.context_parallel_layout == "zigzag"
        )
        run.split = cp.split
        run.split_unit = cp.unit
    if run.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 matmuls
    if run.device.type == "cpu":
        keep_freed_memory()
    torch.manual_seed(cfg.seed + run.rank)  # model init, then dropout

    if local_rank == 0:  # prepares a missing dataset while the other processes wait
        ensure_dataset(cfg.dataset, cfg.data_root)
    if run.world > 1:
        dist.barrier()
    dataset_dir = ensure_dataset(cfg.dataset, cfg.data_root)
    run.meta = load_meta(dataset_dir)  # the dataset's vocabulary size and tokenizer
    if cfg.hellaswag:
        run.features["hellaswag"].check_vocabulary(cfg.hellaswag_data, run.meta["tokenizer"])
    # the model: a new one of the settings' shape, or one init_from loads (out_dir's
    # checkpoint, another run's, or GPT-2's weights); from here on the model keys are
    # the model's own
    ckpt = None
    # run.raw: the model itself, what is saved and what evaluations run
    if cfg.init_from == "scratch":
        run.raw = GPT(GPTConfig(**model_args(cfg, run.meta["vocab_size"])))
    else:
        from support import loading

        run.raw, ckpt = loading.training_model(cfg, run.meta)
    model_keys = {key: getattr(run.raw.config, key) for key in MODEL_KEYS}
    cfg = dataclasses.replace(cfg, **model_keys)
    run.cfg = cfg
    if cfg.log_heads:
        # the heads are probed at every evaluation, the first perhaps after hours
        run.features["timeline"].check(run.raw.config)
    run.raw.to(run.device)
    # 'train' and 'val' tokens: a tensor on the device, or a memmap
    run.splits = {
        split: load_split(dataset_dir, split, cfg.block_size, run.meta["vocab_size"], run.device)
        for split in ("train", "val")
    }
    if cfg.dtype == "auto" and run.device.type == "cpu" and run.dtype == "bfloat16":
        from support.bf16_verdict import time_cpu_dtypes

        # timed on rank 0 alone, so before the ring is attached: it would wait for the others
        choice = [time_cpu_dtypes(cfg, run.raw, run.splits["val"]) if run.master else None]
        if run.world > 1:
            dist.broadcast_object_list(choice)  # every process trains in the same precision
        run.dtype, why = choice[0]
    if cp is not None:
        cp.attach(run.raw)
    # [AdamW], or [Muon, AdamW], which step together; loss scaling for float16 only
    run.optimizers = make_optimizers(run.raw, cfg, run.device.type, run.dtype)
    run.scaler = torch.amp.GradScaler(run.device.type, enabled=run.dtype == "float16")
    run.data_gen = torch.Generator().manual_seed(cfg.seed)  # the same on every process
    run.resumed = ckpt is not None  # from out_dir's checkpoint
    if run.resumed:
        from support import resume

        resume.restore(ckpt, cfg, run.optimizers, run.scaler, run.data_gen, run.device, run.rank)
    run.start_iter = ckpt["iter_num"] if ckpt else 0
    # whether start_iter's evaluation is in the log: a checkpoint saved by a stop
    # signal was not evaluated at its iter, older checkpoints always were, and
    # eval_at_start=False counts a fresh run as evaluated
    run.start_evaluated = ckpt.get("evaluated", True) if ckpt else not cfg.eval_at_start
    # the best evaluation yet, in this run or the one it resumes
    run.best_val_loss = ckpt["best_val_loss"] if ckpt else float("inf")
    # seconds of training before the run started (a resumed run's checkpoint's); then,
    # while training, the seconds in all, after each iter in one process, as the
    # processes last agreed on them in several: what the lr schedule by time
    # (lr_decay_time) reads and what a checkpoint saves
    run.seconds = ckpt.get("seconds", 0.0) if ckpt else 0.0

    # what steps take: raw, compiled if compile is on, in DDP with several processes
    run.ddp_model = run.raw
    run.compiled = use_compile
    run.cut = None  # seq_warmup's pieces per sequence in the last batch
    run.dropout_on = None  # with late_dropout, whether the last step's dropout was on
    if distributed is not None:
        run.ddp_model = distributed.wrap_model(run.raw, run.device, run.world, use_compile)
    # in all processes together
    run.tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
    if run.master:
        run.lock = start_log(cfg.out_dir, resumed=run.resumed)  # held until the run ends
        split = f" ({run.dp_world} x {cfg.context_parallel} per sequence)" if cp else ""
        shape = f"{cfg.n_layer} layers, {cfg.n_head} heads, {cfg.n_embd} wide"
        print(
            f"{run.raw.num_params() / 1e6:.2f}M parameters | {shape} | {run.device}, {run.dtype} "
            f"({why}) | {run.world} process(es){split} | {run.tokens_per_iter:,} tokens per iter "
            f"| {dataset_dir} -> {cfg.out_dir}"
        )
        if use_compile:
            # torch.compile works on the first call: without this line the bar would
            # stand still at 0 for as long (about 20 s on a 2-core CPU)
            print("compiling the model: the first step waits for it (faster once cached)")
    return run


# -----------------------------------------------------------------------------
# Training


def train(run):
    """The training loop. Every eval_interval and at the end: evaluate, and save
    when the val loss improved. Every iter: the learning rate from the schedule,
    the batch, forward and backward, one optimizer step. Every log_interval: the
    step's measurements, one dict that the progress bar, log.jsonl and wandb read.
    It stops at max_iters, at max_time or on a stop signal, and says how it ended."""
    cfg = run.cfg
    iter_num = run.start_iter
    best_val_loss = run.best_val_loss
    # a resumed run was usually evaluated just before its checkpoint was saved
    evaluated = run.start_evaluated
    clock = Clock(iter_num)
    # of training before this run began: max_time and the lr schedule by time count
    # them, as max_iters counts the iters, so that a resumed run ends where the
    # run it resumes would have
    seconds_before = run.seconds
    out_of_time = False  # max_time reached: evaluate, save and stop
    final = False  # whether the final evaluation has begun
    done = False  # whether the final evaluation is done
    bar = progress_bar(cfg, iter_num, seconds_before, run.master)
    with StopSignals() as signals, bar:
        run.signals = signals  # evaluations and steps look at it too (stop_requested)
        if "run_estimate" in run.features:
            tqdm.write("timing one step for an estimate of the run time...")
            run.features["run_estimate"].print_run_estimate(run)  # no GPU: what that costs
            clock = Clock(iter_num)  # timing the estimate is not training
        try:
            while True:
                # evaluate, and save, every eval_interval and at the end
                final = iter_num >= cfg.max_iters or out_of_time
                if final or (iter_num % cfg.eval_interval == 0 and not evaluated):
                    with clock.paused(run.device):
                        rec = evaluate(run, iter_num, seconds_before + clock.seconds(), final)
                        improved = rec["val_loss"] < best_val_loss
                        best_val_loss = min(best_val_loss, rec["val_loss"])
                        if final or (iter_num > 0 and (improved or cfg.always_save_checkpoint)):
                            save(run, iter_num, best_val_loss)
                evaluated = False
                if final:
                    done = True
                    break

                # the learning rate of this iter
                lr = get_lr(iter_num, cfg, run.seconds)
                if cfg.late_dropout:
                    set_late_dropout(run, iter_num)
                # the batch: gradient_accumulation_steps micro-batches of batch_size
                # sequences; the random state before it undoes a step cut short
                before = rng_state(run.device), run.data_gen.get_state()
                x, y = next_batch(run)
                # forward and backward, micro-batch by micro-batch, then one step
                loss_sum = forward_backward(run, x, y, before)
                grad_norm = optimizer_step(run, lr)
                iter_num += 1
                seconds = seconds_before + clock.seconds()
                if run.world == 1:
                    run.seconds = seconds  # several processes agree on theirs at log steps
                advance(bar, cfg, seconds)

                # at log steps only, as it waits for the device: the step's loss, and with
                # several processes their agreement on it and on stopping (a signal to one
                # process stops them all)
                signalled = signals.name is not None
                timed_out = 0 < cfg.max_time <= seconds
                if iter_num % cfg.log_interval == 0 or iter_num == cfg.max_iters:
                    loss = (loss_sum / cfg.gradient_accumulation_steps).item()
                    if run.world > 1:
                        loss, signalled, timed_out, seconds = run.features["distributed"].agree(
                            run, loss_sum, signalled, timed_out, seconds
                        )
                        run.seconds = seconds
                    if not math.isfinite(loss):
                        raise diverged(run, loss, iter_num - 1)
                    dt = clock.per_iter(iter_num)  # seconds per iter since the last log step
                    # the step's measurements: a new one is one more key here
                    step = dict(
                        iter=iter_num,
                        loss=loss,
                        lr=lr,
                        grad_norm=grad_norm.item(),
                        tok_per_s=run.tokens_per_iter / dt,
                    )
                    if "mfu" in run.features:
                        # None for a GPU of unknown peak
                        mfu = run.features["mfu"].estimate_mfu(
                            run.raw, run.tokens_per_iter // run.world, dt
                        )
                        if mfu is not None:
                            step["mfu"] = mfu
                    if run.master:
                        bar.set_postfix_str(progress(step, timed=cfg.max_time > 0))
                        log_record(step, cfg.out_dir, run.wandb)
                elif run.world > 1:
                    # not before the processes agree, at the next log step
                    signalled = False
                    timed_out = False
                if signalled:
                    break  # no evaluation: the process may have little time left
                out_of_time = timed_out
        except Stopped:  # in an evaluation, or between micro-steps (the step is undone)
            pass
    if not done:
        stopped(run, signals.cause, iter_num, best_val_loss, during_final=final)
    elif run.master:
        finished(run, iter_num, best_val_loss, clock.seconds(), max_time=out_of_time)


class Clock:
    """Seconds of training: wall time less the time spent evaluating and saving."""

    def __init__(self, iter_num):
        self.start = time.perf_counter()
        self.excluded = 0.0
        self.last_log = (iter_num, 0.0)  # (iter, seconds of training) at the last log step

    def seconds(self):
        return time.perf_counter() - self.start - self.excluded

    @contextlib.contextmanager
    def paused(self, device):
        if device.type == "cuda":
            torch.cuda.synchronize()  # charge the queued steps to training time
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - t0

    def per_iter(self, iter_num):
        """Seconds per iter since the last log step."""
        seconds = self.seconds()
        dt = (seconds - self.last_log[1]) / (iter_num - self.last_log[0])
        self.last_log = (iter_num, seconds)
        return dt


def set_late_dropout(run, iter_num):
    """With late_dropout, every dropout of the model off early in the run and the
    config's after. A compiled model drops its graphs when that changes, as it does at
    each new shape of seq_warmup (next_batch)."""
    cfg = run.cfg
    on = late_dropout_on(cfg, iter_num, run.seconds)
    if on == run.dropout_on:
        return
    if run.compiled and run.dropout_on is not None:
        torch.compiler.reset()
    run.dropout_on = on
    attn_dropout = cfg.dropout if cfg.attn_dropout is None else cfg.attn_dropout
    for module in run.raw.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = cfg.dropout if on else 0.0
        if isinstance(module, MultiHeadAttention):
            module.attn_dropout = attn_dropout if on else 0.0


def next_batch(run):
    """This process's (x, y) for one iter: (gradient_accumulation_steps / dp_world,
    batch_size, block_size) each, its part of every sequence under context parallelism;
    early in a run with seq_warmup, the same tokens as 2 or 4 times the sequences."""
    x, y = step_batches(
        run.splits["train"], run.data_gen, run.cfg, run.dp_rank, run.dp_world, run.device
    )
    # sequence-length warmup (seq_warmup): the same tokens as more, shorter sequences
    cut = seq_warmup_cut(run.cfg, run.seconds)
    # a new shape: drop the graphs compiled for the earlier ones. Kept, they made each
    # full-length step some 1.1x slower on two CPU cores (docs/benchmarks.md, "Sequence-length
    # warmup on the AVX2 class")
    if run.compiled and run.cut is not None and cut != run.cut:
        torch.compiler.reset()
    run.cut = cut
    n, B, T = x.shape
    x = x.reshape(n, B * cut, T // cut)  # (n, B cut, T / cut)
    y = y.reshape(n, B * cut, T // cut)  # (n, B cut, T / cut)
    return run.split(x), run.split(y)


def forward_backward(run, x, y, before):
    """Forward and backward over the micro-batches x[i], y[i], the gradients
    summed. Returns this process's loss summed over its micro-batches, left on the
    device. A stop signal between micro-batches undoes the step (the random state
    goes back to before) and raises Stopped."""
    n = x.size(0)
    loss_sum = torch.zeros((), device=run.device)
    for micro in range(n):
        # one process stops between micro-steps; processes of DDP finish the step
        # (stopping there would need a collective per micro-step)
        if micro > 0 and run.world == 1 and stop_requested(run.signals, run.world, run.device):
            for opt in run.optimizers:
                opt.zero_grad(set_to_none=True)
            set_rng_state(before[0], run.device)
            run.data_gen.set_state(before[1])
            raise Stopped()
        # DDP averages the gradients across processes on the last micro-step only
        sync = contextlib.nullcontext()
        if run.world > 1 and micro < n - 1:
            sync = run.ddp_model.no_sync()
        with sync:
            with run.ctx():
                _, loss = run.ddp_model(x[micro], y[micro])
            loss_sum += loss.detach().float()
            run.scaler.scale(loss / n).backward()
    return loss_sum


def optimizer_step(run, lr):
    """One step of every optimizer at learning rate lr, the gradients clipped to
    grad_clip when grad_clip > 0 (float16's loss scale taken out first), then zeroed.
    Returns the gradients' total norm before clipping, on the device."""
    params = [p for p in run.raw.parameters() if p.grad is not None]
    for opt in run.optimizers:
        for group in opt.param_groups:
            group["lr"] = lr
        run.scaler.unscale_(opt)
    if run.cfg.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, run.cfg.grad_clip)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    # the optimizers hold disjoint parameters: each zeroes its own after its step
    for opt in run.optimizers:
        run.scaler.step(opt)
        opt.zero_grad(set_to_none=True)
    run.scaler.update()
    return grad_norm


def finished(run, iter_num, best, seconds, max_time):
    steps = iter_num - run.start_iter
    why = " (max_time reached)" if max_time else ""
    per_iter = f" ({1000 * seconds / steps:.1f} ms/iter)" if steps else ""
    # max_time counts the seconds before a resume too: a resumed run says both
    here = " in this run" if run.resumed else ""
    in_all = f", {run.seconds:.1f}s in all" if run.resumed else ""
    print(
        f"done at iter {iter_num}{why}: best val loss {best:.4f}, {seconds:.1f}s of training"
        f"{here}{per_iter}{in_all}; checkpoint {checkpoint_path(run.cfg.out_dir)}"
    )


# -----------------------------------------------------------------------------
# Evaluation: the losses, printed and logged


def evaluate(run, iter_num, elapsed, final):
    """Evaluate; print and log one line to out_dir/log.jsonl (and wandb). elapsed:
    the seconds of training so far, those before a resume included."""
    losses = estimate_loss(run, run.cfg.seed + iter_num)
    rec = dict(
        iter=iter_num,
        train_loss=losses["train"],
        val_loss=losses["val"],
        lr=get_lr(iter_num, run.cfg, run.seconds),
        elapsed_s=round(elapsed, 3),
        tokens=iter_num * run.tokens_per_iter,
    )
    if final and run.cfg.eval_full_val:
        rec["val_loss_full"] = full_val_loss(run)
    if "hellaswag" in run.features:
        # a stop signal ends the scoring between two examples, as it ends the losses between batches
        scores = run.features["hellaswag"].training_scores(
            run.raw,
            run.meta["tokenizer"],
            run.cfg.hellaswag_data,
            run.device,
            run.ctx,
            run.dp_rank,
            run.dp_world,
            stop=lambda: stop_requested(run.signals, run.world, run.device, agree=True),
        )
        if scores is None:
            raise Stopped()
        rec.update(scores)
    if not (math.isfinite(rec["train_loss"]) and math.isfinite(rec["val_loss"])):
        raise diverged(run, rec["val_loss"], iter_num)
    if run.master and "timeline" in run.features:
        timeline = run.features["timeline"]
        rec.update(timeline.at_evaluation(run.cfg, run.raw, run.meta, run.splits["val"], iter_num))
    if run.master:
        log_evaluation(rec, run.cfg.out_dir, run.wandb)
    return rec


def diverged(run, loss, iter_num):
    return TrainingError(
        f"the loss is {loss} at iter {iter_num}: training diverged; "
        f"try a lower --learning_rate ({what_is_kept(run.cfg.out_dir)})"
    )


@torch.no_grad()
def mean_loss(run, model, data, batches, desc):
    """Mean loss per token over batches [(starts (N,), length)], shared by the
    processes, with a progress bar; a stop signal ends it (Stopped) within a batch."""
    total = torch.zeros(2, device=run.device)  # (loss summed over tokens, tokens)
    mine = batches[run.dp_rank :: run.dp_world]  # the ranks of one sequence share its batches
    rounds = -(-len(batches) // run.dp_world)  # every process checks for a stop in every round
    model.eval()
    try:
        bar = tqdm(
            range(rounds), desc=desc, leave=False, disable=not run.master, dynamic_ncols=True
        )
        for i in bar:
            if stop_requested(run.signals, run.world, run.device, agree=True):
                raise Stopped()
            if i < len(mine):
                x, y = map(run.split, get_batch(data, *mine[i], run.device))
                with run.ctx():
                    total[0] += model(x, y)[1].float() * y.numel()
                total[1] += y.numel()
    finally:
        model.train()
    if run.world > 1:
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def estimate_loss(run, seed):
    """Loss on eval_iters random batches per split. The generator is a fresh one,
    so evaluating never shifts the training batches. The model runs as written, not
    compiled: compiling its eval-mode graph as well took longer than the forward
    passes it would speed up (some 40 s of a CPU run's 90 s of compiling, for
    evaluations of a few seconds; docs/benchmarks.md)."""
    gen, B, T = torch.Generator().manual_seed(seed), run.cfg.batch_size, run.cfg.block_size
    losses = {}
    for split, data in run.splits.items():
        starts = torch.randint(len(data) - T, (run.cfg.eval_iters, B), generator=gen)  # (iters, B)
        batches = [(row, T) for row in starts]
        losses[split] = mean_loss(run, run.raw, data, batches, f"evaluating {split}")
    return losses


def full_val_loss(run):
    """Loss on every token of the val split, in non-overlapping block_size
    windows (the last one shorter): the val loss of record, without sampling noise."""
    data, B, T = run.splits["val"], run.cfg.batch_size, run.cfg.block_size
    n = len(data) - 1  # tokens with a next token to predict
    starts = torch.arange(0, n, T)
    batches = [(batch, T) for batch in starts[: n // T].split(B)]
    tail = n % T // run.split_unit * run.split_unit  # context parallelism leaves out < 2P tokens
    if tail:
        batches.append((starts[-1:], tail))
    return mean_loss(run, run.raw, data, batches, "whole val split")


def evaluate_only(run):
    """--eval_only: one evaluation of the model as it is, logged; nothing is saved."""
    with StopSignals() as signals:
        run.signals = signals  # the evaluation stops within a batch on a stop signal
        try:
            evaluate(run, run.start_iter, run.seconds, final=True)
        except Stopped:
            if run.master:
                print(f"stopped by {signals.cause} during the evaluation; nothing was saved")


# -----------------------------------------------------------------------------
# Saving


def save(run, iter_num, best_val_loss, evaluated=True):
    """The state right before iter iter_num, so that resuming repeats it exactly;
    evaluated: whether iter_num's evaluation, if it has one, is in the log."""
    if not run.master:
        return
    states = [opt.state_dict() for opt in run.optimizers]
    ckpt = dict(
        # the model itself, never its compiled or DDP wrapper: its keys have no prefixes
        model=run.raw.state_dict(),
        optimizer=states[0] if len(states) == 1 else states,
        model_args=dataclasses.asdict(run.raw.config),
        iter_num=iter_num,
        best_val_loss=best_val_loss,
        config=dataclasses.asdict(run.cfg),  # a plain dict, as older checkpoints hold
        tokenizer=run.meta["tokenizer"],
        dataset=run.cfg.dataset,
        rng=rng_state(run.device),
        evaluated=evaluated,
        data={"generator": run.data_gen.get_state()},
        seconds=run.seconds,
    )
    if run.scaler.is_enabled():
        ckpt["scaler"] = run.scaler.state_dict()
    save_checkpoint(ckpt, checkpoint_path(run.cfg.out_dir))


def stopped(run, signal_name, iter_num, best, during_final):
    """After SIGINT or SIGTERM: save the state at iter_num, unless nothing was
    trained since the run began (the checkpoint on disk, if any, already holds it).
    No evaluation: the process may have little time left."""
    where = f"stopped by {signal_name} at iter {iter_num}"
    if iter_num == run.start_iter:
        if run.master:
            kept = "the checkpoint is unchanged" if run.resumed else "nothing was saved"
            print(f"{where}: nothing trained since the run began, so {kept}")
        return
    save(run, iter_num, best, evaluated=False)
    if not run.master:
        return
    then = "continue with --init_from=resume"
    if during_final:
        where += " during the final evaluation"
        then = "evaluate it with --init_from=resume --eval_only=True"
    print(f"{where}; saved {checkpoint_path(run.cfg.out_dir)}; {then}")


# -----------------------------------------------------------------------------
# The command: settings -> setup -> train; every failure the user can fix is one line


def fail(message, code):
    error(message)
    sys.exit(code)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        from support.help import describe_settings, print_help  # here only: a run needs no help

        # every key with its default and its comments, the model's as GPTConfig writes them
        options = [
            describe_settings(Settings),
            "  # the model (GPTConfig in model.py); block_size is also the training context",
            describe_settings(GPTConfig, MODEL_KEYS),
        ]
        print_help(__doc__, "\n".join(options))
        return
    try:
        try:
            run = setup(get_config(argv))
        except USER_ERRORS as e:
            # a bad setting meets every process of a torchrun alike: the first says it
            if isinstance(e, ConfigError) and int(os.environ.get("RANK", 0)) > 0:
                sys.exit(BAD_INPUT)
            fail(e, BAD_INPUT)
        except (RuntimeError, MemoryError, OSError) as e:
            if out_of_memory(e):
                fail(
                    "out of memory building the model or loading the data; use a smaller "
                    "model, --block_size or --batch_size",
                    BAD_INPUT,
                )
            # here only: a disk or a compiler the run needs and cannot use
            from support.cli import failure_line

            line = failure_line(e)
            if line is None:
                raise
            fail(line, FAILED)
        try:
            if run.cfg.eval_only:
                evaluate_only(run)
            else:
                train(run)
        except (CheckpointError, LogError, TrainingError) as e:
            fail(e, FAILED)
        except (RuntimeError, MemoryError, OSError) as e:
            if out_of_memory(e):
                fail(
                    "out of memory while training; lower --batch_size (raise "
                    "--gradient_accumulation_steps to keep the batch) or --block_size; "
                    f"{what_is_kept(run.cfg.out_dir)}",
                    FAILED,
                )
            if run.world > 1 and run.features["distributed"].lost_peer(e):
                fail(
                    f"process {run.rank} lost contact with the others ({first_line(e)}); "
                    "another process failed or stopped responding (see its error above); "
                    f"{what_is_kept(run.cfg.out_dir)}",
                    FAILED,
                )
            from support.cli import failure_line

            line = failure_line(e)
            if line is None:
                raise
            fail(f"{line}; {what_is_kept(run.cfg.out_dir)}", FAILED)
        finally:
            if run.wandb is not None:
                run.wandb.finish()
            if run.master:
                run.lock.close()  # out_dir is free for the next run (in this process too)
    except KeyboardInterrupt:
        fail("interrupted", INTERRUPTED)
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
