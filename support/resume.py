"""
Resuming a run exactly: the RNG state saved beside the weights, the checks that
a checkpoint holds what resuming reads, and putting the model, optimizer, RNG and
data-sampling state back as they were right before the checkpoint's iter.
"""

import torch

from support.checkpoint import CheckpointError, checkpoint_path, first_line

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
    """Whether e is running out of memory, which no damaged file explains."""
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(e)


def rng_state(device):
    rng = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(device)
    return rng


def set_rng_state(rng, device):
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)


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


def restore(ckpt, cfg, optimizers, scaler, data_gen, device, rank):
    """Optimizer, RNG and data-sampling state as they were right before iter ckpt['iter_num']."""
    if ckpt["iter_num"] >= cfg.max_iters and not cfg.eval_only:
        raise ValueError(
            f"the checkpoint is at iter {ckpt['iter_num']} and max_iters is {cfg.max_iters}; "
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
            torch.manual_seed(cfg.seed + rank + 1000 * ckpt["iter_num"])
            return
        set_rng_state(ckpt["rng"], device)
    except LOAD_ERRORS as e:
        raise CheckpointError(
            f"cannot resume from {checkpoint_path(cfg.out_dir)}: its optimizer, RNG or "
            f"data-sampling state is damaged ({first_line(e)}); resume from another copy"
        ) from None
