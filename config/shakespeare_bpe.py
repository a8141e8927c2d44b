# Fine-tune GPT-2 (124M) on tiny Shakespeare tokenized with GPT-2's BPE.
#
#   python train.py config/shakespeare_bpe.py                          # downloads 'gpt2'
#   python train.py config/shakespeare_bpe.py --init_from=path/to/gpt2 # offline: a Hugging Face
#                                                                      # folder with config.json
#                                                                      # and model.safetensors
#
# Starting from scratch instead also works, with a small model, e.g.
#   --init_from=scratch --n_layer=4 --n_head=4 --n_embd=256 --learning_rate=1e-3 --max_iters=2000

out_dir = "out-shakespeare-bpe"
init_from = "gpt2"
eval_interval = 25
eval_iters = 40
log_interval = 5
always_save_checkpoint = False  # keep the checkpoint with the best val loss

dataset = "shakespeare"
batch_size = 4
block_size = 512  # GPT-2 knows 1024 positions; 512 halves memory and time
gradient_accumulation_steps = 8  # 16k tokens per iter

# a pretrained model needs only small, constant steps
learning_rate = 3e-5
decay_lr = False
max_iters = 200
dropout = 0.1
