# A few-million-parameter model with its own BPE, on a corpus you prepare, on a CPU.
#
# Any corpus of documents works; tiny Shakespeare's paragraphs as jsonl, for example:
#
#   python -c "import json; t = open('input.txt').read(); \
#       open('docs.jsonl', 'w').writelines(json.dumps({'text': p}) + '\n' for p in t.split('\n\n'))"
#   python data/prepare.py docs.jsonl --tokenizer bpe:2048 --name corpus --val_fraction 0.1
#   python train.py config/corpus_cpu.py
#   python sample.py --out_dir=out-corpus-cpu --prompt "ROMEO:"
#
# A 2048-token vocabulary keeps the embedding small (0.5M of the 3.7M
# parameters) and a 128-token window covers about 450 characters. The
# recipe is config/shakespeare_cpu.py's (rotary positions, RMS-normed queries
# and keys, ReLU-squared MLPs, Muon), one layer deeper and twice as wide.
# On tiny Shakespeare's paragraphs it reaches a whole-val loss of 3.98 nats per
# token (1.38 per character) in 300 iters, under 4 minutes on 2 cores
# (docs/benchmarks.md).

out_dir = "out-corpus-cpu"
eval_interval = 100
eval_iters = 20
eval_full_val = True  # the final val loss is over the whole val split, not a sample
log_interval = 10
always_save_checkpoint = False

dataset = "corpus"
gradient_accumulation_steps = 1
batch_size = 16
block_size = 128

n_layer = 4
n_head = 4
n_embd = 256
dropout = 0.0
bias = False
rope = True
qk_norm = True
activation = "relu2"

optimizer = "muon"
learning_rate = 6e-3
max_iters = 300
lr_decay_iters = 300
warmup_iters = 20
min_lr = 6e-4
beta2 = 0.99

device = "cpu"
compile = False
dtype = "auto"  # bfloat16 autocast where the CPU has it natively, else float32
