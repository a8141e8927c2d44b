"""
Which lines of a model file a plain GPT runs, found by tracing it: a markdown table.

    python -m experiments.trace_plain_gpt [model.py ...]

The run: the file imported, then a plain GPT of 2 layers (GPTConfig's options left at
GPT-2's: learned positions, softmax attention, no window) built, one forward with a loss,
its backward, and generate with the KV cache (a 4-token prompt, 8 new tokens, within
block_size). sys.settrace records every line event in the file. The columns:

- code lines run: the lines executed from the import through the run that hold code
  (experiments/readability.py's code_lines: no comment, docstring or blank line). The
  import runs every `def` and `class` line, Part II's included, so they count.
- last line of the run: the last line of the file the run executes after the import,
  which is how far a reader who follows the plain model reads.
- lines in the run: the code lines executed after the import alone.

Counting lines is deterministic: tests/test_plain_gpt.py holds model.py to its goals.
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import ast
import importlib.util

import torch

from experiments.readability import code_lines, read

COLUMNS = ("model file", "code lines run", "last line of the run", "lines in the run")


def load(path, name):
    """Import the file at path as a module of its own name, whatever its folder."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the module up by name while the class is made
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def plain_run(module):
    """Build, train one step and generate, as a learner first does."""
    torch.manual_seed(0)
    config = module.GPTConfig(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16)
    model = module.GPT(config)
    idx = torch.randint(0, 32, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    model.generate(idx[:, :4], 8)


def trace(path):
    """(code lines run, last line of the run, lines in the run) for the model file at path."""
    filename = os.path.abspath(path)
    at_import = set()
    in_run = set()
    lines = at_import

    def local(frame, event, arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def start(frame, event, arg):
        if frame.f_code.co_filename != filename:
            return None
        return local

    sys.settrace(start)
    try:
        module = load(path, "traced_model")
        lines = in_run
        plain_run(module)
    finally:
        sys.settrace(None)
        sys.modules.pop("traced_model", None)
    source = read(path)
    code = code_lines(source, ast.parse(source))
    run = in_run & code
    return len((at_import | in_run) & code), max(run), len(run)


def main(paths):
    if any(p in ("-h", "--help") for p in paths):
        print(__doc__.strip())
        return
    if not paths:
        paths = ["model.py"]
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for path in paths:
        read(path)  # an unreadable file: one line, before tracing
        counts = trace(path)
        print(f"| {path} | " + " | ".join(str(n) for n in counts) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
