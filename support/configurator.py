"""
Plain-Python configuration: defaults, then config files, then --key=value overrides;
and how every command says what the user can fix: one line on stderr and an exit code.
`--help` is support/help.py.

A config file is Python that sets variables (it runs as code: only run config
files you trust). Overrides on the command line are parsed as literals and never
evaluated, so `--out_dir="__import__('os')"` stays a string. A config file
starts from the values the command line gives, wherever they stand on it, so
that it can choose by them (config/shakespeare.py looks at device); the command
line still has the last word. Every key must exist in the defaults and keep its type;
anything else is a ConfigError with a one-line message. The defaults are a
dataclass's, whose fields all have one (parse_settings).

Exit codes, the same for every command: 0 done; 2 bad input (the line says what
to do); 1 the run itself failed (out of memory, a disk that cannot be written);
130 stopped by Ctrl-C. support/cli.py runs a command with them; train.py, which
loads no more than it uses, takes them from here.
"""

import ast
import dataclasses
import os
import sys
import types
import typing
import warnings

BAD_INPUT = 2
FAILED = 1
INTERRUPTED = 130


class ConfigError(Exception):
    """A bad config file, key or value; the message is meant for the user as is."""


def _unknown(key, known):
    import difflib  # here only: a mistyped key

    # --MAX_ITERS and --max-iters are max_iters written another way
    plain = key.lower().replace("-", "_")
    close = [plain] if plain in known else difflib.get_close_matches(plain, known, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def coerce(key, value, kind, default):
    """value as a kind (a type; None: any), or ConfigError; None passes (parse_settings
    judges it by the field's type)."""
    if value is None or kind is None:
        return value  # a field of several types besides None takes any literal
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
    elif kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 5e3 is a fine way to write 5000
        if isinstance(value, int) and not isinstance(value, bool):
            if -(2**63) <= value < 2**63:
                return value
            raise ConfigError(f"{key} must fit in a signed 64-bit integer, got {value:.3g}")
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    elif kind in (tuple, list) and isinstance(value, (tuple, list)):
        return kind(value)
    like = " or None" if default is None else f" (like {default!r})"
    raise ConfigError(f"{key} expects {kind.__name__}{like}, got {value!r}")


def parse_value(text):
    """A command-line value as a Python literal; anything else is the raw string."""
    try:
        # a path such as /tmp/run-1if/out is no literal, but the parser warns about
        # "1if" before it gives up: the value is the raw string, with no warning
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def run_config_file(path, config, kinds):
    """Execute a config file on top of config; return the keys it set, each of its
    kind. Its __file__ is its path, so that it can find the files beside it."""
    if not os.path.isfile(path):
        shown = path if path.isprintable() else repr(path)  # the message stays one line
        # max_iters=5 or -max_iters=5: a setting without its two dashes
        key, _, value = path.lstrip("-").partition("=")
        hint = ""
        # a command run from another folder: its config files are the repository's
        in_repo = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path)
        if key in config:
            hint = f"; a setting is written --{key}={value or 'VALUE'}"
        elif not os.path.isabs(path) and os.path.isfile(in_repo):
            hint = f" in {os.getcwd()}; the repository's is {in_repo}"
        raise ConfigError(f"config file not found: {shown}{hint}")
    namespace = dict(config, __file__=path)
    try:
        with open(path, encoding="utf-8") as f:
            code = compile(f.read(), path, "exec")
        exec(code, namespace)
    except Exception as e:  # a config file is user code: report, don't crash
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(
            f"error in config file {path}: {type(e).__name__}: {first_line}"
        ) from None
    updates = {}
    for key, value in namespace.items():
        if key.startswith("_") or isinstance(value, (types.ModuleType, types.FunctionType, type)):
            continue  # imports, helpers and dunders a config file may define
        if key not in config:
            raise _unknown(key, list(config))
        if value is not config[key]:
            updates[key] = coerce(key, value, kinds[key], config[key])
    return updates


def split_args(defaults, argv, kinds):
    """(config files, {key: value} of the overrides) in argv, each value of its kind."""
    files = []
    overrides = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--"):
            files.append(arg)
            continue
        key, sep, text = arg[2:].partition("=")
        if key not in defaults:
            raise _unknown(key, list(defaults))
        if not sep:
            bare = i == len(argv) or argv[i].startswith("--")
            if bare and kinds[key] is bool:
                text = "True"  # a bare --flag switches a boolean on
            elif i < len(argv):
                text = argv[i]
                i += 1
            else:
                raise ConfigError(f"--{key} needs a value")
        value = parse_value(text)
        if kinds[key] is str and not isinstance(value, str):
            # a text option keeps what was typed (--prompt=1e3 stays "1e3"), but for None
            # where None is its default (--attn_dir=None)
            if value is not None or defaults[key] is not None:
                value = text
        overrides[key] = coerce(key, value, kinds[key], defaults[key])
    return files, overrides


def parse_settings(cls, argv, allow_files=True, positional=None):
    """An instance of the dataclass cls, whose fields all have a default. argv: config
    files and overrides in the forms --key=value, --key value, and --flag for a boolean
    set to True. The config files run in order, each on top of the last and of the
    overrides; the overrides then win. Each value is of its field's type (None only
    where that type has it, as `top_k: int | None` does). positional: the field a bare
    argument sets (data/prepare.py's SOURCE), where a command takes one rather than
    config files."""
    defaults = {field.name: field.default for field in dataclasses.fields(cls)}
    if positional is not None:
        argv = with_positional(argv, positional)
    hints = typing.get_type_hints(cls)
    kinds = {key: value_type(hints[key]) for key in defaults}
    files, overrides = split_args(defaults, argv, kinds)
    if files and not allow_files:
        raise ConfigError(f"unexpected argument {files[0]!r}; options look like --key=value")
    values = dict(defaults)
    for path in files:
        values.update(run_config_file(path, dict(values, **overrides), kinds))
    values.update(overrides)
    for key, value in values.items():
        if value is None and type(None) not in typing.get_args(hints[key]):
            raise ConfigError(f"{key} cannot be None; give it a value like {defaults[key]!r}")
    return cls(**values)


def value_type(hint):
    """The type of a field's values besides None: int for `int` and `int | None`, tuple
    for `tuple[int, ...]`; None (any) for a union of several."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        others = [kind for kind in typing.get_args(hint) if kind is not type(None)]
        return others[0] if len(others) == 1 else None
    return typing.get_origin(hint) or hint


def with_positional(argv, key):
    """argv with its one bare argument written as --key=value."""
    bare = [
        i for i, arg in enumerate(argv) if not arg.startswith("--") and not follows_key(argv, i)
    ]
    if len(bare) > 1:
        raise ConfigError(f"one {key.upper()} only; other options look like --key=value")
    if not bare:
        return argv
    i = bare[0]
    return argv[:i] + [f"--{key}={argv[i]}"] + argv[i + 1 :]


def follows_key(argv, i):
    """Whether argv[i] is the value of the option before it (--key value)."""
    return i > 0 and argv[i - 1].startswith("--") and "=" not in argv[i - 1]


def wants_help(argv):
    return "-h" in argv or "--help" in argv


def error(message):
    print(f"error: {message}", file=sys.stderr)
