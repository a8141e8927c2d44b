# GPT-2 small (124M) from scratch, as in nanoGPT: about 0.5M tokens per iter
# (12 sequences x 1024 tokens x 40 micro-steps), 600k iters = 300B tokens.
#
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py
#
# The 40 micro-steps are shared by the processes (5 each on 8 GPUs), so the
# global batch is the same on any number of GPUs that divides 40.
#
# The dataset is a corpus you prepare yourself, tokenized with GPT-2 BPE into
# data/openwebtext/, for example from a folder of .txt files:
#
#   python data/prepare.py path/to/corpus --tokenizer gpt2 --name openwebtext

out_dir = "out-gpt2"
eval_interval = 1000
eval_iters = 200
log_interval = 10

wandb_log = False  # set True to follow the run on wandb
wandb_project = "owt"
wandb_run_name = "gpt2-124M"

dataset = "openwebtext"
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = True

learning_rate = 6e-4
max_iters = 600000
lr_decay_iters = 600000
min_lr = 6e-5
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
warmup_iters = 2000
