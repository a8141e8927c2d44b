"""Linear attention against softmax attention: the figures of docs/linear_attention.md.

Each part measures one thing and adds it to docs/linear_attention.json; `report`
turns that file into docs/linear_attention.md. Run the timed parts one at a
time on an otherwise quiet machine (the figures are ratios against softmax
measured in the same run, but a busy machine still moves them):

    python docs/linear_attention.py train      # config/shakespeare_cpu.py, both kinds (~2 min)
    python docs/linear_attention.py equal      # the linear model again, at the softmax run's time
    python docs/linear_attention.py layer      # one layer, forward + backward, T = 1024 .. 16384
    python docs/linear_attention.py decode     # generating 10 x block_size tokens
    python docs/linear_attention.py heads      # heads.py on both trained models
    python docs/linear_attention.py report     # writes docs/linear_attention.md

The corpus: set TINYSHAKESPEARE_PATH, as for train.py.
"""

import json
import os
import platform
import resource
import subprocess
import sys
import time

import torch

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)

from model import GPT, GPTConfig  # noqa: E402

RESULTS = os.path.join(DOCS, "linear_attention.json")
OUT = {"softmax": "out-la-softmax", "linear": "out-la-linear", "linear_equal": "out-la-linear-equal"}
SAMPLE = ["--prompt=ROMEO:", "--seed=1337", "--num_samples=1", "--max_new_tokens=300", "--attn_dir="]


def load():
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            return json.load(f)
    return {}


def save(results):
    with open(RESULTS, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
        f.write("\n")


def machine():
    return dict(cpu_capability=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads(),
                torch=torch.__version__, processor=platform.processor() or platform.machine(),
                date=time.strftime("%Y-%m-%d"), load=loadavg())


def run(args):
    """A command from the repo root; its stdout."""
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def train_one(kind, extra=()):
    out = OUT[kind]
    attention = "softmax" if kind == "softmax" else "linear"
    t0 = time.perf_counter()
    run(["train.py", "config/shakespeare_cpu.py", f"--out_dir={out}", f"--attention={attention}", *extra])
    wall = time.perf_counter() - t0
    with open(os.path.join(ROOT, out, "log.jsonl")) as f:
        last = [json.loads(line) for line in f][-1]
    text = run(["sample.py", f"--out_dir={out}", *SAMPLE]).split("\n" + "-" * 40 + "\n")[0]
    return dict(iters=last["iter"], train_s=last["elapsed_s"], wall_s=round(wall, 1),
                val_loss_full=last["val_loss_full"], sample=text, args=list(extra))


def part_train(results):
    """The CPU recipe as the README runs it, softmax then linear, same iterations."""
    results["train"] = {kind: train_one(kind) for kind in ("softmax", "linear")}
    results["train"]["machine"] = machine()


def part_equal(results):
    """The linear model trained for the softmax run's training time: the iterations
    (and the learning-rate schedule with them) scaled by the ratio of step times."""
    soft, lin = results["train"]["softmax"], results["train"]["linear"]
    iters = round(soft["iters"] * soft["train_s"] / lin["train_s"])
    results["equal"] = train_one("linear_equal", [f"--max_iters={iters}", f"--lr_decay_iters={iters}",
                                                  f"--eval_interval={iters}"])


LAYER_SHAPE = dict(n_layer=1, n_head=4, n_embd=128, rope=True, qk_norm=True, activation="relu2", bias=False)


def layer_child(T, repeats, memory_of=None):
    """In a fresh process, one thread: one block of the CPU recipe's width, forward +
    backward at length T, float32, batch 1, softmax and linear taking turns; prints
    their median times. memory_of: run that kind once instead and print the peak
    resident memory the step added."""
    torch.set_num_threads(1)
    blocks, x = {}, torch.randn(1, T, 128, requires_grad=True)
    for kind in ("softmax", "linear"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(block_size=T, vocab_size=65, attention=kind, **LAYER_SHAPE))
        blocks[kind] = model.transformer.h[0]
    rotary = (model.rotary_cos[:T], model.rotary_sin[:T])

    def step(kind):
        t0 = time.perf_counter()
        y, _ = blocks[kind](x, rotary=rotary)
        y.sum().backward()
        x.grad = None
        blocks[kind].zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    if memory_of:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        step(memory_of)
        print(json.dumps(dict(peak_mb=(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)))
        return
    times = {kind: [] for kind in blocks}
    for i in range(repeats + 1):
        for kind in (("softmax", "linear") if i % 2 else ("linear", "softmax")):
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
        script = os.path.join("docs", "linear_attention.py")
        row = dict(T=T, **json.loads(run([script, "layer-child", str(T), "7" if T <= 4096 else "3"])))
        for kind in ("softmax", "linear"):
            row[kind].update(json.loads(run([script, "layer-child", str(T), "0", kind])))
        row["load"] = [load, loadavg()]
        rows.append(row)
        print(row, file=sys.stderr)
    results["layer"] = dict(rows=rows, shape=LAYER_SHAPE, machine=machine(), threads=1,
                            softmax_kernel="F.scaled_dot_product_attention (is_causal)")


def decode_rate(model, n_new, prompt_len=8):
    """Tokens/s generating n_new greedy tokens after a prompt, at batch 1, and the
    tokens/s of each tenth of the run."""
    idx = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    marks = []
    t0 = time.perf_counter()
    stream = model.generate_stream(idx, n_new, temperature=0)
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
                from sample import load_model
                model = load_model(dict(init_from=None, out_dir=os.path.join(ROOT, OUT[kind])))[0]
            else:
                model = GPT(GPTConfig(block_size=block_size, vocab_size=65, attention=kind,
                                      **dict(LAYER_SHAPE, n_layer=4)))
            model.eval()
            rate = decode_rate(model, 10 * block_size)
            rows.append(dict(block_size=block_size, kind=kind, new_tokens=10 * block_size,
                             cache_bytes=model.make_kv_cache(1).nbytes, **rate))
            print(rows[-1], file=sys.stderr)
    results["decode"] = dict(rows=rows, machine=machine(), threads=1)


def part_heads(results):
    out = {}
    for kind in ("softmax", "linear"):
        run(["heads.py", f"--out_dir={OUT[kind]}", "--seed=7"])
        with open(os.path.join(ROOT, OUT[kind], "heads", "heads.json")) as f:
            rep = json.load(f)
        out[kind] = dict(baseline_loss=rep["baseline_loss"],
                         heads=[dict(layer=h["layer"], head=h["head"], label=h["label"], cost=h["ablation_nats"])
                                for h in rep["heads"]])
    results["heads"] = out


def heads_table(rep):
    layers = sorted({h["layer"] for h in rep["heads"]})
    n = max(h["head"] for h in rep["heads"]) + 1
    lines = ["| layer | " + " | ".join(f"head {i}" for i in range(n)) + " |", "|---" * (n + 1) + "|"]
    for layer in layers:
        cells = [f"{h['label']} {h['cost']:+.3f}" for h in rep["heads"] if h["layer"] == layer]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def part_report(results):
    from string import Template
    with open(os.path.join(DOCS, "linear_attention.md.in")) as f:
        template = Template(f.read())
    tr, eq, lay, dec, hd = (results[k] for k in ("train", "equal", "layer", "decode", "heads"))
    s, l = tr["softmax"], tr["linear"]
    layer_rows = "\n".join(
        f"| {r['T']:,} | {r['softmax']['ms']:.0f} | {r['linear']['ms']:.0f} | "
        f"**{r['softmax']['ms'] / r['linear']['ms']:.2f}x** | {r['softmax']['peak_mb']:.0f} | "
        f"{r['linear']['peak_mb']:.0f} |" for r in lay["rows"])
    decode_rows = "\n".join(
        f"| {r['block_size']:,} | {r['kind']} | {r['new_tokens']:,} | {r['tokens_per_s']:.0f} | "
        f"{min(r['tenths'])}-{max(r['tenths'])} | {r['cache_bytes']:,} |" for r in dec["rows"])
    values = dict(
        cpu=tr["machine"]["cpu_capability"], torch=tr["machine"]["torch"], date=tr["machine"]["date"],
        s_loss=f"{s['val_loss_full']:.4f}", l_loss=f"{l['val_loss_full']:.4f}",
        e_loss=f"{eq['val_loss_full']:.4f}", s_iters=s["iters"], l_iters=l["iters"], e_iters=eq["iters"],
        s_train=f"{s['train_s']:.1f}", l_train=f"{l['train_s']:.1f}", e_train=f"{eq['train_s']:.1f}",
        s_wall=f"{s['wall_s']:.1f}", l_wall=f"{l['wall_s']:.1f}", e_wall=f"{eq['wall_s']:.1f}",
        gap=f"{l['val_loss_full'] - s['val_loss_full']:+.3f}", gap_equal=f"{eq['val_loss_full'] - s['val_loss_full']:+.3f}",
        ppl_s=f"{2.718281828 ** s['val_loss_full']:.2f}", ppl_l=f"{2.718281828 ** l['val_loss_full']:.2f}",
        ppl_e=f"{2.718281828 ** eq['val_loss_full']:.2f}",
        s_sample=s["sample"], l_sample=l["sample"], e_sample=eq["sample"],
        layer_rows=layer_rows, decode_rows=decode_rows,
        s_heads=heads_table(hd["softmax"]), l_heads=heads_table(hd["linear"]),
        s_base=f"{hd['softmax']['baseline_loss']:.3f}", l_base=f"{hd['linear']['baseline_loss']:.3f}")
    with open(os.path.join(DOCS, "linear_attention.md"), "w") as f:
        f.write(template.substitute(values))


PARTS = {"train": part_train, "equal": part_equal, "layer": part_layer, "decode": part_decode,
         "heads": part_heads, "report": part_report}

if __name__ == "__main__":
    if sys.argv[1:2] == ["layer-child"]:
        layer_child(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
    elif len(sys.argv) == 2 and sys.argv[1] in PARTS:
        results = load()
        PARTS[sys.argv[1]](results)
        if sys.argv[1] != "report":
            save(results)
    else:
        sys.exit(f"usage: python docs/linear_attention.py {{{','.join(PARTS)}}}")
