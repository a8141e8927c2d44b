# nanoGPT's documented settings for a CPU: the character-level Shakespeare
# model scaled down, 2000 iters of AdamW with learned positions and GELU.
# Kept for comparison with the faster recipe in config/shakespeare_cpu.py.
#
#   python train.py config/shakespeare_cpu_classic.py

out_dir = "out-shakespeare-char-cpu-classic"
eval_interval = 250
eval_iters = 20
log_interval = 1
always_save_checkpoint = False

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 12
block_size = 64

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False  # nanoGPT's train.py default (our settings default to GPT-2's biases)

learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100

device = "cpu"
compile = False
dtype = "float32"  # nanoGPT trains in float32 on a CPU
