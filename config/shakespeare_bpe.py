# Tiny Shakespeare in GPT-2 BPE tokens (or your own corpus: --dataset=NAME).
#
# The default trains a small model from scratch, so it works offline:
#
#   python train.py config/shakespeare_bpe.py
#
# To fine-tune GPT-2 (124M) instead, point init_from at a local Hugging Face
# folder (config.json and model.safetensors), or at 'gpt2' when online. The
# model's shape then comes from the weights, and a pretrained model wants small,
# constant steps:
#
#   python train.py config/shakespeare_bpe.py --init_from=path/to/gpt2 \
#       --learning_rate=3e-5 --decay_lr=False --max_iters=200 --dropout=0.1 \
#       --batch_size=4 --block_size=512 --gradient_accumulation_steps=8

out_dir = "out-shakespeare-bpe"
init_from = "scratch"
eval_interval = 100
eval_iters = 50
log_interval = 10
always_save_checkpoint = False  # keep the checkpoint with the best val loss

dataset = "shakespeare"  # about 300k training tokens: small models overfit it quickly
gradient_accumulation_steps = 2
batch_size = 16
block_size = 256

n_layer = 4
n_head = 4
n_embd = 256
dropout = 0.2

learning_rate = 1e-3
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
