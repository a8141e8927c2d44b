"""support.device.keep_freed_memory: memory a CPU training step frees stays in glibc's
heap for the next step instead of being faulted in again from the system. Measured by
the minor page faults of the same allocations in two fresh processes, with and without
it (on the 15-minute recipe's training step: some 25,000 faults a step without, a few
hundred with)."""

import subprocess
import sys

import pytest

from support.device import glibc_malloc

# A training step's pattern: activations allocated and touched, then all freed; four
# blocks of 16 MiB, eight rounds. Prints the page faults of the last seven rounds and the
# pages they touched.
STEPS = """
import resource, sys
import torch
from support.device import keep_freed_memory

if sys.argv[1] == "keep":
    assert keep_freed_memory()
faults = 0
pages = 0
for step in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    activations = [torch.ones(4 << 20) for _ in range(4)]
    del activations
    if step > 0:
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        pages += 4 * (16 << 20) // resource.getpagesize()
print(faults, pages)
"""


def faults(repo_root, mode):
    done = subprocess.run(
        [sys.executable, "-c", STEPS, mode],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    faults, pages = done.stdout.split()[-2:]
    return int(faults), int(pages)


@pytest.mark.skipif(not glibc_malloc(), reason="glibc's malloc")
def test_a_training_step_reuses_its_freed_memory(repo_root):
    default, pages = faults(repo_root, "default")
    kept, _ = faults(repo_root, "keep")
    # kept, the rounds after the first take almost nothing back from the system: 0 or
    # 4,096 faults of the 114,688 pages they touch, here
    assert kept < pages / 8
    # by default glibc gives some of it back each round; how much depends on thresholds
    # it moves as mapped blocks are freed, so it differs from one process to the next:
    # 47,000 or 114,000 faults here
    assert default > pages / 8
