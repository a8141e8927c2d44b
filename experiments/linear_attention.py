"""Linear attention against softmax attention: the figures of docs/linear_attention.md.

Each part measures one thing and adds it to linear_attention.json in --out_dir
(default out-experiments/linear_attention/; --out_dir=docs for docs/'s, which
every part below then takes); `report` turns that file into linear_attention.md
beside it. Run the timed parts one at a time on an otherwise quiet machine (the
figures are ratios against softmax measured in the same run, but a busy machine
still moves them):

    # config/shakespeare_cpu.py, both kinds (~2 min)
    python -m experiments.linear_attention train
    # one layer, forward + backward, T = 1024 .. 16384
    python -m experiments.linear_attention layer
    # generating 10 x block_size tokens
    python -m experiments.linear_attention decode
    # decoding speed after 1k .. 16k tokens of context
    python -m experiments.linear_attention context
    python -m experiments.linear_attention heads      # heads.py on both trained models
    python -m experiments.linear_attention report     # writes linear_attention.md

The corpus: set TINYSHAKESPEARE_PATH, as for train.py.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import json
import math
import platform
import resource
import shutil
import subprocess
import time

import torch

from experiments import SCRATCH
from model import GPT, GPTConfig, rotary_tables
from support import cli, engine
from support.configurator import ConfigError
from support.run_log import read_evaluations

OUT = {"softmax": "out-la-softmax", "linear": "out-la-linear"}
SAMPLE = [
    "--prompt=ROMEO:",
    "--seed=1337",
    "--num_samples=1",
    "--max_new_tokens=300",
    "--attn_dir=",
]


def load(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def save(results, path):
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")


def machine():
    return dict(
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(),
        torch=torch.__version__,
        processor=platform.processor() or platform.machine(),
        date=time.strftime("%Y-%m-%d"),
        load=loadavg(),
    )


def run(args):
    """A command from the repo root; its stdout."""
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


# the CPU recipe as these figures were measured (it has 3 layers and 200 iters since)
RECIPE = ["--n_layer=4", "--max_iters=180", "--lr_decay_iters=180", "--muon_ns_steps=5"]


def train_one(kind, extra=()):
    out = OUT[kind]
    attention = "softmax" if kind == "softmax" else "linear"
    # trained anew: train.py refuses to replace an earlier run's checkpoint
    shutil.rmtree(os.path.join(ROOT, out), ignore_errors=True)
    t0 = time.perf_counter()
    run(
        [
            "train.py",
            "config/shakespeare_cpu.py",
            f"--out_dir={out}",
            f"--attention={attention}",
            *RECIPE,
            *extra,
        ]
    )
    wall = time.perf_counter() - t0
    last = read_evaluations(os.path.join(ROOT, out))[-1]
    text = run(["sample.py", f"--out_dir={out}", *SAMPLE]).split("\n" + "-" * 40 + "\n")[0]
    return dict(
        iters=last["iter"],
        train_s=last["elapsed_s"],
        wall_s=round(wall, 1),
        val_loss_full=last["val_loss_full"],
        sample=text,
        args=list(extra),
    )


def part_train(results):
    """The CPU recipe as the README runs it, softmax then linear, same iterations."""
    results["train"] = {kind: train_one(kind) for kind in ("softmax", "linear")}
    results["train"]["machine"] = machine()


LAYER_SHAPE = dict(
    n_layer=1, n_head=4, n_embd=128, rope=True, qk_norm=True, activation="relu2", bias=False
)


def layer_child(T, repeats, memory_of=None):
    """In a fresh process, one thread: one block of the CPU recipe's width, forward +
    backward at length T, float32, batch 1, softmax and linear taking turns; prints
    their median times. memory_of: run that kind once instead and print the peak
    resident memory the step added."""
    torch.set_num_threads(1)
    blocks = {}
    x = torch.randn(1, T, 128, requires_grad=True)
    for kind in ("softmax", "linear"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=T, vocab_size=65, attention=kind, **LAYER_SHAPE))
        blocks[kind] = model.transformer.h[0]
    rotary = rotary_tables(LAYER_SHAPE["n_embd"] // LAYER_SHAPE["n_head"], torch.arange(T))

    def step(kind):
        t0 = time.perf_counter()
        y = blocks[kind](x, rotary=rotary)
        y.sum().backward()
        x.grad = None
        blocks[kind].zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    if memory_of:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        step(memory_of)
        print(
            json.dumps(
                dict(peak_mb=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
            )
        )
        return
    times = {kind: [] for kind in blocks}
    for i in range(repeats + 1):
        for kind in ("softmax", "linear") if i % 2 else ("linear", "softmax"):
            dt = step(kind)
            if i:  # the first round warms up
                times[kind].append(dt)
    print(json.dumps({kind: dict(ms=1000 * sorted(t)[len(t) // 2]) for kind, t in times.items()}))


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def part_layer(results):
    rows = []
    for T in (1024, 4096, 16384):
        load = loadavg()
        script = os.path.join("experiments", "linear_attention.py")
        row = dict(
            T=T, **json.loads(run([script, "layer-child", str(T), "7" if T <= 4096 else "3"]))
        )
        for kind in ("softmax", "linear"):
            row[kind].update(json.loads(run([script, "layer-child", str(T), "0", kind])))
        row["load"] = [load, loadavg()]
        rows.append(row)
        print(row, file=sys.stderr)
    results["layer"] = dict(
        rows=rows,
        shape=LAYER_SHAPE,
        machine=machine(),
        threads=1,
        softmax_kernel="F.scaled_dot_product_attention (is_causal)",
    )


def decode_rate(model, n_new, prompt_len=8):
    """Tokens/s generating n_new greedy tokens after a prompt, at batch 1, and the
    tokens/s of each tenth of the run."""
    idx = torch.randint(
        0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0)
    )
    marks = []
    t0 = time.perf_counter()
    stream = engine.stream(model, idx, n_new, temperature=0)
    for i, _ in enumerate(stream):
        if (i + 1) % (n_new // 10) == 0:
            marks.append(time.perf_counter())
    total = time.perf_counter() - t0
    tenths = [n_new // 10 / (b - a) for a, b in zip([t0] + marks[:-1], marks)]
    return dict(tokens_per_s=n_new / total, tenths=[round(r) for r in tenths])


def part_decode(results):
    """Generation past block_size with rope: softmax slides its window and rebuilds its
    KV cache; linear keeps its state and goes on. The trained models (block_size 64)
    and untrained ones of the same width at block_size 1024."""
    torch.set_num_threads(1)
    rows = []
    for block_size in (64, 1024):
        for kind in ("softmax", "linear"):
            torch.manual_seed(0)
            if block_size == 64:
                from support.loading import load_model

                model = load_model("", os.path.join(ROOT, OUT[kind]))[0]
            else:
                model = GPT(
                    GPTConfig(
                        block_size=block_size,
                        vocab_size=65,
                        attention=kind,
                        **dict(LAYER_SHAPE, n_layer=4),
                    )
                )
            model.eval()
            rate = decode_rate(model, 10 * block_size)
            rows.append(
                dict(
                    block_size=block_size,
                    kind=kind,
                    new_tokens=10 * block_size,
                    cache_bytes=model.make_kv_cache(1).nbytes,
                    **rate,
                )
            )
            print(rows[-1], file=sys.stderr)
    results["decode"] = dict(rows=rows, machine=machine(), threads=1)


def part_context(results):
    """Decoding speed against how much context there is: untrained models of the same
    shape with block_size 17,408, a prompt of P tokens, then 200 greedy tokens timed
    alone (the prompt's forward left out). Softmax attends over all P keys each step;
    linear reads its fixed-size state."""
    torch.set_num_threads(1)
    rows = []
    for P in (1024, 4096, 16384):
        row = dict(P=P)
        for kind in ("softmax", "linear"):
            torch.manual_seed(0)
            model = GPT(
                GPTConfig(
                    block_size=17408, vocab_size=65, attention=kind, **dict(LAYER_SHAPE, n_layer=4)
                )
            )
            idx = torch.randint(0, 65, (1, P), generator=torch.Generator().manual_seed(0))
            stream = engine.stream(model.eval(), idx, 201, temperature=0)
            next(stream)  # the prompt's forward
            t0 = time.perf_counter()
            for _ in stream:
                pass
            row[kind] = 200 / (time.perf_counter() - t0)
        rows.append(row)
        print(row, file=sys.stderr)
    results["context"] = dict(rows=rows, machine=machine(), threads=1)


def part_heads(results):
    for kind in ("softmax", "linear"):
        run(["heads.py", f"--out_dir={OUT[kind]}", "--seed=7"])
    collect_heads(results)


def collect_heads(results):
    out = {}
    for kind in ("softmax", "linear"):
        with open(os.path.join(ROOT, OUT[kind], "heads", "heads.json")) as f:
            rep = json.load(f)
        out[kind] = dict(
            baseline_loss=rep["baseline_loss"],
            heads=[
                dict(
                    layer=h["layer"],
                    head=h["head"],
                    label=h["label"],
                    cost=h["ablation_nats"],
                    entropy=h["entropy"],
                    diagonal=h["scores"]["diagonal"],
                    previous=h["previous_weight"],
                )
                for h in rep["heads"]
            ],
        )
    results["heads"] = out


def heads_table(rep):
    layers = sorted({h["layer"] for h in rep["heads"]})
    n = max(h["head"] for h in rep["heads"]) + 1
    lines = [
        "| layer | " + " | ".join(f"head {i}" for i in range(n)) + " |",
        "|---" * (n + 1) + "|",
    ]
    for layer in layers:
        cells = [f"{h['label']} {h['cost']:+.3f}" for h in rep["heads"] if h["layer"] == layer]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def part_report(results):
    """The page, from the figures the other parts measured."""
    missing = [k for k in ("train", "layer", "decode", "context", "heads") if k not in results]
    if missing:
        raise ConfigError(
            f"no figures of {', '.join(missing)} in linear_attention.json yet: run those "
            "parts first, with the same --out_dir (docs for the shipped figures)"
        )
    tr, lay, dec, hd = (results[k] for k in ("train", "layer", "decode", "heads"))
    soft, lin = tr["softmax"], tr["linear"]
    gap = lin["val_loss_full"] - soft["val_loss_full"]
    ppl_s, ppl_l = math.exp(soft["val_loss_full"]), math.exp(lin["val_loss_full"])
    layer_rows = "\n".join(
        f"| {r['T']:,} | {r['softmax']['ms']:,.0f} | {r['linear']['ms']:,.0f} | "
        f"**{r['softmax']['ms'] / r['linear']['ms']:.2f}x** | {r['softmax']['peak_mb']:.0f} | "
        f"{r['linear']['peak_mb']:.0f} |"
        for r in lay["rows"]
    )

    def growth(kind):
        pairs = zip(lay["rows"], lay["rows"][1:])
        return " and ".join(f"{b[kind]['ms'] / a[kind]['ms']:.1f}x" for a, b in pairs)

    by = {(r["block_size"], r["kind"]): r for r in dec["rows"]}
    decode_rows = "\n".join(
        f"| {r['block_size']:,} | {r['kind']} | {r['new_tokens']:,} | {r['tokens_per_s']:,.0f} | "
        f"{min(r['tenths']):,}-{max(r['tenths']):,} | {r['cache_bytes']:,} |"
        for r in dec["rows"]
    )

    def ratio(bs):
        return by[(bs, "linear")]["tokens_per_s"] / by[(bs, "softmax")]["tokens_per_s"]

    def mem(bs):
        return by[(bs, "softmax")]["cache_bytes"] / by[(bs, "linear")]["cache_bytes"]

    m = tr["machine"]
    ctx = results["context"]
    context_rows = "\n".join(
        f"| {r['P']:,} | {r['softmax']:.0f} | {r['linear']:.0f} "
        f"| **{r['linear'] / r['softmax']:.1f}x** |"
        for r in ctx["rows"]
    )

    def mean(kind, key):
        return sum(h[key] for h in hd[kind]["heads"]) / len(hd[kind]["heads"])

    def top(kind, key):
        return max(h[key] for h in hd[kind]["heads"])

    def total(kind):
        return sum(h["cost"] for h in hd[kind]["heads"])

    def maxcost(kind):
        return top(kind, "cost")

    from support.attention_maps import BAND

    rows = range(BAND + 1, 64)  # the rows heads.py scores, in windows of 64
    even = {
        key: sum(f(i + 1) for i in rows) / len(rows)
        for key, f in (
            ("entropy", math.log),
            ("diagonal", lambda n: (BAND + 1) / n),
            ("previous", lambda n: 1 / n),
        )
    }
    page = f"""# Linear attention

The attention lectures name linear attention among the answers to attention's
O(n²) cost: softmax attention scores every query against every key, so 1,000
tokens make a million scores and 100,000 tokens ten billion, and doubling the
context multiplies the work by four. Linear attention approximates the softmax
with a kernel, and its cost grows as n. `GPTConfig.attention = "linear"`
(`--attention=linear` for `train.py`) gives this project's model the version of
Katharopoulos et al., *Transformers are RNNs* (ICML 2020, arXiv:2006.16236).
This page measures what it buys on a CPU and what it costs in quality. It is
written by `python -m experiments.linear_attention report --out_dir=docs` from the
figures the other parts of that script measure (`docs/linear_attention.json`).

## What the option does

The score exp(q·k/√d) becomes φ(q)·φ(k), with φ(x) = elu(x) + 1, which is
positive, so every weight stays positive and each row still sums to 1 after
normalising. Because φ(q_i) factors out of the sum over keys,

    y_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i,   S_i = Σ_(j≤i) φ(k_j) v_jᵀ,   z_i = Σ_(j≤i) φ(k_j)

and S (hs × hs per head) and z (hs per head) are all a position needs of the
positions before it: a recurrent state of fixed size, where softmax keeps every
key and value. In `model.py` this is `linear_attention`, beside the softmax
`attention`:

- **Training** uses the chunked form: within a chunk of 64 positions the masked
  quadratic form φ(Q) φ(K)ᵀ ⊙ mask, between chunks the running state, so time and
  memory grow as T·64 rather than T².
- **Generation** keeps a `LinearState` where softmax keeps a `KVCache`: per layer
  S (B, nh, hs, hs) and z (B, nh, hs), the same size at every position, with the
  interface the generation loop, `sample.py` and `bench/` use (`make_kv_cache`
  returns it). With rope, positions have no end, so generation never slides a
  window: the state goes on past `block_size`, the rotary angles of positions
  past the table computed when first needed. With learned positions the window
  slides as it does for softmax.
- **Inspection**: with `model.attention_maps` (one chunk, for short T) the implied
  weights φ(q_i)·φ(k_j) / φ(q_i)·z_i come back in the softmax maps' place, so
  `sample.py`'s pictures and `heads.py` work unchanged; `sample.py` takes the
  maps of a linear model from whole forwards, since its state keeps no keys to
  weigh.
- **Not supported**: GPT-2's weights (trained with softmax) with
  `attention="linear"`, and the compiled decode step (`support.engine`,
  `sample.py --compile`): each is refused with one line. Attention dropout has no
  weights to drop here; `dropout` still applies to the residual branches.

Rope rotates q and k before φ, so a linear model's scores depend on absolute
positions too, not only on their difference as softmax's do.

### Tests

`tests/test_linear_attention.py`, against oracles written independently:
the chunked form against the step-by-step recurrence (float64, in the test)
within 1e-5 in float32 for T = 150, 7 and 1 (not multiples of the chunk) and 64;
the state carried across calls, one token at a time, against the same
recurrence; the implied weights times V against the output and rows summing to
1; greedy generation with the state against the no-cache forward (rope, grouped
query heads, learned positions, which slide); a rope model generating 155
tokens past its `block_size` of 16 (10x) against one full forward of the same
weights in a model with `block_size` 256: same greedy tokens, log-probabilities
within 1e-4, the state's bytes unchanged; and `train.py --attention=linear`
writing a checkpoint that `sample.py` (with maps) and `heads.py` load.

## Quality: the CPU recipe, softmax against linear

`python train.py config/shakespeare_cpu.py` as the README ran it then (4 layers,
4 heads, 128 wide, context 64, rope, QK-norm, ReLU², Muon, 180 iters, bfloat16
autocast), and the same with `--attention=linear`. CPU: `{m["cpu_capability"]}`
(AMD EPYC Zen 5, 2 cores, avx512_bf16, no AMX), torch {m["torch"]}, {m["date"]};
the machine was shared with other work, so the times are good to about 10%. \
The same 180 iterations took the same training time, so
this is also the comparison at equal wall time.

| attention | iters | training s | wall s | whole-val loss | perplexity (per character) |
|---|---|---|---|---|---|
| softmax | {soft["iters"]} | {soft["train_s"]:.1f} | {soft["wall_s"]:.1f} \
| {soft["val_loss_full"]:.4f} | {ppl_s:.2f} |
| linear | {lin["iters"]} | {lin["train_s"]:.1f} | {lin["wall_s"]:.1f} \
| {lin["val_loss_full"]:.4f} | {ppl_l:.2f} |

The linear model trails by **{gap:.3f} nats** per character ({ppl_l - ppl_s:.2f}
perplexity points per character, {100 * (ppl_l / ppl_s - 1):.0f}% higher). The
published gap is of the same kind: earlier linear attentions trail softmax
by up to 6 perplexity points on WikiText-103 with causal GPTs (Zhang et al., *The
Hedgehog & the Porcupine*, ICLR 2024, arXiv:2402.04347, word-level perplexities
in the 20s, so not comparable number for number). Their diagnosis fits what
this model shows below: φ = elu + 1 cannot make the low-entropy, "spiky" weights
that softmax makes, so a head cannot look at exactly the previous character.
At context 64 linear attention is no faster either: one chunk covers the whole
window, so it does the same quadratic work as softmax, unfused.

`python sample.py --out_dir=... --prompt "ROMEO:" --seed=1337 --num_samples=1 --max_new_tokens=300`:

softmax:

```
{soft["sample"]}
```

linear:

```
{lin["sample"]}
```

## One layer, forward + backward, T = 1,024 to 16,384

One block of the recipe's width (128 wide, 4 heads of 32, rope, QK-norm, ReLU²
MLP), batch 1, float32, one thread, forward and backward; softmax through
`F.scaled_dot_product_attention` (PyTorch's fused CPU kernel, causal), linear
through the chunked form. The two take turns in each repeat (median of 7, of 3
at 16,384); the peak memory is the resident memory one step added, measured in
a fresh process. CPU: `{lay["machine"]["cpu_capability"]}` (Zen 5), load
average {lay["rows"][0]["load"][0]:.1f}-{lay["rows"][-1]["load"][1]:.1f}.

| T | softmax ms | linear ms | linear's speed-up | softmax peak MB | linear peak MB |
|---|---|---|---|---|---|
{layer_rows}

Each quadrupling of T multiplies softmax's time by {growth("softmax")}
(towards 16x: the scores are T²) and linear's by {growth("linear")} (4x: linear).
Memory grows linearly for both: the fused softmax kernel never stores the T × T
weights either (it recomputes them in tiles); the explicit `attention` path
would hold 4 × T² floats per layer, 4.3 GB at T = 16,384. The linear form keeps
a little more per position (each chunk's 64 × 64 scores and its state).

## Decoding past block_size

Greedy generation of 10 × block_size new tokens at batch 1, float32, one thread,
rope models: the two trained above (block_size 64), and untrained models of the
same shape with block_size 1024. Softmax slides its window when it is full,
dropping the oldest quarter and rebuilding its KV cache in one forward; linear
keeps its state and goes on. "per tenth" is the range of the rate over each
tenth of the run. CPU: `{dec["machine"]["cpu_capability"]}` (Zen 5), load
average {dec["machine"]["load"]:.1f}.

| block_size | attention | new tokens | tokens/s | tokens/s per tenth | cache bytes |
|---|---|---|---|---|---|
{decode_rows}

At this width the time of a decode step goes to launching small operators, not
to attention: 4 layers over at most 1,024 keys of 32 dimensions is little work,
and the linear step runs a dozen small operators per layer where softmax runs
one fused kernel. So linear decodes at {ratio(64):.2f}x softmax's rate at
block_size 64 and {ratio(1024):.2f}x at 1024, and neither rate falls along the
run. What it saves at these sizes is memory: its state is {mem(64):.1f}x smaller
than the KV cache at block_size 64 and {mem(1024):.0f}x at 1024
({by[(1024, "linear")]["cache_bytes"]:,} bytes at any length, against 2 × layers ×
block_size × C floats). The softmax model's context is the last block_size
tokens; the linear model's state sums up everything since the prompt, in fixed
memory, so it keeps the distant past only as well as hs × hs numbers per head
can.

Where the context is long, the time per step parts ways. The same shape with
block_size 17,408, untrained, after a prompt of P tokens, 200 greedy tokens
timed alone (`python -m experiments.linear_attention context`; one thread, float32,
load average {ctx["machine"]["load"]:.1f}):

| context P | softmax tokens/s | linear tokens/s | linear / softmax |
|---|---|---|---|
{context_rows}

A softmax step attends over all P cached keys, so its rate falls as P grows; the
linear step reads the same state whatever P is.

## The heads, softmax against linear

`python heads.py --out_dir=... --seed=7` on both models: each cell is the head's
label (the rule of [heads.md](heads.md)), then the rise of the whole-val loss
when the head's output is zeroed.

softmax (whole-val loss {hd["softmax"]["baseline_loss"]:.3f}):

{heads_table(hd["softmax"])}

linear (whole-val loss {hd["linear"]["baseline_loss"]:.3f}):

{heads_table(hd["linear"])}

| over all 16 heads | softmax | linear | even attention |
|---|---|---|---|
| mean entropy of a row (nats) \
| {mean("softmax", "entropy"):.2f} | {mean("linear", "entropy"):.2f} | {even["entropy"]:.2f} |
| mean weight on the diagonal (the query and the 3 keys before it) \
| {mean("softmax", "diagonal"):.3f} | {mean("linear", "diagonal"):.3f} \
| {even["diagonal"]:.3f} |
| largest weight on the previous token, any head \
| {top("softmax", "previous"):.3f} | {top("linear", "previous"):.3f} | {even["previous"]:.3f} |
| all 16 ablation costs added (nats) | {total("softmax"):.3f} | {total("linear"):.3f} | |

Every linear head is `broad`: its rows are about as flat as even attention over
the keys a query can see, where the softmax model's heads are `band` heads that
put half their weight on the last few characters and up to
{top("softmax", "previous"):.2f} on the previous one. The same heads matter less
to the linear model (zeroing any one costs at most {maxcost("linear"):.3f} nats,
against {maxcost("softmax"):.3f}): with flat weights, a head passes on an average
of its context, which the other heads largely carry too. This is the missing
spikiness the Hedgehog paper describes, seen in this model's own maps.

Layer 0 of the linear model over the prompt "ROMEO:" and 58 generated
characters (`sample.py --seed=1337 --max_new_tokens=58`); a softmax model's
layer 0 (the half-minute CPU recipe's, 3 layers), with its bright diagonals,
is [shakespeare_cpu_layer_0.png](shakespeare_cpu_layer_0.png):

![layer 0 of the linear model: every row spread evenly over the keys](linear_attention_layer_0.png)

## Reproduce

```sh
export TINYSHAKESPEARE_PATH=/path/to/input.txt
# trains both models into out-la-softmax/ and out-la-linear/
python -m experiments.linear_attention train --out_dir=docs
python -m experiments.linear_attention layer --out_dir=docs
python -m experiments.linear_attention decode --out_dir=docs
python -m experiments.linear_attention context --out_dir=docs
python -m experiments.linear_attention heads --out_dir=docs
python -m experiments.linear_attention report --out_dir=docs
python sample.py --out_dir=out-la-linear --prompt "ROMEO:" --seed=1337 --num_samples=1 \\
    --max_new_tokens=58 --attn_dir=/tmp/maps   # /tmp/maps/layer_0.png is the picture
```
"""
    return page


PARTS = {
    "train": part_train,
    "context": part_context,
    "layer": part_layer,
    "decode": part_decode,
    "heads": part_heads,
    "report": part_report,
}


@dataclasses.dataclass
class Settings:
    part: str = ""  # train, context, layer, decode, heads or report
    # the figures' folder: their JSON, and the page report writes
    out_dir: str = os.path.join(SCRATCH, "linear_attention")  # --out_dir=docs: the shipped figures


def main(cfg):
    if cfg.part not in PARTS:
        raise ConfigError(f"give one of {', '.join(PARTS)}: the part to run")
    cli.output_folder(cfg.out_dir)
    path = os.path.join(cfg.out_dir, "linear_attention.json")
    results = load(path)
    if cfg.part == "report":
        with open(os.path.join(cfg.out_dir, "linear_attention.md"), "w") as f:
            f.write(part_report(results))
        return
    PARTS[cfg.part](results)
    save(results, path)


if __name__ == "__main__":
    # the layer part's own child process: one T, timed alone (part_layer)
    if sys.argv[1:2] == ["layer-child"]:
        layer_child(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
    else:
        sys.exit(cli.run(main, sys.argv[1:], __doc__, Settings, positional="part"))
