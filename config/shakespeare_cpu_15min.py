# The best character-level Shakespeare model we know how to train in 15 minutes on
# two CPU cores, in float32 (a CPU without native bfloat16; where bfloat16 is native,
# dtype "auto" takes it and the run is faster). The CPU recipe
# (config/shakespeare_cpu.py: rotary positions, RMS-normed queries and keys,
# ReLU-squared MLPs, no biases, Muon) made wider and deeper, with nanoGPT's
# 256-character context, trained for 15 minutes instead of 30 seconds.
# docs/benchmarks.md has its curve against nanoGPT's baby GPT settings given the
# same time (python -m bench.recipes --minutes=15).
#
#   python train.py config/shakespeare_cpu_15min.py
#   python sample.py --out_dir=out-shakespeare-char-15min --prompt "ROMEO:"

out_dir = "out-shakespeare-char-15min"
eval_interval = 100
eval_at_start = False
eval_iters = 10
eval_full_val = True  # the final val loss is over the whole val split, not a sample
log_interval = 10
always_save_checkpoint = False

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 32
block_size = 256

n_layer = 4
n_head = 6
n_embd = 192
dropout = 0.0
bias = False
rope = True
qk_norm = True
activation = "relu2"

optimizer = "muon"
muon_ns_steps = 4
learning_rate = 6e-3
max_iters = 900
lr_decay_iters = 900
warmup_iters = 20
min_lr = 6e-4
beta2 = 0.99

device = "cpu"
compile = False
dtype = "auto"
