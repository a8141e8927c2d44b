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
    --out_dir holds (goal: <= 10 MB in all);
  - live follow: a real train.py run of the recipe (--snapshots=True
    --log_heads=True) and a real explore.py over its folder, opened in headless
    Chromium: from each snapshot's write (its file's modification time: the last
    byte written, before fsync and the rename) to the page's slider holding it (a
    MutationObserver in the page stamps the moment), for every snapshot written
    after the page opened (goal: <= 2 s). `--live_only=True` runs this part alone
    (no trained model needed); --screenshot=PNG keeps the timeline view two
    thirds of the way through the run.

The CPU's class comes from bench/common.py, as for every benchmark.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import http.client
import json
import math
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from urllib.parse import urlencode

import numpy as np
import torch

from bench import common
from explorer import interpret
from explorer.server import SEED, Explorer, ExplorerServer
from model import GPT, GPTConfig
from support import attention_maps, cli, head_measures, timeline
from support.checkpoint import checkpoint_path
from support.loading import load_model
from support.run_log import read_evaluations
from support.settings import Settings as TrainSettings


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-shakespeare-char-cpu"  # the CPU recipe's checkpoint
    init_from: str = ""  # or a checkpoint folder, or a Hugging Face GPT-2 folder
    threads: int = min(2, os.cpu_count() or 1)  # torch's CPU threads
    tokens: int = 64  # the prompt's length
    repeats: int = 20  # timed runs of each part; the median is reported
    gpt2: bool = True  # also patch every head of a GPT-2-shaped random model (about a minute)
    # the recipe whose training step --log_heads is against
    config: str = "config/shakespeare_cpu.py"  # from the repository's folder, or absolute
    live: bool = True  # the live-follow latency: a training run watched in headless Chromium
    live_only: bool = False  # only that (no trained model needed)
    live_iters: int = 200  # the watched run's iters (the recipe's schedule, cut there) ...
    live_every: int = 10  # ... and its evaluations' interval: a snapshot each
    screenshot: str = ""  # a .png of the timeline view two thirds of the way through the run
    live_prompt: str = ""  # the page's prompt ("" = its example), in the run's tokenizer's alphabet


CHROMIUM = "/usr/bin/chromium"  # Debian's chromium and chromium-driver
CHROMEDRIVER = "/usr/bin/chromedriver"

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
    cli.check_threads(cfg.threads, least=1)
    torch.set_num_threads(cfg.threads)
    if cfg.live_only:
        live_follow(cfg)
        return
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
    if cfg.live:
        print()
        live_follow(cfg)


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
    recipe = os.path.join(REPO, cfg.config)
    settings = train.get_config([recipe, f"--out_dir={folder}", "--device=cpu"])
    run = train.setup(settings)
    val = run.splits["val"]
    tokens = timeline.probe_text(val, timeline.PROBE_WINDOWS * timeline.PROBE_LENGTH + 1)
    lr = settings.learning_rate

    def step():
        x, y = train.next_batch(run)
        train.forward_backward(run, x, y, before=None)  # no stop signal reaches it here
        train.optimizer_step(run, lr)

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


# -----------------------------------------------------------------------------
# Live follow: a snapshot's write to the open page

# stamps, in the page, the moment each step first reaches the slider (its max is set
# in the same task as the steps); the steps there at load are the page's first drawing
RECORDER = """
window.firstSeen = {};
window.atLoad = [...state.steps];
const mark = () => {
  for (const s of state.steps) if (!(s in window.firstSeen)) window.firstSeen[s] = Date.now();
};
mark();
new MutationObserver(mark).observe(document.getElementById("step"), {attributes: true});
"""


def read_log(run):
    """The evaluations of the run's log.jsonl, as the explorer reads them; none before
    train.py has made it."""
    try:
        return read_evaluations(run)
    except FileNotFoundError:
        return []


def headless_chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1500"):
        options.add_argument(arg)
    options.add_argument("--disable-background-networking")
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"error: {what} within {seconds} s")
        time.sleep(0.05)
    return value


def start_explorer(run):
    """explore.py over the run's folder as its own process, and its address."""
    child = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "explore.py"), f"--out_dir={run}", "--port=0"]
        + ["--threads=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in child.stdout:
        if line.startswith("explorer at "):
            return child, line.split()[2]
    raise SystemExit(f"error: explore.py did not start (exit {child.wait()})")


def live_follow(cfg):
    """The latency from each snapshot's write to the open page's slider holding it."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        print("live follow: skipped, needs chromium and chromium-driver (apt)")
        return
    # a kill ends the run's processes and its folder too (the finally below)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(f"stopped by signal {signum}"))
    print(f"cpu: {common.cpu_class()}")
    load_before = common.load_average()
    run = tempfile.mkdtemp(prefix="bench-live-")
    argv = [
        os.path.join(REPO, cfg.config),
        f"--out_dir={run}",
        f"--max_iters={cfg.live_iters}",
        f"--eval_interval={cfg.live_every}",
        "--eval_at_start=True",
        "--snapshots=True",
        "--log_heads=True",
        "--snapshot_limit=100000",  # none removed: each one's time is read at the end
    ]
    training = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "train.py"), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    driver = headless_chromium()
    explorer = None
    try:
        wait(lambda: timeline.list_snapshots(run), 600, "train.py wrote no snapshot")
        explorer, url = start_explorer(run)
        query = {"view": "timeline"}
        if cfg.live_prompt:
            query["prompt"] = cfg.live_prompt
        driver.get(f"{url}?{urlencode(query)}")
        script = "return state.result ? 'drawn' : document.getElementById('status').textContent"
        drawn = wait(lambda: driver.execute_script(script), 120, "the page drew nothing")
        if drawn != "drawn":
            raise SystemExit(f"error: the page says: {drawn} (pass a --live_prompt it can read)")
        driver.execute_script(RECORDER)
        shot = cfg.screenshot
        while training.poll() is None:
            logged = len(timeline.logged_iters(run))
            if shot and logged * cfg.live_every >= 2 * cfg.live_iters // 3:
                # the head of the highest induction score picked, drawn thick
                scores = np.array(read_log(run)[-1]["heads"]["induction"])
                layer, head = np.unravel_index(scores.argmax(), scores.shape)
                driver.execute_script(f"selectHead({layer}, {head})")
                time.sleep(1)  # the page's last poll, and the analysis it follows with
                driver.save_screenshot(shot)
                print(f"live follow: the timeline view at evaluation {logged}, in {shot}")
                shot = ""
            time.sleep(0.1)
        if training.returncode != 0:
            raise SystemExit(f"error: train.py {' '.join(argv)} failed ({training.returncode})")
        written = timeline.list_snapshots(run)
        script = "return state.steps.length === arguments[0]"
        wait(lambda: driver.execute_script(script, len(written)), 30, "the page missed snapshots")
        first_seen, at_load = driver.execute_script("return [window.firstSeen, window.atLoad]")
        latencies = [
            first_seen[str(step)] / 1000 - os.stat(path).st_mtime_ns / 1e9
            for step, path in written.items()
            if step not in at_load
        ]
    finally:
        driver.quit()
        if explorer is not None:
            explorer.terminate()
            explorer.wait()
        if training.poll() is None:
            training.kill()
            training.wait()
        shutil.rmtree(run)
    latencies.sort()
    ms = [1000 * x for x in latencies]
    # nearest rank: of 2 snapshots, the slower (int(0.9 * (n - 1)) gave the faster)
    p90 = ms[math.ceil(0.9 * len(ms)) - 1]
    print(
        f"live follow: {len(ms)} snapshots of {cfg.config} (every {cfg.live_every} of "
        f"{cfg.live_iters} iters) written while the page was open; from the write to the "
        f"slider: median {statistics.median(ms):.0f} ms, 90th percentile "
        f"{p90:.0f} ms, max {ms[-1]:.0f} ms (the page asks every "
        f"500 ms; goal <= 2000 ms); load average {load_before} before, "
        f"{common.load_average()} after"
    )


if __name__ == "__main__":
    sys.exit(cli.run(main, sys.argv[1:], __doc__, Settings))
