# The fastest way we know to a good character-level Shakespeare model on a CPU:
# nanoGPT's CPU model width (4 heads, 128 wide, context 64) with one layer fewer
# (3 layers trained 200 iters beat 4 trained 180, in less time) and the choices
# of recent fast training runs: rotary position embeddings, RMS-normed queries
# and keys, ReLU-squared MLPs, no biases, and Muon for the hidden matrices
# (torch.optim.Muon; AdamW for embeddings and gains), in bfloat16 autocast where
# the CPU has it natively. It reaches a val loss below 1.88 over the whole val
# split in 200 iters at batch 32, where the classic recipe
# (config/shakespeare_cpu_classic.py) takes 2000 iters and over three times the
# wall time, on CPUs with and without native bfloat16. docs/benchmarks.md has
# the measurements.
#
#   python train.py config/shakespeare_cpu.py
#   python sample.py --out_dir=out-shakespeare-char-cpu --prompt "ROMEO:"

out_dir = "out-shakespeare-char-cpu"
eval_interval = 200  # evaluate at the end only: evaluations cost as much as 15% of the run
eval_at_start = False  # a fresh model's loss is about ln(65) = 4.17 anyway
eval_iters = 10
eval_full_val = True  # the final val loss is over the whole val split, not a sample
log_interval = 10
always_save_checkpoint = False
# with --snapshots=True (explore.py's steps): at most 4 weights-only snapshots of 2.4 MB;
# --log_heads=True logs the heads at every evaluation whatever this limit
snapshot_limit = 4

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 32
block_size = 64

n_layer = 3
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
rope = True
qk_norm = True
activation = "relu2"

optimizer = "muon"
muon_ns_steps = 4  # as good as torch's 5 here (whole-val loss over 4 seeds), and a cheaper step
learning_rate = 6e-3
max_iters = 200
lr_decay_iters = 200
warmup_iters = 10
min_lr = 6e-4
beta2 = 0.99

device = "cpu"
compile = False
# bfloat16 autocast where the CPU multiplies bf16 natively (AVX512-BF16 or AMX),
# several times faster than float32; float32 elsewhere, where bf16 is emulated
# and much slower (hardware.py). The start-up line says which was chosen.
dtype = "auto"
