# Induction heads forming in a run of train.py: the classic setting of Olsson et
# al. (2022), lines of a random string written again and again (data/induction.py),
# read by a 2-layer model. Around iter 500 a layer-0 head turns into a
# previous-token head, the layer-1 heads into induction heads, and the val loss
# and the in-context learning score drop together: the phase change.
# docs/heads.md has the run and its figure.
#
#   python train.py config/induction.py --snapshots=True --log_heads=True
#   python -m experiments.head_timeline --out_dir=out-induction
#   python heads.py --out_dir=out-induction
#
# Under 5 minutes on two CPU cores in float32 (docs/heads.md has the timing).

out_dir = "out-induction"
dataset = "induction"  # prepared on first use
eval_interval = 25  # often enough to see the phase change step by step
eval_iters = 4
log_interval = 25
always_save_checkpoint = False
# every evaluation's weights (81 snapshots of 0.4 MB), so that explore.py steps through
# the phase change and experiments/induction_experiment.py reads the composition at each
snapshot_limit = 100

gradient_accumulation_steps = 1
batch_size = 32
block_size = 64

n_layer = 2
n_head = 4
n_embd = 64
dropout = 0.0
bias = False
rope = True

optimizer = "adamw"
learning_rate = 2e-3
max_iters = 2000
lr_decay_iters = 2000
warmup_iters = 50
min_lr = 1e-4
beta2 = 0.99
weight_decay = 0.0  # nothing to forget: every line is new

device = "cpu"
compile = False
# float32 everywhere, so that the run is the same on CPUs with and without native bfloat16
dtype = "float32"
