"""
How live is the attention explorer? The answer time of POST /api/analyze for a
64-token prompt with one head switched off, on the CPU recipe's model, through
a real server on localhost, and where that time goes; then what "why this
token?" and the training timeline cost.

    python train.py config/shakespeare_cpu.py --out_dir=out-shakespeare-char-cpu
    python -m bench.explore --out_dir=out-shakespeare-char-cpu

An analysis with heads off runs the model twice (ablated, then intact), each
time one forward with the attention maps and a 20-token greedy continuation;
the induction probe runs once per set of heads off (the explorer keeps it:
it does not depend on the prompt); then labels and JSON. Each part is
timed alone, and the whole against the peer every analysis needs: one plain
forward of the same prompt, measured in the same run. The CPU's class is named
(torch's capability, and whether it multiplies bfloat16 natively).

Then, each against a peer timed in the same run:
  - analyze with the logit lens and the attribution against the same analysis
    without them (the Explorer with lens() and attributions() answering nothing;
    the recording hooks, microseconds, run in both), through the server,
    alternated (goal: <= 1.3x);
  - POST /api/patch over every head on the 64-token prompt (goal: <= 0.5 s), and
    interpret.patch_heads on a GPT-2-shaped model with random weights (12 layers,
    12 heads, 768 wide) at 32 tokens (goal: <= 5 s), each beside one plain forward;
  - --log_heads: the probe at an evaluation against the recipe's training step
    (train.py's own train_step, its settings), times the evaluations of the run in
    --out_dir's log (goal: <= 5% of the training time);
  - --snapshots: one snapshot's size, times those evaluations, and the snapshots
    --out_dir holds (goal: <= 10 MB in all).

The CPU's class comes from bench/common.py, as for every benchmark.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
import torch

from bench import common
from explorer import interpret
from explorer.server import SEED, Explorer, ExplorerServer
from model import GPT, GPTConfig
from support import attention_maps, cli, head_measures, timeline
from support.checkpoint import checkpoint_path
from support.loading import load_model
from support.settings import Settings as TrainSettings


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-shakespeare-char-cpu"  # the CPU recipe's checkpoint
    init_from: str = ""  # or a checkpoint folder, or a Hugging Face GPT-2 folder
    threads: int = 2  # torch's CPU threads
    tokens: int = 64  # the prompt's length
    repeats: int = 20  # timed runs of each part; the median is reported
    gpt2: bool = True  # also patch every head of a GPT-2-shaped random model (about a minute)
    # the recipe whose training step --log_heads is against
    config: str = "config/shakespeare_cpu.py"


TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\n"
    "It is the east, and Juliet is the sun.\nArise, fair sun, and kill the envious moon,\n"
    "Who is already sick and pale with grief.\n"
)


def median_ms(fn, repeats):
    fn()  # warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def post(port, body, path="/api/analyze"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status != 200:
        raise SystemExit(f"error: the explorer answered {response.status}: {data[:200]!r}")
    return data


def main(cfg):
    torch.set_num_threads(cfg.threads)
    model, tok, _ = load_model(cfg.init_from, cfg.out_dir)
    model.eval()
    explorer = Explorer(model, tok)
    c = model.config
    ids = tok.encode(TEXT * 20)[: min(cfg.tokens, c.block_size)]
    prompt = tok.decode(ids)
    heads = [[c.n_layer - 1, 0]]
    body = {"prompt": prompt, "ablate": heads}
    idx = torch.tensor([ids])
    n = cfg.repeats

    server = ExplorerServer(explorer, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    answer = json.loads(post(server.server_port, body))
    layers = [np.asarray(a, dtype=np.float32) for a in answer["attention"]]
    strings = answer["tokens"]

    def forward():
        with torch.no_grad():
            model(idx)

    def forward_maps():
        with torch.no_grad(), head_measures.ablated(model, heads):
            model.attention_maps(idx)

    def continuation():
        with torch.no_grad(), head_measures.ablated(model, heads):
            explorer.greedy(idx, 20)

    def probe():
        with head_measures.ablated(model, heads):
            head_measures.induction_scores(model, SEED)

    def labels():
        attention_maps.all_head_stats(layers, strings)

    def to_json():
        json.dumps([np.round(a, 6).tolist() for a in layers])

    def new_heads_off():
        explorer.probes = {(): explorer.probes[()]}
        explorer.analyze(body)

    parts = {
        "one plain forward (the peer)": forward,
        "forward with attention maps": forward_maps,
        "greedy continuation, 20 tokens": continuation,
        "induction probe, heads off": probe,
        "labels of every head": labels,
        "attention maps to JSON": to_json,
        "analyze, in the process": lambda: explorer.analyze(body),
        "analyze, through HTTP": lambda: post(server.server_port, body),
        "analyze, a set of heads off anew": new_heads_off,
    }
    times = {name: median_ms(fn, n) for name, fn in parts.items()}
    server.shutdown()
    server.server_close()

    peer = times["one plain forward (the peer)"]
    print(f"cpu: {common.cpu_class()}")
    print(
        f"model: {c.n_layer} layers x {c.n_head} heads, {c.n_embd} wide, float32; "
        f"prompt {len(ids)} tokens; heads off {heads}; {cfg.threads} threads; "
        f"median of {n}; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'part':<36} {'ms':>8} {'x forward':>10}  per analysis")
    per_analysis = {
        "forward with attention maps": 2,
        "greedy continuation, 20 tokens": 2,
        "induction probe, heads off": 0,
        "labels of every head": 2,
        "attention maps to JSON": 2,
    }
    for name, ms in times.items():
        count = per_analysis.get(name, 1)
        print(f"{name:<36} {ms:8.2f} {ms / peer:10.1f}  x{count}")
    print()
    why(model, tok, body, n)
    print()
    patching(model, tok, ids, n, cfg.gpt2)
    print()
    log_heads_cost(model, tok, cfg)


class WithoutWhy(Explorer):
    """The analysis as it was before the logit lens and the attribution."""

    def lens(self, trace):
        return []

    def attributions(self, trace, logits, ids, attribute):
        return {}


def serve(explorer):
    server = ExplorerServer(explorer, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def why(model, tok, body, repeats):
    """analyze through the server with and without the lens and attribution, alternated."""
    servers = {"with": serve(Explorer(model, tok)), "without": serve(WithoutWhy(model, tok))}
    fns = {name: (lambda s=s: post(s.server_port, body)) for name, s in servers.items()}
    for fn in fns.values():
        fn()  # warm up
    times = common.alternate(fns, repeats, 1, "cpu")
    sizes = {name: len(fn()) for name, fn in fns.items()}
    for s in servers.values():
        s.shutdown()
        s.server_close()
    ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
    print("analyze through the server, alternated (median ms; answer size):")
    for name in ("without", "with"):
        print(
            f"  {name} the logit lens and the attribution: {ms[name]:8.2f}  {sizes[name]:,} bytes"
        )
    print(f"  ratio: {ms['with'] / ms['without']:.3f}x (goal <= 1.3x)")


def patching(model, tok, ids, repeats, gpt2):
    """POST /api/patch over every head of the recipe's model; patch_heads on a GPT-2-shaped
    random model at 32 tokens; each beside one plain forward of its prompt."""
    text = tok.encode(TEXT * 20)
    corrupt = text[len(ids) : 2 * len(ids)]
    idx = torch.tensor([ids])
    with torch.no_grad():
        top = torch.topk(model(idx)[0][0, -1], 2).indices.tolist()
    body = {"clean": tok.decode(ids), "corrupt": tok.decode(corrupt), "target": top[0]}
    body["foil"] = top[1]
    server = serve(Explorer(model, tok))
    ms = median_ms(lambda: post(server.server_port, body, "/api/patch"), repeats)
    server.shutdown()
    server.server_close()
    peer = median_ms(lambda: plain_forward(model, idx), repeats)
    c = model.config
    print(
        f"POST /api/patch, every head ({c.n_layer} x {c.n_head}), {len(ids)} tokens, through "
        f"the server: {ms:.1f} ms = {ms / peer:.1f} plain forwards ({peer:.2f} ms) (goal <= 500 ms)"
    )
    if not gpt2:
        return
    torch.manual_seed(0)
    big = GPT(GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257)).eval()
    clean = torch.randint(50257, (1, 32))
    other = torch.randint(50257, (1, 32))
    times = common.alternate(
        {
            "patch": lambda: interpret.patch_heads(big, clean, other, 1, 2),
            "forward": lambda: plain_forward(big, clean),
        },
        3,
        1,
        "cpu",
    )
    patch_s = statistics.median(times["patch"])
    forward_s = statistics.median(times["forward"])
    # the processor time of this process: on a busy machine, nearer what idle cores would take
    cpu_start = time.process_time()
    interpret.patch_heads(big, clean, other, 1, 2)
    cpu_s = time.process_time() - cpu_start
    print(
        f"patch_heads, GPT-2 shaped (12 x 12, 768 wide, random weights), 32 tokens, 144 heads: "
        f"{patch_s:.2f} s = {patch_s / forward_s:.1f} plain forwards ({1000 * forward_s:.0f} ms); "
        f"{cpu_s:.2f} s of processor time on {torch.get_num_threads()} threads (goal <= 5 s)"
    )


def plain_forward(model, idx):
    with torch.no_grad():
        model(idx)


def log_heads_cost(model, tok, cfg):
    """The probe of --log_heads against train.py's training step on the recipe, and the
    snapshots' size, scaled to the evaluations of the run in --out_dir."""
    import train

    folder = tempfile.mkdtemp(prefix="bench-explore-")
    settings = train.get_config([cfg.config, f"--out_dir={folder}", "--device=cpu"])
    run = train.setup(settings)
    val = run.splits["val"]
    tokens = timeline.probe_text(val, timeline.PROBE_WINDOWS * timeline.PROBE_LENGTH + 1)
    lr = settings.learning_rate

    def step():
        train.set_lr(run.optimizers, lr)
        x, y = train.next_batch(run)
        train.forward_backward(run, x, y, before=None)  # no stop signal reaches it here
        train.clip_gradients(run)
        train.optimizer_step(run)

    fns = {
        "step": step,
        "probe": lambda: timeline.head_probe(run.raw, tok, tokens),
    }
    for fn in fns.values():
        fn()  # warm up
    times = common.alternate(fns, 5, 1, "cpu")
    step_s = statistics.median(times["step"])
    probe_s = statistics.median(times["probe"])
    source = cfg.init_from or cfg.out_dir
    evaluations = len(timeline.logged_iters(source)) or 1
    n_iters = settings.max_iters
    share = evaluations * probe_s / (n_iters * step_s)
    print(
        f"--log_heads: the probe {1000 * probe_s:.1f} ms per evaluation; a training step of "
        f"{cfg.config} {1000 * step_s:.1f} ms ({run.dtype}); {evaluations} evaluation(s) "
        f"(the log in {source}) over {n_iters} iters: {100 * share:.2f}% of the training time "
        "(goal <= 5%)"
    )
    limit = settings.snapshot_limit
    timeline.write_snapshot(TrainSettings(out_dir=folder), model, {"tokenizer": tok.describe()}, 0)
    one = os.path.getsize(timeline.snapshot_path(folder, 0))
    held = sum(os.path.getsize(p) for p in timeline.list_snapshots(source).values())
    # the snapshots those evaluations keep: the logged iters, their interval the smallest gap
    logged = sorted(timeline.logged_iters(source)) or [settings.max_iters]
    interval = min([b - a for a, b in zip(logged, logged[1:])] or [logged[0] or 1])
    kept = len(timeline.kept_snapshots(set(logged), logged[-1], limit, interval))
    print(
        f"--snapshots: {one / 1e6:.2f} MB each (ckpt.pt: "
        f"{os.path.getsize(checkpoint_path(source)) / 1e6:.2f} MB); {evaluations} evaluation(s) "
        f"keep {kept} at {cfg.config}'s snapshot_limit={limit}: {kept * one / 1e6:.1f} MB; "
        f"{source}/snapshots holds {held / 1e6:.1f} MB (goal <= 10 MB)"
    )
    shutil.rmtree(folder)


if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], __doc__, Settings))
