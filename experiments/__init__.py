"""The experiments behind the figures and tables in docs/: python -m experiments.NAME.

One that makes a page's figures writes them into out-experiments/NAME/, and into docs/
only when given --out_dir=docs; those that draw one picture of a run write where --png
(or --out, --json) says."""

import json
import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# where each experiment writes by default, one folder each (git ignores out*/), so that
# trying one never replaces a figure of docs/
SCRATCH = "out-experiments"


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


def write_results(data, out_dir, name):
    """data as out_dir/name, its settings' out_dir given from the repository's root
    (the JSON then reads the same on every machine)."""
    data["settings"]["out_dir"] = os.path.relpath(out_dir, ROOT)
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(data, f, indent=1)
