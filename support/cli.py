"""
The command line every command shares: `--help` printed from the command's
docstring and options, options as --key=value (configurator.py), and each
failure the user can fix said in one line on stderr, never a traceback, with
the exit codes configurator.py gives (0 done, 2 bad input, 1 failed, 130 Ctrl-C).
"""

import contextlib
import errno
import os
import re
import shutil
import sys
import tempfile
import traceback

import torch

from data import DataError
from data.tokenizer import TokenizerError
from support import checkpoint
from support.checkpoint import CheckpointError
from support.configurator import (
    BAD_INPUT,
    FAILED,
    INTERRUPTED,
    ConfigError,
    error,
    parse_settings,
    wants_help,
)
from support.device import DeviceError
from support.help import describe_settings, print_help
from support.loading import LoadError

# what a command's user can fix: a bad option, file, checkpoint, tokenizer or dataset
USER_ERRORS = (ConfigError, DataError, CheckpointError, TokenizerError, LoadError, DeviceError)


class Failed(Exception):
    """The command's work failed after it began, in a way no option caused (a full
    disk): the message is its line, and the exit code FAILED, as for training."""


def try_writing_in(folder):
    """Make a file in folder and remove it, or OSError. os.makedirs and os.access say
    yes where a folder exists but takes no file (/proc to root, a read-only mount),
    which a run would otherwise meet only at its end."""
    with tempfile.TemporaryFile(dir=folder):
        pass


def output_folder(path, option="--out_dir"):
    """Make the folder a command writes its results into, or a ConfigError that
    names the option to change, before any work is spent."""
    try:
        os.makedirs(path, exist_ok=True)
        try_writing_in(path)
    except OSError as e:
        raise ConfigError(
            f"cannot write into {path} ({e.strerror or e}); pass {option}=DIR"
        ) from None


@contextlib.contextmanager
def replacing_files(folder):
    """A new folder inside folder to write a command's files into; when the block ends,
    each moved into folder in place of its namesake. A failed write (a full disk)
    leaves the files of an earlier run as they were, not half replaced."""
    tmp = tempfile.mkdtemp(prefix=".writing.", dir=folder)
    try:
        yield tmp
        for name in os.listdir(tmp):
            os.replace(os.path.join(tmp, name), os.path.join(folder, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def failure_line(e):
    """What failed a run in one line, where the machine failed it and not the code: a
    file that could not be read or written (a full or read-only disk), or torch.compile
    that could not build its kernels (no C++ compiler; a full disk under its cache,
    where the file goes unnamed). None for anything else, which stays a traceback."""
    chain = causes(e)
    refused = next((x.strerror for x in chain if isinstance(x, OSError) and x.strerror), None)
    if "No space left on device" in str(e):
        refused = os.strerror(errno.ENOSPC)  # the linker's, in the compiler's output
    compiled = any(type(x).__module__.startswith("torch._inductor") for x in chain)
    frames = (frame.f_code.co_filename for frame, _ in traceback.walk_tb(e.__traceback__))
    in_cache = any(f"{os.sep}_inductor{os.sep}" in name for name in frames)
    if (compiled or in_cache) and refused:
        folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "its folder")
        return (
            f"cannot write torch.compile's cache in {folder} ({refused}); make room there, "
            "or set TORCHINDUCTOR_CACHE_DIR to a folder that can be written"
        )
    if isinstance(e, BrokenPipeError):
        return "the output's reader went away (Broken pipe: `| head`, say, closed it)"
    if isinstance(e, OSError):
        return f"cannot read or write {e.filename or 'a file'} ({e.strerror or e})"
    if any(type(x).__name__ == "InvalidCxxCompiler" for x in chain):
        return (
            f"torch.compile needs a C++ compiler and found none ({checkpoint.first_line(e)}); "
            "install g++ or clang, or pass --compile=False"
        )
    if compiled:
        return (
            f"torch.compile could not build its kernels ({checkpoint.first_line(chain[-1])}); "
            "pass --compile=False to run without it"
        )
    return None


def causes(e):
    """e and the exceptions behind it, torch.compile's wrapped ones among them."""
    chain = [e]
    while len(chain) < 10:
        inner = chain[-1].__cause__ or getattr(chain[-1], "inner_exception", None)
        if inner is None or inner in chain:
            break
        chain.append(inner)
    return chain


def check_threads(threads, least=0):
    """--threads from least to this machine's cores (0: torch's default): more only
    makes the threads wait on each other, and a billion of them kill the process
    inside OpenMP, with no message."""
    cores = os.cpu_count() or 1
    if not least <= threads <= cores:
        raise ConfigError(
            f"--threads must be {least} to {cores} (this machine's cores), got {threads}"
        )


def run(
    main,
    argv,
    doc,
    settings,
    errors=(),
    out_of_memory="try --device=cpu",
    config_files=False,
    positional=None,
):
    """A command: main(cfg), cfg an instance of the dataclass settings with the
    --key=value options in argv (and config files, with config_files), or --help.
    errors: the command's own exceptions for bad input; out_of_memory: what to try
    when the GPU runs out; positional: the field a bare argument sets. Returns the
    exit code."""
    if wants_help(argv):
        print_help(doc, describe_settings(settings))
        return 0
    # a model's text may hold characters the terminal's encoding lacks (a Windows
    # console or a file written there, a latin-1 locale): shown as '?', not an error
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    try:
        main(parse_settings(settings, argv, config_files, positional))
    except USER_ERRORS + errors as e:
        error(e)
        return BAD_INPUT
    except Failed as e:
        error(e)
        return FAILED
    except torch.OutOfMemoryError:
        error(f"out of GPU memory; {out_of_memory}")
        return FAILED
    except (RuntimeError, MemoryError) as e:
        # the CPU's allocator refuses with a RuntimeError that says so; Python's, MemoryError
        if checkpoint.out_of_memory(e):
            error(f"out of memory{asked_for(e)}; ask for less: smaller sizes, or fewer at once")
            return FAILED
        line = failure_line(e)
        if line is None:
            raise
        error(line)
        return FAILED
    except KeyboardInterrupt as e:
        # after ^C, a new line; or what the command said of what it had done
        print(*e.args, file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILED
    except OSError as e:
        # a file the run could not write or read after it started: a full disk, a folder gone
        error(failure_line(e))
        return FAILED
    return 0


def asked_for(e):
    """The size of the tensor the CPU's allocator refused, as its message gives it."""
    found = re.search(r"allocate (\d+) bytes", str(e))
    if found is None:
        return ""
    return f" (one tensor of {int(found.group(1)) / 2**30:.1f} GiB)"
