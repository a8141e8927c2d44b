# A character-level "baby GPT" on tiny Shakespeare, with nanoGPT's well-known
# settings (about 10M parameters; a few minutes on one GPU, val loss near 1.47).
#
#   python train.py config/shakespeare.py
#
# Without a GPU, train a much smaller model instead (config/shakespeare_cpu.py
# holds exactly these settings):
#
#   python train.py config/shakespeare.py --device=cpu --compile=False --eval_iters=20 \
#       --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 \
#       --n_embd=128 --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0

out_dir = "out-shakespeare-char"
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

learning_rate = 1e-3  # a small model tolerates a larger step
max_iters = 5000
lr_decay_iters = 5000  # usually equal to max_iters
min_lr = 1e-4  # usually learning_rate / 10
beta2 = 0.99  # few tokens per step, so average the second moment over more steps
warmup_iters = 100
