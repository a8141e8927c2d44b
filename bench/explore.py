"""
How live is the attention explorer? The answer time of POST /api/analyze for a
64-token prompt with one head switched off, on the CPU recipe's model, through
a real server on localhost, and where that time goes.

    python train.py config/shakespeare_cpu.py --out_dir=out-shakespeare-char-cpu
    python -m bench.explore --out_dir=out-shakespeare-char-cpu

An analysis with heads off runs the model twice (ablated, then intact), each
time one forward with the attention maps and a 20-token greedy continuation;
the induction probe runs once per set of heads off (the explorer keeps it:
it does not depend on the prompt); then labels and JSON. Each part is
timed alone, and the whole against the peer every analysis needs: one plain
forward of the same prompt, measured in the same run. The CPU's class is named
(torch's capability, and whether it multiplies bfloat16 natively).

The CPU's class comes from bench/common.py, as for every benchmark.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import http.client
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
import torch

from bench import common
from support import attention_maps, cli, head_measures
from support.explorer import SEED, Explorer, ExplorerServer
from support.loading import load_model

DEFAULTS = dict(
    out_dir="out-shakespeare-char-cpu",  # the CPU recipe's checkpoint
    init_from="",  # or a checkpoint folder, or a Hugging Face GPT-2 folder
    threads=2,  # torch's CPU threads
    tokens=64,  # the prompt's length
    repeats=20,  # timed runs of each part; the median is reported
)

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


def post(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/api/analyze", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.status != 200:
        raise SystemExit(f"error: the explorer answered {response.status}: {data[:200]!r}")
    return data


def main(cfg):
    torch.set_num_threads(cfg["threads"])
    model, tok, _ = load_model(cfg)
    model.eval()
    explorer = Explorer(model, tok)
    c = model.config
    ids = tok.encode(TEXT * 20)[: min(cfg["tokens"], c.block_size)]
    prompt = tok.decode(ids)
    heads = [[c.n_layer - 1, 0]]
    body = {"prompt": prompt, "ablate": heads}
    idx = torch.tensor([ids])
    n = cfg["repeats"]

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
        f"prompt {len(ids)} tokens; heads off {heads}; {cfg['threads']} threads; "
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


if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], __doc__, DEFAULTS))
