"""tests/cores.py: under pytest-xdist, a test marked `exclusive`, and the block of a test
inside `with cores_alone():`, run while no other test runs; everything else runs side by
side. The oracle is the clock: a pytest of its own, two workers, each test writing down
when it ran, and no interval that must be alone overlapping any other."""

import json
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))

CONFTEST = f"""
import sys

sys.path.insert(0, {TESTS!r})
from cores import cores_alone, pytest_runtest_protocol  # noqa: F401
"""

# each test appends {{"name", "start", "end", "alone"}} to the file named by RECORD
RECORD = """
import json
import os
import time

import pytest


def record(name, seconds, alone):
    start = time.time()
    time.sleep(seconds)
    with open(os.environ["RECORD"], "a") as f:
        f.write(json.dumps(dict(name=name, start=start, end=time.time(), alone=alone)) + "\\n")
"""

SHARED = (
    RECORD
    + """

@pytest.mark.parametrize("i", range(12))
def test_shared(i):
    record(f"shared {i}", 0.15, False)
"""
)

ALONE = (
    RECORD
    + """

def test_part_alone(cores_alone):
    record("before the block", 0.3, False)
    with cores_alone():
        record("the block", 0.6, True)
    record("after the block", 0.3, False)


@pytest.mark.exclusive
def test_exclusive():
    record("exclusive", 0.6, True)
"""
)


def test_alone_means_no_other_test_runs(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_shared.py").write_text(SHARED)
    (tmp_path / "test_alone.py").write_text(ALONE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    exclusive: alone\n")
    record = tmp_path / "record.jsonl"
    env = dict(os.environ, RECORD=str(record))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-n", "2", "--dist", "loadfile", "-c", str(tmp_path / "pytest.ini")]
    done = subprocess.run(
        [*command, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(runs) == 12 + 4
    alone = [r for r in runs if r["alone"]]
    assert sorted(r["name"] for r in alone) == ["exclusive", "the block"]
    for a in alone:
        for other in runs:
            if other is not a:
                overlap = min(a["end"], other["end"]) - max(a["start"], other["start"])
                assert overlap <= 0, (a, other)
