import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The corpus lives beside the checkout, never inside it.
SHARED_CORPUS = os.path.join(os.path.dirname(ROOT), "shared", "data", "tinyshakespeare", "input.txt")


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def corpus_path():
    if not os.path.exists(SHARED_CORPUS):
        pytest.fail(f"tiny Shakespeare is expected at {SHARED_CORPUS}")
    return SHARED_CORPUS
