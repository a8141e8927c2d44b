"""
`--help` for every command: its docstring, then its options, read from the body of
its settings dataclass as written, so that each key's comment is its documentation.
Imported only when help is asked for (configurator.wants_help).
"""

import dataclasses
import inspect
import os
import sys


def describe_settings(cls, keys=None):
    """For --help: the body of the dataclass cls as written, its comments included,
    each field (of keys, if given) shown as --key=default; the fields of the classes
    it extends come first, as dataclasses order them."""
    defaults = {field.name: field.default for field in dataclasses.fields(cls)}
    if keys is not None:
        defaults = {key: defaults[key] for key in keys}
    lines = []
    described = set()
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            lines += _field_lines(klass, defaults, described)
    return "\n".join(lines)


def _field_lines(klass, defaults, described):
    """The help lines of the fields klass's own body declares (and its comments),
    less those already described. A class made at run time has no body to read
    (train.py describes its model keys from GPTConfig); one in a module run by
    runpy, which inspect cannot read back, has its fields listed without comments."""
    try:
        source = inspect.getsource(klass).splitlines()
    except (OSError, TypeError):
        if klass.__module__ != "__main__":
            return []  # made at run time
        fields = klass.__dict__.get("__annotations__", {})
        source = ["class Fields:", *(f"{name}: ..." for name in fields)]
    start = next(i for i, line in enumerate(source) if line.lstrip().startswith("class "))
    lines = []
    for line in source[start + 1 :]:
        text = line.strip()
        if text.startswith(("def ", "@")):
            break  # the fields end where the methods begin
        key = text.partition(":")[0]
        if text.startswith("#"):
            lines.append(f"  {text}")
        elif key in defaults and key not in described:
            described.add(key)
            comment = text.partition("  # ")[2]
            lines.append(f"  --{key}={defaults[key]!r}" + (f"  # {comment}" if comment else ""))
    return lines


def print_help(doc, options):
    """The command's docstring, then its options, one a line with its default and
    comment (describe_settings)."""
    try:
        print(doc.strip() + "\n\noptions (defaults):\n" + options, flush=True)
    except BrokenPipeError:
        # the reader has stopped (`--help | head`) and wants no more. Python flushes stdout
        # again at exit, which would fail the same way: its descriptor goes to /dev/null
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
