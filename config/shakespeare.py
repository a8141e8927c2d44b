# The main command's config: a character-level model of tiny Shakespeare, sized for
# the machine it runs on.
#
#   python train.py config/shakespeare.py && python sample.py --prompt "ROMEO:"
#
# With a GPU it trains the "baby GPT" (6 layers, 6 heads, 384 wide, 256 characters of
# context) with the choices of recent fast training runs: rotary position embeddings,
# RMS-normed queries and keys, ReLU-squared MLPs, no biases, and Muon
# (torch.optim.Muon) for the hidden matrices. nanoGPT's own settings are in
# config/shakespeare_classic.py. On a CPU, after 150 iters at batch 8 this recipe
# reached val loss 2.17 where the classic one was at 2.48 (docs/benchmarks.md).
#
# Without one it trains a model sized for the CPU (the end of this file).

import os

import torch

from support.run_estimate import seconds_per_iter

out_dir = "out-shakespeare-char"
eval_interval = 250  # a small corpus: check often, the model starts to overfit early
# 20 batches of 64 x 256 characters, three times the val split (111,540): an estimate
# within some 0.005 nats, a tenth of the 200 batches nanoGPT reads; the val loss of
# record is the whole val split's, at the end
eval_iters = 20
# a fresh model's loss is about ln(65) = 4.17: no evaluation before the first step
eval_at_start = False
eval_full_val = True  # the final val loss is over the whole val split, not a sample
log_interval = 10
always_save_checkpoint = False  # keep the checkpoint with the best val loss

wandb_log = False
wandb_project = "shakespeare-char"
wandb_run_name = "baby-gpt"

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # characters of context

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
bias = False
rope = True
qk_norm = True
activation = "relu2"

optimizer = "muon"
learning_rate = 2e-3
max_iters = 2500
lr_decay_iters = 2500
min_lr = 2e-4
beta2 = 0.99  # few tokens per step, so average the second moment over more steps
warmup_iters = 100

# -----------------------------------------------------------------------------
# Sized for the machine. The baby GPT is a GPU's model: on two CPU cores each of its
# 2,500 iters takes some 20 s, and the run half a day. So where device is "auto" and
# no CUDA GPU is found, one of its iters is timed here (a few seconds), and where its
# iters would take more than an hour, this config trains the 10-minute CPU recipe
# instead (config/shakespeare_cpu_10min.py, and the 15-minute recipe it is cut from, say
# how it was chosen), into the same out_dir, so that `python sample.py` finds it. The
# run's first line (note) says which recipe it trains and why; the second, the model's
# size as trained (after any --key=value). --device=cpu (or mps) trains the baby GPT
# anyway.

if device == "auto" and torch.cuda.is_available():
    note = "config/shakespeare.py: a CUDA GPU was found, so the baby GPT"
elif device == "auto":
    _here = "mps" if torch.backends.mps.is_available() else "cpu"
    _failed = ""
    try:
        # None under torchrun, where each process would time for itself: the CPU recipe
        _iter_s = seconds_per_iter(globals(), _here)
    except (RuntimeError, NotImplementedError) as _e:
        if _here != "mps":
            raise
        # the timed iter is the baby GPT's first step on MPS; where it fails (an op MPS
        # lacks, a Mac's setup), the CPU recipe trains on the CPU instead
        _iter_s = None
        _failed = f"first step failed on MPS ({type(_e).__name__}: {str(_e).splitlines()[0]})"
    if _iter_s is not None and _iter_s * max_iters <= 3600:
        note = (
            f"config/shakespeare.py: the baby GPT on {_here}: its iters should take "
            f"{_iter_s * max_iters / 60:.0f} min here ({_iter_s:.2f} s per iter, timed)"
        )
    else:
        _baby = f"{max_iters:,} iters"
        if _iter_s is not None:
            _baby += f" would take {_iter_s * max_iters / 3600:.1f} h here ({_iter_s:.1f} s each)"
        if _failed:
            _baby = _failed
        with open(os.path.join(os.path.dirname(__file__), "shakespeare_cpu_10min.py")) as _f:
            exec(_f.read())
        out_dir = "out-shakespeare-char"
        wandb_run_name = "cpu-10min"
        # evaluations are off the training clock but not the wall's: every 250 iters
        # rather than 100 keeps the whole run within 11 minutes (some 1,200 iters on
        # two cores without AVX-512); the final evaluation scores the whole val split
        eval_interval = 250
        _found = "no GPU found"
        _anyway = "--device=cpu trains it anyway"
        if _here == "mps":
            _found = "no CUDA GPU found"
            _anyway = "--device=mps trains it there anyway"
        if _failed:
            _anyway = "--device=cpu trains it on the CPU anyway"
        note = (
            f"config/shakespeare.py: {_found}, so a model sized for the CPU: the "
            f"{max_time / 60:.0f}-minute CPU recipe; "
            f"the baby GPT's {_baby}; {_anyway}"
        )
