# A character-level Shakespeare model for 15 minutes of two CPU cores, in float32
# (a CPU without native bfloat16; where bfloat16 is native, dtype "auto" takes it
# and the run is about 1.15x faster). The CPU recipe (config/shakespeare_cpu.py:
# rotary positions, RMS-normed queries and keys, ReLU-squared MLPs, no biases,
# Muon, lr 6e-3) one layer deeper, with nanoGPT's 256-character context, trained
# for 1,500 iters instead of 200: 12 passes over the training text. On a 2-core
# AMD EPYC in float32 it reached val 1.533 over the whole split in 13.5 minutes of
# training, where nanoGPT's baby GPT settings reach 2.471 in 15; from about iter
# 1,000 on it starts to memorise the text (docs/benchmarks.md: the curves, and
# python -m bench.recipes --minutes=15 to measure both again).
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
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
rope = True
qk_norm = True
activation = "relu2"

optimizer = "muon"
muon_ns_steps = 4
learning_rate = 6e-3
max_iters = 1500
lr_decay_iters = 1500
warmup_iters = 20
min_lr = 6e-4
beta2 = 0.99

device = "cpu"
compile = False
dtype = "auto"
