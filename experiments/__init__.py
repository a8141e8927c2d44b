"""The experiments that write the figures and tables in docs/: python -m experiments.NAME."""

import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")  # where each experiment writes its figures by default


def measured(work):
    """work() on one thread, and what it cost: (its result, CPU seconds of this
    process and its children, wall seconds, [load average before, after])."""
    import torch  # here: the commands import support.before_torch before anything

    torch.set_num_threads(1)
    loads = [round(os.getloadavg()[0], 2)]
    cpu = time.process_time()
    wall = time.perf_counter()
    result = work()
    children = os.times()
    cpu_seconds = time.process_time() - cpu + children.children_user + children.children_system
    loads.append(round(os.getloadavg()[0], 2))
    return result, cpu_seconds, time.perf_counter() - wall, loads
