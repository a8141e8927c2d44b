# The character-level "baby GPT" on tiny Shakespeare (6 layers, 6 heads, 384
# wide, 256 characters of context), with the choices of recent fast training
# runs: rotary position embeddings, RMS-normed queries and keys, ReLU-squared
# MLPs, no biases, and Muon (torch.optim.Muon) for the hidden matrices.
# nanoGPT's own settings are in config/shakespeare_classic.py.
#
#   python train.py config/shakespeare.py
#
# On a CPU, after 150 iters at batch 8 this recipe reached val loss 2.17
# where the classic one was at 2.48 (docs/benchmarks.md). Its GPU time to val
# loss 1.47 is still to be measured there. Without a GPU, train the small
# model of config/shakespeare_cpu.py instead.

out_dir = "out-shakespeare-char"
eval_interval = 250  # a small corpus: check often, the model starts to overfit early
eval_iters = 200
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
