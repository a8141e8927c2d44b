"""
Resuming exactly (--init_from=resume): the checks that a checkpoint holds what
resuming reads, and the optimizer, RNG and data-sampling state put back as they
were right before the checkpoint's iter (restore). Imported only to resume.
"""

import math

import torch

from support.checkpoint import CheckpointError, checkpoint_path, first_line, set_rng_state
from support.loading import LOAD_ERRORS

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
# What resuming reads where a checkpoint has it (older ones lack these).
OPTIONAL_FIELDS = {"seconds": (int, float), "evaluated": bool, "scaler": dict}
# The settings besides the model's shape that decide which steps a run takes: resumed
# with other values, it goes on as another run would (the evaluations, logs, saves and
# limits such as max_iters change what is seen of the run, not the run).
RUN_SETTINGS = (
    "dataset",
    "batch_size",
    "gradient_accumulation_steps",
    "optimizer",
    "learning_rate",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "muon_ns_steps",
    "decay_lr",
    "warmup_iters",
    "seq_warmup",
    "late_dropout",
    "lr_decay_iters",
    "lr_decay_time",
    "min_lr",
    "lr_cooldown",
    "dropout",
    "attn_dropout",
    "seed",
    "dtype",
)


def check_resumable(ckpt, path):
    """Refuse a checkpoint that lacks what resuming reads, or holds it damaged."""
    missing = sorted(set(RESUME_FIELDS) - set(ckpt))
    if missing:
        raise CheckpointError(f"cannot resume from {path}: it lacks {', '.join(missing)}")
    kinds = {key: kind for key, kind in OPTIONAL_FIELDS.items() if key in ckpt}
    kinds.update(RESUME_FIELDS)
    bad = [
        key
        for key, kind in kinds.items()
        if not isinstance(ckpt[key], kind) or (kind is not bool and isinstance(ckpt[key], bool))
    ]
    if bad:
        raise CheckpointError(
            f"cannot resume from {path}: its {', '.join(bad)} entry has the wrong type; "
            "the file is damaged, resume from another copy"
        )
    # a negative iter would train with a negative lr (the warmup's line goes below 0)
    seconds = ckpt.get("seconds", 0.0)
    in_range = {
        "iter_num": ckpt["iter_num"] >= 0,
        "best_val_loss": not math.isnan(ckpt["best_val_loss"]),
        "seconds": math.isfinite(seconds) and seconds >= 0,
    }
    bad = [key for key, ok in in_range.items() if not ok]
    if bad:
        raise CheckpointError(
            f"cannot resume from {path}: its {', '.join(bad)} entry is out of range "
            f"({', '.join(repr(ckpt[key]) for key in bad)}); the file is damaged, "
            "resume from another copy"
        )


def changed_settings(ckpt, cfg):
    """The RUN_SETTINGS where cfg is not what the checkpoint's run was trained with, each
    as 'key=cfg's (was the run's)': a resume without the run's config file trains on with
    the defaults, 15 times the tokens per iter of config/shakespeare_cpu.py's."""
    changed = []
    for key in RUN_SETTINGS:
        if key in ckpt["config"] and ckpt["config"][key] != getattr(cfg, key):
            changed.append(f"{key}={getattr(cfg, key)!r} (was {ckpt['config'][key]!r})")
    return changed


def check_unfinished(ckpt, cfg):
    """Refuse to train a run that has reached max_iters or max_time (both count what
    the checkpoint holds): say which to raise, and where the lr has decayed to
    min_lr, that its schedule's end must move with it, or the lr stays there."""
    iter_num = ckpt["iter_num"]
    seconds = ckpt.get("seconds", 0.0)
    if iter_num >= cfg.max_iters:
        reached = f"is at iter {iter_num} and max_iters is {cfg.max_iters}"
        limit, decay = "max_iters", "lr_decay_iters"
        decayed = iter_num >= cfg.lr_decay_iters
    elif 0 < cfg.max_time <= seconds:
        reached = f"has {seconds:.0f} s of training and max_time is {cfg.max_time:g} s"
        limit, decay = "max_time", "lr_decay_time"
        decayed = 0 < cfg.lr_decay_time <= seconds
    else:
        return
    advice = f"raise --{limit} to train further"
    if cfg.decay_lr and decayed:
        advice += (
            f", and --{decay} with it: the lr has reached min_lr ({cfg.min_lr:g}) and stays there"
        )
    raise ValueError(f"the checkpoint {reached}; {advice}")


def restore(ckpt, cfg, optimizers, scaler, data_gen, device, rank):
    """Optimizer, RNG and data-sampling state as they were right before iter ckpt['iter_num']."""
    if not cfg.eval_only:
        check_unfinished(ckpt, cfg)
    states = ckpt["optimizer"] if isinstance(ckpt["optimizer"], list) else [ckpt["optimizer"]]
    if len(states) != len(optimizers):
        raise ValueError(
            f"the checkpoint was trained with optimizer={ckpt['config'].get('optimizer')!r}; "
            "resume with the same one"
        )
    try:
        for opt, state in zip(optimizers, states):
            opt.load_state_dict(state)
            check_optimizer_state(opt)
        if "scaler" in ckpt:
            scaler.load_state_dict(ckpt["scaler"])
        data_gen.set_state(ckpt["data"]["generator"])
        if rank > 0:  # only rank 0's RNG is saved; the others need dropout masks of their own
            torch.manual_seed(cfg.seed + rank + 1000 * ckpt["iter_num"])
            return
        set_rng_state(ckpt["rng"], device)
    except LOAD_ERRORS as e:
        raise CheckpointError(
            f"cannot resume from {checkpoint_path(cfg.out_dir)}: its optimizer, RNG or "
            f"data-sampling state is damaged ({first_line(e)}); resume from another copy"
        ) from None


def check_optimizer_state(opt):
    """Raise ValueError where opt's state does not fit its parameters, or is not
    finite: load_state_dict checks neither, and the first step would fail on it
    (or the loss become NaN, which would read as a diverged run)."""
    for param, state in opt.state.items():
        for name, value in state.items():
            if not torch.is_tensor(value):
                continue
            if value.dim() > 0 and value.shape != param.shape:
                shape = "x".join(map(str, param.shape))
                raise ValueError(f"{name} for a {shape} weight has shape {list(value.shape)}")
            if not torch.isfinite(value).all():
                raise ValueError(f"{name} holds NaN or infinity")
