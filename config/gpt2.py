# GPT-2 small (124M) from scratch on FineWeb-edu's 10B-token sample, as
# build-nanogpt trains it: about 0.5M tokens per iter (16 sequences x 1024
# tokens x 32 micro-steps), 19,073 iters = one pass over the 10B tokens,
# scored on HellaSwag at every evaluation (GPT-2 124M itself: about 0.2955
# acc_norm, build-nanogpt's figure).
#
# Prepare the corpus once (streamed from the hub, tokenized on every core;
# about 10B tokens, 20 GB of uint16 shards):
#
#   python data/prepare.py HuggingFaceFW/fineweb-edu --subset sample-10BT \
#       --tokenizer gpt2 --name fineweb_edu --val_docs 10000
#
# then train on 8 GPUs:
#
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2.py
#
# The 32 micro-steps are shared by the processes (4 each on 8 GPUs), so the
# global batch is the same on any number of GPUs that divides 32.

out_dir = "out-gpt2"
eval_interval = 250
eval_iters = 100
log_interval = 10
hellaswag = True  # the official validation file, fetched on first use

wandb_log = False  # set True to follow the run on wandb
wandb_project = "fineweb-edu"
wandb_run_name = "gpt2-124M"

dataset = "fineweb_edu"
batch_size = 16
block_size = 1024
gradient_accumulation_steps = 4 * 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = True

learning_rate = 6e-4
max_iters = 19073
lr_decay_iters = 19073
min_lr = 6e-5
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
warmup_iters = 715
