"""
The state of a training run: what train.py's setup() builds, and what its loop,
the evaluation (evaluation.py) and the run-time estimate (run_estimate.py) read.
A module of its own, so that train.py and the support/ modules that take a run
import one type without importing each other.
"""

import dataclasses
from typing import Any, Callable

import torch

from model import GPT
from support.settings import Settings
from support.signals import StopSignals


@dataclasses.dataclass
class Run:
    """Everything train.py's setup() builds for the training loop, evaluation and saving."""

    cfg: Settings  # the model keys are the model's own (a checkpoint's, or GPT-2's)
    rank: int  # this process among all (torchrun's RANK); 0 prints, logs and saves
    world: int  # processes in all (torchrun's WORLD_SIZE)
    dp_rank: int  # this process's data-parallel place: a sequence's ranks share it
    dp_world: int  # data-parallel places: world // context_parallel
    split: Callable  # this rank's part of a sequence (context parallelism), else as is
    split_unit: int  # a context-parallel sequence's length is a multiple of this
    device: torch.device
    dtype: str  # 'float32', 'bfloat16' or 'float16': the forward pass's autocast
    ctx: Callable  # a new precision_context for this device, dtype and block_size
    raw: GPT  # the model itself: what is saved and what the whole val split scores
    model: torch.nn.Module  # raw, compiled if compile is on: what ddp_model wraps
    ddp_model: torch.nn.Module  # model, inside DDP with more than one process: what trains
    optimizers: list  # [AdamW], or [Muon, AdamW]; they step together
    scaler: torch.amp.GradScaler  # loss scaling, enabled for float16 only
    data_gen: torch.Generator  # draws the training batches, the same on every process
    splits: dict  # 'train' and 'val' tokens: a tensor on the device, or a memmap
    meta: dict  # the dataset's vocabulary size and tokenizer
    tokens_per_iter: int  # in all processes together
    wandb: Any  # the wandb module once a run is started there, else None
    resumed: bool  # whether the run started from out_dir's checkpoint
    start_iter: int  # the iter the run started at
    # whether start_iter's evaluation is in the log: a checkpoint saved by a stop
    # signal was not evaluated at its iter, older checkpoints always were, and
    # eval_at_start=False counts a fresh run as evaluated
    start_evaluated: bool
    best_val_loss: float  # the best evaluation yet, in this run or the one it resumes
    # seconds of training before the run started (a resumed run's checkpoint's); then,
    # while training, those seconds as the processes last agreed on them: what the
    # lr schedule by time (lr_decay_time) reads and what a checkpoint saves
    seconds: float
    signals: StopSignals | None = None  # set while training, for evaluations and steps

    @property
    def master(self):
        return self.rank == 0
