"""Every core: how the tests share the machine's cores (tests/conftest.py imports the
hooks and the fixture). Imports pytest alone, so that tests/test_cores.py can run a pytest
of its own with these hooks in a second or two."""

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile

import pytest

# Every core: pytest-xdist runs the tests in one process per core (pyproject.toml's
# addopts). A test that starts several busy processes (torchrun, a browser beside a
# server) or times something runs them alone, the other workers waiting between
# their tests, so that it neither fights them for the cores nor measures them:
# marked `exclusive`, the whole test; with the `cores_alone` fixture, the part of
# it that does (a one-process reference run beside it shares the cores as any test
# does). Two file locks that every worker of the run shares do it: each test holds
# `cores` shared, a test alone holds it exclusively; a worker takes `turn` on the
# way in, so that one waiting to run alone stops the others starting anything new,
# and is not starved by their stream of short tests. No worker waits for `turn`
# while it holds `cores`: two that did would wait for each other.


def pytest_xdist_auto_num_workers(config):
    """-n auto: a worker per core this process may use, at most 8 (each imports torch
    and makes the session's fixtures again)."""
    if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process may use
        return min(8, len(os.sched_getaffinity(0)))
    return min(8, os.cpu_count() or 1)


@contextlib.contextmanager
def file_lock(path, mode):
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def locks_folder(config):
    """The folder of the run's two locks, or None with one process; the first
    worker to finish removes it (the others, their tests done, need it no more).
    The run is known by the id xdist gives its workers (not by the environment,
    which a test's own pytest inherits)."""
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return None
    folder = os.path.join(tempfile.gettempdir(), f"gpt-tests-{worker['testrunuid']}")
    if not os.path.isdir(folder):
        os.makedirs(folder, exist_ok=True)
        atexit.register(shutil.rmtree, folder, True)
    return folder


def take_the_cores(folder, cores, exclusive):
    """`cores` (an open file, unlocked) locked shared or exclusively, in turn."""
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    with file_lock(os.path.join(folder, "turn"), fcntl.LOCK_EX):
        fcntl.flock(cores, mode)


# this worker's `cores` while one of its tests runs: (folder, open file)
HELD = {}


@contextlib.contextmanager
def share_of_the_cores(config, exclusive):
    folder = locks_folder(config)
    if folder is None:  # one process: nothing to share
        yield
        return
    with open(os.path.join(folder, "cores"), "a") as cores:
        take_the_cores(folder, cores, exclusive)
        HELD["cores"] = (folder, cores)
        try:
            yield
        finally:
            HELD.clear()
            fcntl.flock(cores, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The test's setup, call and teardown, alone where it is marked exclusive."""
    with share_of_the_cores(item.config, item.get_closest_marker("exclusive") is not None):
        return (yield)


@contextlib.contextmanager
def alone_on_the_cores():
    held = HELD.get("cores")
    if held is None:  # one process: nothing to share
        yield
        return
    folder, cores = held
    fcntl.flock(cores, fcntl.LOCK_UN)
    take_the_cores(folder, cores, exclusive=True)
    try:
        yield
    finally:
        fcntl.flock(cores, fcntl.LOCK_UN)
        take_the_cores(folder, cores, exclusive=False)


@pytest.fixture
def cores_alone():
    """`with cores_alone():` runs its block while no other test runs."""
    return alone_on_the_cores
