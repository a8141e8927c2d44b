# A character-level Shakespeare model for 15 minutes of two CPU cores, in float32 (a CPU
# without native bfloat16; where bfloat16 is native and times faster, dtype "auto" takes
# it: 1.23x on an AMD EPYC, no faster in a run on a Xeon). The CPU recipe
# (config/shakespeare_cpu.py: rotary positions, RMS-normed queries and keys,
# ReLU-squared MLPs, no biases, Muon, lr 6e-3) one layer deeper, with nanoGPT's
# 256-character context, a learned gain after QK-norm, token shift on the embeddings and
# dropout 0.1 on the residual stream in the second half of its time (late_dropout), the
# first half on shorter sequences (seq_warmup, below), compiled, trained for 15 minutes
# by the clock: the lr holds its peak for half the time, then falls by seconds of
# training (lr_decay_time, lr_cooldown) to 0 at max_time,
# so that a slower machine trains fewer iters and a faster one more, each ending at the
# bottom of its schedule. Before token shift, on a 2-core Intel Xeon in float32: 2,707
# iters and val 1.454 over the whole split (nanoGPT's A100 result is 1.47; its baby GPT
# settings reach 2.409 in the same 15 minutes); capped at AVX2 (no AVX-512, no native
# bfloat16) 1,932 iters and 1.479; on a 2-core AMD EPYC in float32 1,498-1,761 iters and
# 1.474-1.477; on a first-generation EPYC (Zen 1) in float32, 588 iters and 1.568.
# docs/benchmarks.md has its curve against nanoGPT's baby GPT settings,
# how the dropout, min_lr and the gain were chosen on a split cut from train, and
# python -m bench.recipes --minutes=15 to measure both again.
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
# on the residual stream only: attention dropout would double the step's time on
# the CPU (the fused kernel's slow path), and the repetition is what needs it. Given 10
# minutes, 0.05 beat 0.1 over 7 paired seeds on two classes: -0.0100 nats (95% CI -0.0181
# to -0.0019); given these 15, one run with 0.05 ended at 1.4606 against 1.4435 with 0.1,
# a longer run overfitting more, so 0.05 waits for a 10-minute recipe (docs/benchmarks.md)
dropout = 0.1
attn_dropout = 0.0
bias = False
rope = True
qk_norm = True
# a learned gain on the normed queries and keys, so that a head can attend sharply
# (chosen on a split cut from train: 1.431 against 1.444 and 1.448 without it)
qk_gain = True
activation = "relu2"
# token shift: each token's embedding plus a learned gain (starting at 0) times the one
# before it. Given 10 minutes on a first-generation EPYC in float32, 4 paired seeds:
# -0.0119 nats (95% CI -0.0231 to -0.0006), at the same step time (docs/benchmarks.md)
token_shift = True

optimizer = "muon"
muon_ns_steps = 4
learning_rate = 6e-3
# 15 minutes of training (evaluations and saves do not count), and the lr's schedule
# over those seconds (lr_cooldown, below); the iters are a bound out of two cores'
# reach (some 2,700 in float32 on a Xeon), so that the clock ends the run wherever it runs
max_time = 900
lr_decay_time = 900
max_iters = 10000
lr_decay_iters = 10000
warmup_iters = 20
min_lr = 0.0
beta2 = 0.99
# sequence-length warmup: the first quarter of lr_decay_time on each sequence cut into four
# (64 characters), the second on halves, then whole; the same tokens in cheaper steps. Given
# 10 minutes on a Zen 4 EPYC in bfloat16, 9 paired seeds: -0.0086 nats (95% CI -0.0137 to
# -0.0034), 1.16x the iters (docs/benchmarks.md)
seq_warmup = True
# late dropout (Liu et al. 2023): the first half of lr_decay_time with every dropout off, the
# 0.1 above after, where the sequences become whole. Given 10 minutes, 4 paired seeds on a
# Zen 4 EPYC in bfloat16: -0.0105 nats (95% CI -0.0265 to +0.0055); 6 capped at AVX2 in
# float32: -0.0069 (-0.0131 to -0.0007); the 10 pooled -0.0083 (-0.0137 to -0.0029)
late_dropout = 0.5
# warmup-stable-decay (Hu et al. 2024; Hagele et al. 2024): the peak lr for the first half of
# lr_decay_time, then a straight line to 0, not the cosine. Given 10 minutes, 9 paired seeds
# on the Zen 4 EPYC capped at AVX2 in float32: -0.0074 nats (95% CI -0.0124 to -0.0024); 4 in
# bfloat16 uncapped: -0.0008 (-0.0095 to +0.0079); the 13 pooled -0.0054 (-0.0095 to -0.0013)
lr_cooldown = 0.5

device = "cpu"
# inductor fuses the elementwise work around the matrix multiplies (norms, rotary,
# ReLU squared, dropout's masks): 1.14x the eager step after some 15 s of compiling
compile = True
dtype = "auto"
