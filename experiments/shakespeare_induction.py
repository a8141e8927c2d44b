"""
What does a Shakespeare run take to form an induction head on a CPU?

    python -m experiments.shakespeare_induction                 # every run of the table
    python -m experiments.shakespeare_induction --only=char_recurring
    python -m experiments.shakespeare_induction --out_dir=docs  # the table of docs/heads.md

Each run is train.py with the CPU recipe (config/shakespeare_cpu.py: rotary
positions, QK-norm, Muon) in float32, changed in what matters for induction
heads: the context (block_size), the layers, the steps, QK-norm (which bounds
every attention logit by sqrt(head size)), the tokenizer (characters, or a
byte-level BPE of 1024 tokens trained on the text), and the corpus: tiny
Shakespeare as it is, or with recurring passages (data/induction.py's
recurring_text: the text cut into passages of 64 to 128 characters, each
written twice in a row, so that copying from the context pays). Every run logs
the heads with --log_heads=True: the induction probe of heads.py and the
in-context learning score, at every evaluation.

Every run keeps every evaluation's weights (--snapshots=True). Each run's
summary also holds the final model, and each snapshot, on val passages of half
the context written twice (16 of them, evenly spread over the val split): its
loss on the first copy and on the second (a model that copies from its
context predicts the second far better; one that does not, no better), and
the induction score of heads.py's probe read on these passages instead of on
random tokens (the weight on the token after the earlier occurrence). The
probe of record stays the random one: on a model's own text, a head can find
the earlier copy by its surroundings as well as by its token.

Runs go one after another in their own processes (torch threads: --threads);
each one's wall and CPU time are measured around it. --train=False reads the
runs' folders again without training (the summaries only), for the runs already
in the results file. Writes out-shakespeare-induction/<run>/ (the runs) and
shakespeare_induction.json in --out_dir (default out-experiments/shakespeare_induction/;
docs/ only when given --out_dir=docs, whose table docs/heads.md quotes), one record per
run, added to what is there.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import json
import resource
import shutil
import subprocess
import time

import numpy as np
import torch
import torch.nn.functional as F

from experiments import SCRATCH
from experiments.head_timeline import TimelineError, phase_change, read_losses, read_timeline
from support import cli, timeline
from support.configurator import ConfigError
from support.head_measures import INDUCTION

OUT = os.path.join(ROOT, "out-shakespeare-induction")


@dataclasses.dataclass
class Settings:
    only: str = ""  # "" = every run; or one run's name
    threads: int = 1  # torch threads of each run
    train: bool = True  # False: summarise the runs already in out-shakespeare-induction/ again
    # the results file's folder
    out_dir: str = os.path.join(SCRATCH, "shakespeare_induction")  # docs: the shipped table


PASSAGES = 16  # val passages written twice, for the final model's repeat losses

# what every run shares: the CPU recipe in float32, two layers, the heads logged
COMMON = dict(
    n_layer=2,
    block_size=256,
    batch_size=32,
    dtype="float32",
    eval_iters=4,
    eval_at_start=True,
    log_heads=True,
    eval_full_val=False,
    snapshots=True,  # every evaluation's weights, for the passages over training
    snapshot_limit=100,
)

# name: (tokenizer, recurring passages, the settings it changes)
RUNS = {
    "char_plain": ("char", False, dict(max_iters=1500)),
    "char_recurring": ("char", True, dict(max_iters=1500)),
    "bpe_plain": ("bpe:1024", False, dict(max_iters=1500)),
    "char_recurring_no_qk_norm": ("char", True, dict(max_iters=1500, qk_norm=False)),
    "char_plain_no_qk_norm": ("char", False, dict(max_iters=1500, qk_norm=False)),
    "char_plain_512_no_qk_norm": (
        "char",
        False,
        dict(block_size=512, batch_size=16, max_iters=1500, qk_norm=False),
    ),
}


def dataset_name(tokenizer, recurring):
    kind = "char" if tokenizer == "char" else tokenizer.replace(":", "")
    return f"shakespeare_{kind}" + ("_recurring" * recurring)


def prepare(tokenizer, recurring):
    """The dataset's name under data/, prepared on first use."""
    from data import DATA_ROOT
    from data.dataset import FILES
    from data.induction import recurring_text
    from data.text import prepare_text
    from data.tiny_shakespeare import shakespeare_dir, shakespeare_text

    name = dataset_name(tokenizer, recurring)
    folder = os.path.join(DATA_ROOT, name)
    if all(os.path.exists(os.path.join(folder, f)) for f in FILES):
        return name
    text = shakespeare_text(shakespeare_dir("char"))
    if recurring:
        text = recurring_text(text)
    prepare_text(text, folder, tokenizer, source="experiments/shakespeare_induction.py")
    return name


def train(name, tokenizer, recurring, changes, threads):
    """Run train.py; returns its settings, exit code, wall and CPU seconds."""
    settings = dict(COMMON, **changes)
    steps = settings["max_iters"]
    settings.update(
        dataset=prepare(tokenizer, recurring),
        out_dir=os.path.join(OUT, name),
        lr_decay_iters=steps,
        eval_interval=max(steps // 15, 1),
        log_interval=max(steps // 15, 1),
    )
    # trained anew: train.py refuses to replace an earlier run's checkpoint
    shutil.rmtree(settings["out_dir"], ignore_errors=True)
    argv = ["config/shakespeare_cpu.py", *[f"--{k}={v}" for k, v in settings.items()]]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(os.path.join(OUT, f"{name}.log"), "w") as log:
        done = subprocess.run(
            [sys.executable, "train.py", *argv], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return settings, done.returncode, wall, cpu


def passage_tokens(out_dir):
    """PASSAGES val passages of block_size // 2 tokens, each written twice: (P, 2L) and L,
    from the val split of the dataset out_dir's checkpoint was trained on; and that split."""
    from support.head_measures import val_tokens
    from support.loading import load_model

    model, tok, _ = load_model(out_dir, out_dir)
    L = model.config.block_size // 2
    val = np.asarray(val_tokens(out_dir, tok)[0])
    starts = np.linspace(0, len(val) - L - 1, PASSAGES).round().astype(int)
    x = torch.from_numpy(np.stack([val[s : s + L] for s in starts]).astype(np.int64))  # (P, L)
    return torch.cat([x, x], dim=1), L, val


@torch.no_grad()
def on_passages(path, out_dir, idx, L):
    """The model of a checkpoint (path) on the passages idx: its loss on the first copy
    and on the second, and every head's induction score there (n_layer, n_head)."""
    from support.head_measures import probe_scores, repeat_losses
    from support.loading import load_model

    model, _, _ = load_model(path, out_dir)
    model.eval()
    first, second = repeat_losses(model, idx, L)
    _, maps = model.attention_maps(idx)
    return first, second, probe_scores(maps, L)["induction"], model


def passages(out_dir):
    """The final model on the passages: its losses on the two copies, the best head's
    induction score there and the standard error of its in-context learning score; and
    [iter, best induction score, second-copy loss] at every snapshot of the run."""
    idx, L, val = passage_tokens(out_dir)
    first, second, induction, model = on_passages(out_dir, out_dir, idx, L)
    over_training = []
    for iter_num, path in timeline.list_snapshots(out_dir).items():
        _, repeated, scores, _ = on_passages(path, out_dir, idx, L)
        over_training.append([iter_num, round(float(scores.max()), 4), round(repeated, 4)])
    return first, second, float(induction.max()), icl_error(model, val), over_training


@torch.no_grad()
def passage_knockouts(out_dir):
    """For a 2-layer model: each layer-0 head removed whole, and only its direct path into
    layer 1's keys cut: [head, how, best layer-1 induction score on the passages, the
    second copy's loss]."""
    from support.head_measures import ablated, path_ablated, probe_scores, repeat_losses
    from support.loading import load_model

    idx, L, _ = passage_tokens(out_dir)
    model, _, _ = load_model({"init_from": out_dir, "out_dir": out_dir})
    model.eval()
    found = []
    for head in range(model.config.n_head):
        cuts = {"whole": ablated(model, [(0, head)])}
        cuts["keys only"] = path_ablated(model, [(0, head)], 1, ("k",))
        for how, context in cuts.items():
            with context:
                _, maps = model.attention_maps(idx)
                _, second = repeat_losses(model, idx, L)
            best = float(probe_scores(maps, L)["induction"][1].max())
            found.append([head, how, round(best, 4), round(second, 4)])
    return found


@torch.no_grad()
def icl_error(model, val):
    """The standard error of the logged in-context learning score of the final model:
    the spread of the late-minus-early loss over the windows it averages."""
    T = model.config.block_size
    n = min(timeline.ICL_WINDOWS, (len(val) - 1) // T)
    early, late = timeline.icl_positions(T)
    rows = np.arange(n)[:, None] * T + np.arange(T + 1)  # (n, T + 1) the score's windows
    chunk = torch.from_numpy(val[rows].astype(np.int64))
    logits, _ = model(chunk[:, :-1])  # (n, T, vocab)
    targets = chunk[:, [early + 1, late + 1]]  # (n, 2)
    losses = F.cross_entropy(logits[:, [early, late]].transpose(1, 2), targets, reduction="none")
    differences = (losses[:, 1] - losses[:, 0]).numpy()  # (n,) late minus early, per window
    return float(differences.std(ddof=1) / np.sqrt(n))


def summary(out_dir):
    """What the log says about induction: the best head's induction score at the start,
    at its highest and at the end, the in-context learning score and the val loss at
    the start and the end, and the phase change's iters if there was one."""
    iters, induction, _ = read_timeline(out_dir)
    val_loss, icl = read_losses(out_dir)
    best = induction.max(axis=(1, 2))  # (E,)
    top = int(np.argmax(best))
    where = np.unravel_index(np.argmax(induction[top]), induction[top].shape)
    span = phase_change(iters, induction)
    first, second, passage_induction, icl_se, over_training = passages(out_dir)
    found = dict(
        best_induction_start=round(float(best[0]), 4),
        best_induction_max=round(float(best[top]), 4),
        best_induction_max_iter=int(iters[top]),
        best_induction_head=[int(where[0]), int(where[1])],
        best_induction_end=round(float(best[-1]), 4),
        icl_start=round(float(icl[0]), 4),
        icl_end=round(float(icl[-1]), 4),
        icl_end_standard_error=round(icl_se, 4),
        val_loss_end=round(float(val_loss[-1]), 4),
        phase_change=None if span is None else [int(iters[span[0]]), int(iters[span[1]])],
        passage_first_copy_loss=round(first, 4),
        passage_second_copy_loss=round(second, 4),
        passage_best_induction=round(passage_induction, 4),
        passage_by_snapshot=over_training,
    )
    # the induction head on the model's own text: what feeds it
    if passage_induction >= INDUCTION and induction.shape[1] == 2:  # 2 layers
        found["passage_knockouts"] = passage_knockouts(out_dir)
    return found


def main(cfg):
    if cfg.only and cfg.only not in RUNS:
        raise ConfigError(f"unknown run {cfg.only!r}; the runs are {', '.join(RUNS)}")
    cli.check_threads(cfg.threads, least=1)  # each run its own threads, 1 or more
    cli.output_folder(cfg.out_dir)
    path = os.path.join(cfg.out_dir, "shakespeare_induction.json")
    os.makedirs(OUT, exist_ok=True)
    results = {}
    if os.path.isfile(path):
        with open(path) as f:
            results = json.load(f)
    for name, (tokenizer, recurring, changes) in RUNS.items():
        if cfg.only and name != cfg.only:
            continue
        if not cfg.train:
            if name in results and os.path.isdir(os.path.join(OUT, name)):
                results[name].update(summary(os.path.join(OUT, name)))
            continue
        load_before = os.getloadavg()[0]
        settings, code, wall, cpu = train(name, tokenizer, recurring, changes, cfg.threads)
        results[name] = dict(
            tokenizer=tokenizer,
            recurring=recurring,
            block_size=settings["block_size"],
            n_layer=settings["n_layer"],
            max_iters=settings["max_iters"],
            batch_size=settings["batch_size"],
            threads=cfg.threads,
            wall_s=round(wall, 1),
            cpu_s=round(cpu, 1),
            load_before=round(load_before, 2),
            load_after=round(os.getloadavg()[0], 2),
        )
        if code == 0:
            results[name].update(summary(settings["out_dir"]))
        else:
            results[name]["failed"] = f"train.py exited with {code}; see {name}.log"
        print(name, json.dumps(results[name]), flush=True)
        write(results, path)
    write(results, path)


def write(results, path):
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def run(argv):
    """The command: main() with --help, and bad input as one line (support/cli.py)."""
    # a run's folder that cannot be summarised (a run stopped early) is one line too
    return cli.run(main, argv, __doc__, Settings, (TimelineError,))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
