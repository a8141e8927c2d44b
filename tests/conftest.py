import atexit
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Before torch loads, as in every entry point: whether bfloat16 runs on this CPU
# (a child process tries it), with its fix applied (hardware.py). The verdict is
# cached in a folder of the session's own, so the tests see this machine as it
# is now; the train.py processes they start inherit the folder and the fix.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="gpt-tests-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)
from support import hardware

BF16 = hardware.check_bf16()

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    """Tests marked bf16 run bfloat16 on the CPU: skipped where it would crash."""
    if not BF16["runs"]:
        skip = pytest.mark.skip(reason=f"bfloat16 does not run on this CPU: {BF16['why']}")
        for item in items:
            if "bf16" in item.keywords:
                item.add_marker(skip)


# The corpus is never committed. The tests find it where the prepare scripts
# do (data/prepare.find_shakespeare), or in the folder beside the checkout.
BESIDE = os.path.join(os.path.dirname(ROOT), "shared", "data", "tinyshakespeare", "input.txt")


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def corpus_path():
    from data.prepare import SHAKESPEARE_ENV, DataError, find_shakespeare, shakespeare_dir

    folder = shakespeare_dir("char")
    try:
        return find_shakespeare(folder, also=[BESIDE])
    except DataError as e:
        pytest.exit(
            f"the tests need tiny Shakespeare ({e.args[0].split(';')[0]}): put it at "
            f"{os.path.join(folder, 'input.txt')} or set {SHAKESPEARE_ENV}=PATH",
            returncode=2,
        )


@pytest.fixture(scope="session")
def data_root(tmp_path_factory, corpus_path):
    """A folder of prepared datasets, tiny Shakespeare in characters; tests may add others."""
    from data.prepare import ensure_dataset

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
    from model import GPT, GPTConfig
    from support.tokenizer import build_tokenizer

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
