import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The corpus lives beside the checkout, never inside it; TINYSHAKESPEARE_PATH,
# the variable the prepare scripts read, points elsewhere.
SHARED_CORPUS = os.environ.get("TINYSHAKESPEARE_PATH") or os.path.join(
    os.path.dirname(ROOT), "shared", "data", "tinyshakespeare", "input.txt")


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def corpus_path():
    if not os.path.exists(SHARED_CORPUS):
        pytest.fail(f"tiny Shakespeare is expected at {SHARED_CORPUS}")
    return SHARED_CORPUS


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The test models are tiny: a second thread only waits on the first, and on a
    busy machine spinning OpenMP threads make steps many times slower. Child
    processes get the same through OMP_NUM_THREADS=1 where tests set it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
