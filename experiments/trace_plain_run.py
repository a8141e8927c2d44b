"""
What a plain training run reads: the project's files it executes, and their lines, found by
tracing it. A markdown table, then the files one a line.

    python -m experiments.trace_plain_run [--key=value ...]

The run: `python train.py config/shakespeare_cpu.py --max_iters=4 --compile=False`, into a
temporary out_dir, with any --key=value given here added, in a fresh process, traced. A
run that did what happens once per machine (the dataset prepared, this CPU's bfloat16 probed
and cached: ONCE_PER_MACHINE's files ran) is traced again from the same folder, so that the
trace is what a user's every later run reads. GPT_SIMULATE_CPU is left out of their environment:
the trace is of this machine as a user runs it. sys.settrace (and threading.settrace) records every
line event in a file of this repository, the config file run by train.py included. The
columns:

- code lines: the distinct lines executed that hold code (experiments/readability.py's
  code_lines: no comment, docstring or blank line). Import-time lines count: a module's
  `def`, `class` and top-level lines run when it loads, and a reader meets them.
- files: the files with at least one line executed.

tests/test_footprint.py holds the plain run to its goals; compare
experiments/trace_plain_gpt.py, which traces model.py alone.
"""

import os
import sys

# the repository; run by its path too, not only with -m: its modules come first
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ast
import json
import runpy
import subprocess
import tempfile
import threading

from experiments.readability import code_lines, read

COMMAND = ["train.py", "config/shakespeare_cpu.py", "--max_iters=4", "--compile=False"]
# the files only a machine's first run executes
ONCE_PER_MACHINE = {
    "support/cpu_probe.py",  # this CPU's bfloat16 probed, then cached
    "data/tiny_shakespeare.py",  # the dataset prepared
}


def traced_child(argv, report):
    """In the traced process: run train.py as the command line does, with argv, and
    write {path: [line numbers executed]} to report as JSON when it exits."""
    lines = {}
    me = os.path.abspath(__file__)

    def local(frame, event, arg):
        if event == "line":
            lines[frame.f_code.co_filename].add(frame.f_lineno)
        return local

    def start(frame, event, arg):
        filename = frame.f_code.co_filename
        if filename not in lines:
            path = os.path.abspath(filename)
            # "<frozen posixpath>", "<string>": no file of the project; nor the installed
            # packages of a virtual environment made inside the clone (venv/, .venv/)
            in_project = not filename.startswith("<") and path.startswith(ROOT + os.sep)
            installed = {"site-packages", "dist-packages"} & set(path.split(os.sep))
            if installed:
                return None
            if not in_project or path == me:
                return None
            lines[filename] = set()
        return local

    def write_report():
        sys.settrace(None)
        threading.settrace(None)
        found = {}
        for filename, numbers in lines.items():
            path = os.path.relpath(os.path.abspath(filename), ROOT)
            found.setdefault(path, set()).update(numbers)
        with open(report, "w") as f:
            json.dump({path: sorted(numbers) for path, numbers in found.items()}, f)

    # train.py leaves with os._exit once all is saved (no interpreter teardown)
    real_exit = os._exit

    def exit_after_report(code):
        write_report()
        sys.stdout.flush()
        real_exit(code)

    os._exit = exit_after_report
    sys.argv = ["train.py"] + argv
    sys.path.insert(0, ROOT)
    threading.settrace(start)
    sys.settrace(start)
    try:
        runpy.run_path(os.path.join(ROOT, "train.py"), run_name="__main__")
    finally:
        write_report()


def run(argv):
    """One traced run of the command with argv added, in a fresh process from ROOT: its
    {path: executed line numbers}."""
    with tempfile.TemporaryDirectory(prefix="trace-plain-run-") as scratch:
        argv = COMMAND[1:] + [f"--out_dir={os.path.join(scratch, 'out')}"] + argv
        report = os.path.join(scratch, "lines.json")
        code = (
            "import sys; from experiments.trace_plain_run import traced_child; "
            "traced_child(sys.argv[2:], sys.argv[1])"
        )
        cmd = [sys.executable, "-c", code, report] + argv
        env = {key: value for key, value in os.environ.items() if key != "GPT_SIMULATE_CPU"}
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            # train.py's own message and exit code: a bad --key=value is its to explain
            sys.stderr.write(done.stderr)
            sys.exit(max(done.returncode, 1))
        with open(report) as f:
            return json.load(f)


def count(executed):
    """{path: code lines executed} from {path: executed line numbers}, largest first."""
    counts = {}
    for path, numbers in executed.items():
        source = read(os.path.join(ROOT, path))
        counts[path] = len(set(numbers) & code_lines(source, ast.parse(source)))
    counts = {path: n for path, n in counts.items() if n > 0}
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def footprint(argv=()):
    """{path: code lines executed} of the traced plain run, largest first."""
    executed = run(list(argv))
    if ONCE_PER_MACHINE & set(executed):
        executed = run(list(argv))
    return count(executed)


def main(argv):
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__.strip())
        return
    counts = footprint(argv)
    print("| run | code lines | files |")
    print("|---|---|---|")
    print(f"| {' '.join(COMMAND + argv)} | {sum(counts.values()):,} | {len(counts)} |")
    print()
    for path, n in counts.items():
        print(f"- {path} {n}")


if __name__ == "__main__":
    main(sys.argv[1:])
