"""
What the experiments on compare.py share (compare_null, compare_pairing,
compare_flat_attention): a clone of this repository at HEAD to run the command in, as a new
user would; the command run there, its output shown and kept; its report read back; and the
machine named.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import time

from experiments import ROOT
from support.configurator import BAD_INPUT, ConfigError, error, parse_settings, wants_help
from support.hardware import FLAG_FIELDS, cpuinfo


def clone(folder):
    """A fresh clone of this repository's HEAD in folder (uncommitted work stays out)."""
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", ROOT, folder], check=True)
    return folder


def edit(path, old, new):
    """Replace the one line old by new in the file at path."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.count(old) != 1:
        sys.exit(f"{path} does not hold {old.strip()!r} once: the experiment needs updating")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))


def compare(repo, argv, out_dir, log=None):
    """`python compare.py *argv --out_dir=out_dir` in repo, its output shown as it comes (and
    appended to the file log): (its report, its output, its wall seconds). A failure stops
    the experiment with the command's last line."""
    start = time.perf_counter()
    lines = []
    with subprocess.Popen(
        [sys.executable, "compare.py", *argv, f"--out_dir={out_dir}"],
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as child:
        for line in child.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    wall = time.perf_counter() - start
    if log is not None:
        with open(log, "a", encoding="utf-8") as f:
            f.write("".join(lines))
    if child.returncode != 0:
        sys.exit(f"compare.py exited {child.returncode}: {lines[-1].strip() if lines else ''}")
    with open(os.path.join(out_dir, "compare.json")) as f:
        return json.load(f), "".join(lines), wall


def cpu_class():
    """The CPU, its cores and its bfloat16 instructions, to stand beside every figure."""
    name = cpuinfo(("model name", "Model", "Hardware")) or platform.processor()
    flags = set(cpuinfo(FLAG_FIELDS).split())
    native = [flag for flag in ("avx512", "avx512_bf16", "amx_bf16", "amx_tile") if flag in flags]
    if "avx512f" in flags:
        native.insert(0, "avx512f")
    return f"{name}, {os.cpu_count()} cores ({', '.join(native) or 'AVX2 or less'})"


def command(main, argv, doc, settings):
    """An experiment's command line: --help (its docstring and options), or main(cfg) with
    the options parsed; a bad one is one line and exit code 2. Returns the exit code."""
    if wants_help(argv):
        from support.help import describe_settings, print_help

        print_help(doc, describe_settings(settings))
        return 0
    try:
        cfg = parse_settings(settings, argv, allow_files=False)
    except ConfigError as e:
        error(e)
        return BAD_INPUT
    main(cfg)
    return 0
