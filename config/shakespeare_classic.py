# The classic character-level "baby GPT" recipe on tiny Shakespeare, exactly as
# nanoGPT ships it (about 10M parameters; val loss near 1.47 after 5000 iters).
# Kept as a fixed reference point while config/shakespeare.py may change.
#
#   python train.py config/shakespeare_classic.py

out_dir = "out-shakespeare-char-classic"
eval_interval = 250  # a small corpus: check often, the model starts to overfit early
eval_iters = 200
log_interval = 10
always_save_checkpoint = False  # keep the checkpoint with the best val loss

wandb_log = False
wandb_project = "shakespeare-char"
wandb_run_name = "mini-gpt"

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # characters of context

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
bias = False  # nanoGPT's train.py default (our settings default to GPT-2's biases)

learning_rate = 1e-3  # a small model tolerates a larger step
max_iters = 5000
lr_decay_iters = 5000  # usually equal to max_iters
min_lr = 1e-4  # usually learning_rate / 10
beta2 = 0.99  # few tokens per step, so average the second moment over more steps
warmup_iters = 100
