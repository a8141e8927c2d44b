"""
train.py's settings: every key with its default, as a dataclass that config files
and --key=value fill (configurator.py), and the checks that refuse bad values
before anything slow happens. The keys are nanoGPT's; the defaults train GPT-2 124M.
"""

import dataclasses
import math

from model import GPTConfig

# The settings that make the model's shape: GPTConfig's fields, written once in
# model.py, but vocab_size, which the dataset's tokenizer sets. A checkpoint's
# model_args hold them.
MODEL_FIELDS = [field for field in dataclasses.fields(GPTConfig) if field.name != "vocab_size"]
MODEL_KEYS = tuple(field.name for field in MODEL_FIELDS)

# The model keys as settings, with GPTConfig's defaults (GPT-2 124M's shape).
ModelSettings = dataclasses.make_dataclass(
    "ModelSettings",
    [(field.name, field.type, dataclasses.field(default=field.default)) for field in MODEL_FIELDS],
    frozen=True,
)


@dataclasses.dataclass(frozen=True)
class Settings(ModelSettings):
    """Everything a training run can be told: the model keys, then the rest.
    `python train.py --help` prints this class's body and GPTConfig's, so their
    comments are the documentation of each key."""

    # a line the run prints first: what a config chose for this machine, and why
    note: str = ""
    # evaluation, logging, checkpoints
    out_dir: str = "out"
    eval_interval: int = 2000
    log_interval: int = 1
    eval_iters: int = 200
    eval_only: bool = False  # evaluate once and exit
    # the final evaluation also scores the whole val split (the val loss of record)
    eval_full_val: bool = False
    # also score HellaSwag at every evaluation (support/hellaswag.py), logged with the losses
    hellaswag: bool = False
    # a HellaSwag .jsonl; None: the official validation file, fetched on first use
    hellaswag_data: str | None = None
    # False: a fresh run's first evaluation is at eval_interval, not before the first step
    eval_at_start: bool = True
    # the run's timeline (support/timeline.py): a weights-only checkpoint at every evaluation
    # in out_dir/snapshots/, for explore.py's steps; at most snapshot_limit, evenly spread
    snapshots: bool = False
    snapshot_limit: int = 8
    log_heads: bool = False  # each head's induction score and label in log.jsonl, every evaluation
    muon_ns_steps: int = 5  # Newton-Schulz iterations per Muon step (torch.optim.Muon's ns_steps)
    always_save_checkpoint: bool = True  # False: save only when val loss improves, and at the end
    # 'scratch', 'resume' (from out_dir), another run's checkpoint (its folder or file),
    # a Hugging Face GPT-2 folder, or 'gpt2*'
    init_from: str = "scratch"
    wandb_log: bool = False
    wandb_project: str = "gpt"
    wandb_run_name: str | None = None  # None: wandb picks a name
    # data
    dataset: str = "shakespeare_char"
    data_root: str | None = None  # the folder of dataset folders; None: data/ in this repo
    # micro-steps per iter in all, shared by the DDP processes
    gradient_accumulation_steps: int = 5 * 8
    batch_size: int = 12
    # optimizer: 'adamw', or 'muon' (Muon for the hidden matrices, AdamW for the rest)
    optimizer: str = "adamw"
    learning_rate: float = 6e-4
    max_iters: int = 600000
    weight_decay: float = 1e-1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # grad_clip 0: no clipping
    # learning rate: linear warmup, then cosine decay to min_lr (or lr_cooldown's line)
    decay_lr: bool = True
    warmup_iters: int = 2000
    lr_decay_iters: int = 600000
    # seconds of training over which the lr also decays; the schedule goes by iters or
    # by seconds, whichever is further along; 0: by iters only. With max_time, a run
    # timed in minutes ends at min_lr on a slow machine and a fast one alike
    lr_decay_time: float = 0.0
    min_lr: float = 6e-5
    # the share of the schedule at its end over which the lr falls in a straight line
    # to min_lr, after a plateau at learning_rate (warmup-stable-decay); 0: the cosine
    lr_cooldown: float = 0.0
    # sequence-length warmup: the first quarter of lr_decay_time trains on each sequence
    # cut into four (the same tokens, four times the sequences), the second quarter on
    # halves, the rest on the whole block_size; a short sequence's step is cheaper, as
    # attention's cost grows with the context (docs/benchmarks.md)
    seq_warmup: bool = False
    # late dropout (Liu et al. 2023, "Dropout Reduces Underfitting"): the share of the lr
    # schedule (by iters, or by lr_decay_time's seconds, whichever is further along) trained
    # with every dropout off, the model's dropout on after it; 0: dropout on throughout
    late_dropout: float = 0.0
    # seconds of training after which to evaluate, save and stop, a resumed run's
    # checkpoint's included (as max_iters counts its iters); 0: no limit
    max_time: float = 0.0
    # system
    device: str = "auto"  # 'auto' (cuda, then mps, then cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
    # 'auto': bfloat16 where it runs natively (and on a CPU, is faster), else float16 on CUDA,
    # else float32
    dtype: str = "auto"
    compile: bool | None = None  # torch.compile; None: on for CUDA only
    seed: int = 1337
    ddp_timeout: int = 600  # seconds a process waits for the others before it fails
    # processes per sequence, each holding 1/context_parallel of it (context_parallel.py)
    context_parallel: int = 1
    context_parallel_layout: str = "zigzag"  # or 'contiguous'


def model_args(cfg, vocab_size):
    """GPTConfig's arguments from the settings."""
    return dict({key: getattr(cfg, key) for key in MODEL_KEYS}, vocab_size=vocab_size)


def check(cfg):
    """Refuse bad values before anything slow happens (ValueError, one line)."""
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
        value = getattr(cfg, key)
        if value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value}")
    for key in (
        "max_iters",
        "warmup_iters",
        "lr_decay_iters",
        "lr_decay_time",
        "learning_rate",
        "min_lr",
        "weight_decay",
        "grad_clip",
        "max_time",
    ):
        value = getattr(cfg, key)
        if not 0 <= value < math.inf:
            raise ValueError(f"{key} must be a finite number >= 0, got {value}")
    if cfg.ddp_timeout > 10**9:
        raise ValueError(f"ddp_timeout must be at most 1e9 seconds, got {cfg.ddp_timeout}")
    if cfg.attn_dropout is not None and not 0 <= cfg.attn_dropout < 1:
        raise ValueError(f"attn_dropout must be None or in [0, 1), got {cfg.attn_dropout!r}")
    for key in ("beta1", "beta2"):
        value = getattr(cfg, key)
        if not 0 <= value < 1:
            raise ValueError(f"{key} must be in [0, 1), got {value}")
    if cfg.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ValueError(
            f"unknown dtype {cfg.dtype!r}; use one of auto, float32, bfloat16, float16"
        )
    if cfg.optimizer not in ("adamw", "muon"):
        raise ValueError(f"unknown optimizer {cfg.optimizer!r}; use 'adamw' or 'muon'")
    if cfg.context_parallel_layout not in ("zigzag", "contiguous"):
        raise ValueError(
            f"unknown context_parallel_layout {cfg.context_parallel_layout!r}; "
            "use zigzag or contiguous"
        )
    if cfg.attention == "linear" and cfg.sliding_window is not None:
        # it was ignored: linear attention's state sums the whole past, as attend() has it
        raise ValueError(
            "sliding_window and sink_tokens shape softmax attention; linear attention keeps "
            "the whole past in its state: drop them, or train --attention=softmax"
        )
    if cfg.seq_warmup:
        check_seq_warmup(cfg)
    if cfg.late_dropout:
        check_late_dropout(cfg)
    if cfg.lr_cooldown and not 0.0 < cfg.lr_cooldown <= 1.0:
        raise ValueError(
            f"lr_cooldown is a share of the lr schedule, in (0, 1]; got {cfg.lr_cooldown!r} "
            "(0: the cosine)"
        )
    if cfg.init_from == "scratch":
        GPTConfig(**model_args(cfg, vocab_size=1))  # raises on bad model sizes


def check_late_dropout(cfg):
    if not 0.0 <= cfg.late_dropout <= 1.0:
        raise ValueError(
            f"late_dropout is a share of the lr schedule, in [0, 1]; got {cfg.late_dropout!r}"
        )
    if cfg.dropout == 0 and not cfg.attn_dropout:
        raise ValueError(
            "late_dropout turns dropout on late in the run, and dropout is 0: give --dropout "
            "(e.g. 0.1), or --late_dropout=0"
        )


def check_seq_warmup(cfg):
    """The warmup's quarters are of lr_decay_time, and its shortest sequences a
    quarter of block_size, each process holding whole ones."""
    if cfg.lr_decay_time == 0:
        raise ValueError(
            "seq_warmup warms up over lr_decay_time, which is 0: give --lr_decay_time "
            "(with --max_time, the seconds the run trains), or --seq_warmup=False"
        )
    if cfg.block_size % 4:
        raise ValueError(
            f"seq_warmup cuts each sequence into four, and block_size {cfg.block_size} is "
            "not a multiple of 4: give a block_size that is, or --seq_warmup=False"
        )
    if cfg.context_parallel > 1:
        raise ValueError(
            "seq_warmup cuts the sequences that context parallelism shares between "
            "processes: give --context_parallel=1, or --seq_warmup=False"
        )
