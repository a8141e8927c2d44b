import atexit
import contextlib
import copy
import hashlib
import importlib.util
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Before torch loads, as in every entry point: whether bfloat16 runs on this CPU
# (a child process tries it), with its fix applied (bf16_verdict.py). The verdict is
# cached in a folder of the session's own, so the tests see this machine as it
# is now; the train.py processes they start inherit the folder and the fix. The
# xdist workers, children of the first process, take its folder (one probe a run,
# one kernel cache); a pytest that a test starts is a session of its own.
SESSION_CACHE = "GPT_TESTS_CACHE"
owner, _, folder = os.environ.get(SESSION_CACHE, "").partition(":")
if owner != str(os.getppid()) or not os.path.isdir(folder):
    folder = tempfile.mkdtemp(prefix="gpt-tests-cache-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ[SESSION_CACHE] = f"{os.getpid()}:{folder}"
os.environ["XDG_CACHE_HOME"] = folder
# torch.compile's kernel cache of the session's own too: a graph another process
# cached under another CPU capability (ATEN_CPU_CAPABILITY=avx2, say) is keyed as
# if it were this one's, and read back at the wrong vector width it corrupts the
# heap (support/device.py, pin_cpu_vector_width)
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(os.environ["XDG_CACHE_HOME"], "inductor")
from support import bf16_verdict

if importlib.util.find_spec("torch") is None:
    sys.exit("the tests need the project's packages: pip install -r requirements-dev.txt")
BF16 = bf16_verdict.check_bf16()

import pytest
import torch

# every core: one worker per core, and the tests that start several busy processes alone
from cores import cores_alone, pytest_runtest_protocol, pytest_xdist_auto_num_workers  # noqa: F401
from forker import Forker
from stock_formula import pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401

from support.checkpoint import rng_state
from support.run_log import read_evaluations

# The files whose tests take longest (25-150 s each on two cores), longest first: the
# workers take whole files in collection order (pyproject.toml's --no-loadscope-reorder;
# xdist would order them by their number of tests), and one of these left to the end
# would keep one worker busy while the other has nothing left to do.
LONGEST_FIRST = [
    "test_precision.py",
    "test_gpu_path.py",
    "test_train.py",
    "test_bench.py",
    "test_corpus.py",
    "test_recipe_15min.py",
    "test_reliability.py",
    "test_sample.py",
    "test_model.py",
    "test_footprint.py",
    "test_data.py",
    "test_context_parallel.py",
]


def pytest_collection_modifyitems(config, items):
    """Tests marked bf16 run bfloat16 on the CPU: skipped where it would crash. The
    longest files first (LONGEST_FIRST), the rest in their order."""
    if not BF16["runs"]:
        skip = pytest.mark.skip(reason=f"bfloat16 does not run on this CPU: {BF16['why']}")
        for item in items:
            if "bf16" in item.keywords:
                item.add_marker(skip)

    def rank(item):
        name = item.path.name
        if name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order


# The corpus is never committed. The tests find it where the prepare scripts
# do (data/prepare.find_shakespeare), or in the folder beside the checkout.
BESIDE = os.path.join(os.path.dirname(ROOT), "shared", "data", "tinyshakespeare", "input.txt")


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


def find_corpus():
    """The path of tiny Shakespeare, or the run stops with one line saying where to put it."""
    from data import DataError
    from data.tiny_shakespeare import SHAKESPEARE_ENV, find_shakespeare, shakespeare_dir

    folder = shakespeare_dir("char")
    try:
        return find_shakespeare(folder, also=[BESIDE])
    except DataError as e:
        pytest.exit(
            f"the tests need tiny Shakespeare ({e.args[0].split(';')[0]}): put it at "
            f"{os.path.join(folder, 'input.txt')} or set {SHAKESPEARE_ENV}=PATH",
            returncode=2,
        )


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    """In the first process alone: a worker that stopped for the corpus would be
    reported as crashed, its line lost."""
    if not hasattr(session.config, "workerinput"):
        # its progress lines would stand beside pytest's own; a failure says it all
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            find_corpus()


@pytest.fixture(scope="session")
def corpus_path():
    return find_corpus()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory, corpus_path):
    """A folder of prepared datasets, tiny Shakespeare in characters; tests may add others."""
    from data.dataset import ensure_dataset

    root = str(tmp_path_factory.mktemp("data"))
    ensure_dataset("shakespeare_char", root, input_path=corpus_path)
    return root


@pytest.fixture
def float32_cuda_matmuls():
    """CUDA matmuls in full float32, as on the CPU, for the length of one test.

    torch.backends.cuda.matmul computes allow_tf32 in its __getattr__ rather than
    storing it, so monkeypatch.setattr cannot put it back (pytest 9 deletes what it
    thinks was never there). The switch is read, set and restored here instead."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The test models are tiny: a second thread only waits on the first, and on a
    busy machine spinning OpenMP threads make steps many times slower. Child
    processes get the same through OMP_NUM_THREADS=1 where tests set it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_char_model(text, block_size, steps, batch_size, data_chars=None):
    """A 2-layer, 64-wide character model trained for `steps` AdamW steps on text (its
    first data_chars characters), seeded, so the tests that need a trained checkpoint
    share one recipe. Returns a dict: model, tokenizer, config, optimizer, the batch
    generator and the last loss."""
    from data.tokenizer import build_tokenizer
    from model import GPT, GPTConfig

    tok = build_tokenizer("char", text)
    data = torch.tensor(tok.encode(text[:data_chars]), dtype=torch.long)
    torch.manual_seed(0)
    config = GPTConfig(
        block_size=block_size, vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=64
    )
    model = GPT(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
        x = torch.stack([data[i : i + block_size] for i in ix])
        y = torch.stack([data[i + 1 : i + block_size + 1] for i in ix])
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return dict(model=model, tok=tok, config=config, opt=opt, gen=gen, loss=loss.item())


def heads_zeroed(model, heads):
    """A copy of the model whose heads' columns of c_proj.weight are zero: the same as
    zeroing their slice of the attention output before W_O, done another way, the
    oracle of every ablation. heads: (layer, head) pairs."""
    edited = copy.deepcopy(model)
    hs = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        for layer, head in heads:
            edited.transformer.h[layer].attn.c_proj.weight[:, head * hs : (head + 1) * hs] = 0
    return edited


# -----------------------------------------------------------------------------
# The tiny training run of the tests that run train.py

# Small enough to train in seconds, in float32 on the CPU so that two runs compare
# exactly; a test changes the keys it is about (tiny_run's keyword arguments).
TINY_RUN = dict(
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=32,
    batch_size=8,
    gradient_accumulation_steps=1,
    device="cpu",
    compile=False,
    dtype="float32",
    eval_iters=2,
    log_interval=1,
    warmup_iters=2,
    learning_rate=3e-3,
    min_lr=3e-4,
    dropout=0.0,
    seed=7,
)


def tiny_run(data_root, out_dir, *extra, dataset="shakespeare_char", **keys):
    """train.py's arguments for TINY_RUN, with keys changed, on a dataset in
    data_root, writing into out_dir; extra arguments come last."""
    settings = dict(TINY_RUN, **keys)
    return [
        f"--dataset={dataset}",
        f"--data_root={data_root}",
        f"--out_dir={out_dir}",
        *[f"--{key}={value}" for key, value in settings.items()],
        *extra,
    ]


def tiny_settings(**keys):
    """TINY_RUN as train.py's Settings, with keys changed: for a test that builds
    a run's pieces itself rather than start train.py."""
    from support.settings import Settings

    return Settings(**dict(TINY_RUN, **keys))


def run_in_process(argv):
    """train.py in this process: faster than a new one, as torch is imported once."""
    import train

    train.main(argv)


def losses(log):
    """Each evaluation's figures in a log, for comparing two runs exactly."""
    return [
        (rec["iter"], rec["train_loss"], rec["val_loss"], rec["lr"], rec["tokens"]) for rec in log
    ]


def file_hash(path):
    """The file's SHA-256: whether a checkpoint was left byte for byte as it was."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ctrl_c_reaches_it():
    """preexec_fn for a child the test stops with SIGINT, as Ctrl-C in a terminal does. A
    script that starts the suite in the background (`.ci/run &`) has SIGINT ignored, and
    an ignored signal stays ignored across exec: Python then installs no KeyboardInterrupt
    handler, and the child would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def child_env(**extra):
    """The environment of a child process: one thread, the same numerics as one_thread."""
    return dict(os.environ, OMP_NUM_THREADS="1", **extra)


def train_step(r, lr):
    """One iter of train.py's loop, made of its own pieces; returns the loss summed
    over the micro-batches, on the device."""
    import train

    before = rng_state(r.device), r.data_gen.get_state()
    x, y = train.next_batch(r)
    loss_sum = train.forward_backward(r, x, y, before)
    train.optimizer_step(r, lr)
    return loss_sum


def read_log(out_dir):
    """The evaluations in out_dir/log.jsonl, first to last."""
    return read_evaluations(out_dir)


def torchrun_command(processes, argv, script="train.py"):
    """The command line that starts script in `processes` processes under torchrun."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        script,
        *argv,
    ]


def torchrun(processes, argv, timeout, script="train.py"):
    """script (train.py, or a wrapper of it) in `processes` processes started by
    torchrun, from the repo root; they join over gloo on the CPU."""
    return subprocess.run(
        torchrun_command(processes, argv, script),
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_training(argv):
    """train.py as a child process from the repo root, its output read as text."""
    return subprocess.Popen(
        [sys.executable, "train.py", *argv],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def signal_when_training(child, out_dir, signum):
    """Send signum to a train.py child half a second after its first evaluation
    reached out_dir/log.jsonl (it is in the training loop then); its (stdout,
    stderr) once it has exited."""
    log = os.path.join(out_dir, "log.jsonl")
    try:
        deadline = time.time() + 90
        while not (os.path.exists(log) and os.path.getsize(log)) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        child.send_signal(signum)
        return child.communicate(timeout=60)
    finally:
        child.kill()


# -----------------------------------------------------------------------------
# The fault, damaged-file and bad-input tests: their inputs, their command lines,
# and the one line a failed command prints

# tqdm's progress bar shares stderr with the error line; its updates are not messages
PROGRESS = re.compile(r"\d+%\||it/s|\d+it \[")
# the tiny run, smaller still: one layer, a context of 16
SMALL_RUN = dict(n_layer=1, block_size=16, batch_size=4, eval_iters=1, min_lr=6e-5, seed=11)


def messages(stderr):
    """stderr's lines less the progress bars (and the blank lines that clear a nested bar)."""
    lines = (line.replace("\x1b[A", "") for line in stderr.splitlines())
    return [line for line in lines if line.strip() and not PROGRESS.search(line)]


def error_line(proc):
    """The single line a failed command printed, after checking that is all it printed."""
    assert proc.returncode not in (0, None), proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = messages(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


@contextlib.contextmanager
def local_server(reply):
    """A real HTTP server on 127.0.0.1, in a thread, that answers every request with the
    raw bytes of reply (status line, headers and body) and closes the connection; yields
    the URL of a file on it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # the socket is shut: the test is over
                return
            with conn:
                conn.recv(65536)
                conn.sendall(reply)

    threading.Thread(target=answer, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/file"
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()


def http_ok(body):
    """An HTTP reply of 200 with body and its Content-Length, for local_server."""
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def own_data_env():
    """child_env, less the path that lets a child prepare tiny Shakespeare from
    elsewhere: no dataset may come from outside the inputs."""
    env = child_env()
    env.pop("TINYSHAKESPEARE_PATH", None)
    return env


@pytest.fixture(scope="session")
def inputs(tmp_path_factory, corpus_path):
    """Small datasets, a checkpoint trained on one and a Hugging Face GPT-2 folder,
    made once: the tests copy and damage them, or hand them to the command lines."""
    from data.text import prepare_text

    root = tmp_path_factory.mktemp("reliability")
    data = str(root / "data")
    with open(corpus_path, encoding="utf-8") as f:
        text = f.read()
    prepare_text(
        text[:20_000], os.path.join(data, "small"), "char"
    )  # small enough to copy and damage
    prepare_text(text[:4_000], os.path.join(data, "small_gpt2"), "gpt2")
    prepare_text(
        "hello there, general kenobi\n", os.path.join(data, "tiny"), "char"
    )  # val: 3 tokens

    transformers = pytest.importorskip("transformers")
    hf = root / "gpt2-tiny"
    config = transformers.GPT2Config(n_positions=32, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(hf)

    ckpt_dir = str(root / "trained")
    run_in_process(
        tiny_run(data, ckpt_dir, dataset="small", max_iters=2, eval_interval=2, **SMALL_RUN)
    )
    return {"root": str(root), "data": data, "hf": str(hf), "ckpt": ckpt_dir}


def small_run(inputs, out_dir, *extra, dataset="small"):
    """train.py's arguments for two iters of SMALL_RUN on one of the inputs' datasets."""
    return tiny_run(
        inputs["data"], out_dir, *extra, dataset=dataset, max_iters=2, eval_interval=1, **SMALL_RUN
    )


@pytest.fixture(scope="session")
def forker(tmp_path_factory):
    """The process that runs the command lines many times, fast (forker.py)."""
    # a test asks for it before the inputs: it imports torch while they are made
    f = Forker(str(tmp_path_factory.mktemp("forker")), own_data_env())
    yield f
    f.close()
