"""configurator.py: config files, typed overrides, and errors that name the key."""

import dataclasses
import os
import subprocess
import sys
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.configurator import ConfigError, parse_settings
from support.help import describe_settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULTS = dict(
    batch_size=12,
    learning_rate=1e-3,
    out_dir="out",
    compile=True,
    top_k=None,
    betas=(0.9, 0.95),
    dataset="shakespeare_char",
)
HINTS = dict(
    batch_size=int,
    learning_rate=float,
    out_dir=str,
    compile=bool | None,
    top_k=int | None,
    betas=tuple,
    dataset=str,
)


def parse_args(defaults, argv, allow_files=True):
    """parse_settings on a dataclass of these defaults, as a dict."""
    fields = [
        (key, HINTS[key], dataclasses.field(default=value)) for key, value in defaults.items()
    ]
    cls = dataclasses.make_dataclass("Defaults", fields, frozen=True)
    return dataclasses.asdict(parse_settings(cls, argv, allow_files))


def test_overrides_in_both_forms_and_bare_flags():
    c = parse_args(
        DEFAULTS,
        [
            "--batch_size=32",
            "--learning_rate",
            "3e-4",
            "--compile=False",
            "--out_dir",
            "runs/a",
            "--top_k=5",
        ],
    )
    assert c == dict(
        DEFAULTS, batch_size=32, learning_rate=3e-4, compile=False, out_dir="runs/a", top_k=5
    )
    assert parse_args(dict(DEFAULTS, compile=False), ["--compile"])["compile"] is True
    assert (
        parse_args(dict(DEFAULTS, compile=None), ["--compile", "--batch_size=3"])["compile"] is True
    )
    assert (
        parse_args(DEFAULTS, ["--learning_rate=1"])["learning_rate"] == 1.0
    )  # int widens to float
    assert parse_args(DEFAULTS, ["--batch_size=5e3"])["batch_size"] == 5000
    assert DEFAULTS["batch_size"] == 12  # the defaults are never modified
    for text in ("1e3", "True", "None", "(1, 2)"):  # text options keep what was typed
        assert parse_args(DEFAULTS, [f"--out_dir={text}"])["out_dir"] == text
    assert parse_args(DEFAULTS, ["--out_dir='quoted'"])["out_dir"] == "quoted"


def test_config_file_sets_globals_and_overrides_win(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("import math\nbatch_size = 64\nlearning_rate = math.sqrt(1e-6)\n_helper = 3\n")
    c = parse_args(DEFAULTS, [str(f), "--batch_size=8"])
    assert c["batch_size"] == 8 and c["learning_rate"] == pytest.approx(1e-3)


def test_a_config_file_starts_from_the_command_line_which_has_the_last_word(tmp_path):
    f = tmp_path / "c.py"
    f.write_text(
        "import os\n"
        "learning_rate = batch_size * 1e-4\n"
        "if out_dir == 'big':\n"
        "    batch_size = 64\n"
        "_beside = os.path.join(os.path.dirname(__file__), 'other.py')\n"
        "dataset = open(_beside).read()\n"
    )
    (tmp_path / "other.py").write_text("beside")
    # the overrides stand after the file and before it
    c = parse_args(DEFAULTS, [str(f), "--batch_size=8", "--out_dir=big"])
    assert c["learning_rate"] == pytest.approx(8e-4) and c["batch_size"] == 8
    assert c["dataset"] == "beside"  # __file__ is the config file's path
    assert parse_args(DEFAULTS, ["--batch_size=8", str(f)]) == c | {"out_dir": "out"}
    assert parse_args(DEFAULTS, [str(f)])["learning_rate"] == pytest.approx(12e-4)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--batch_sze=3"], "unknown config key 'batch_sze'; did you mean 'batch_size'?"),
        (["--batch_size=abc"], "batch_size expects int"),
        (["--batch_size=1.5"], "batch_size expects int"),
        (["--compile=maybe"], "compile expects bool"),
        (["--out_dir"], "--out_dir needs a value"),
        (["nope.py"], "config file not found: nope.py"),
    ],
)
def test_bad_keys_and_values_name_the_key(argv, message):
    with pytest.raises(ConfigError) as e:
        parse_args(DEFAULTS, argv)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_config_files(tmp_path):
    unknown = tmp_path / "u.py"
    unknown.write_text("batchsize = 3\n")
    with pytest.raises(ConfigError, match="did you mean 'batch_size'"):
        parse_args(DEFAULTS, [str(unknown)])
    broken = tmp_path / "b.py"
    broken.write_text("batch_size = (\n")
    with pytest.raises(ConfigError, match="error in config file"):
        parse_args(DEFAULTS, [str(broken)])
    wrong = tmp_path / "w.py"
    wrong.write_text("batch_size = 'many'\n")
    with pytest.raises(ConfigError, match="batch_size expects int"):
        parse_args(DEFAULTS, [str(wrong)])


def test_overrides_are_literals_never_evaluated(tmp_path):
    marker = tmp_path / "ran"
    payload = f"__import__('os').system('touch {marker}')"
    c = parse_args(DEFAULTS, [f"--out_dir={payload}"])
    assert c["out_dir"] == payload and not marker.exists()
    with pytest.raises(ConfigError):
        parse_args(DEFAULTS, [f"--batch_size={payload}"])
    assert not marker.exists()


def test_a_path_the_parser_warns_about_is_the_raw_string_in_silence():
    """ "run-1if" tokenizes as a number run into a keyword, which Python's parser warns
    about (SyntaxWarning) before it refuses the text; the value is the path as given."""
    paths = ["/tmp/run-1if/out", "runs/0x1for", "3in"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for path in paths:
            assert parse_args(DEFAULTS, [f"--out_dir={path}"])["out_dir"] == path
    assert [str(w.message) for w in seen] == []
    # the command's stderr: train.py's one line, no warning before it
    cmd = [sys.executable, "train.py", "--out_dir=/tmp/run-1if/out", "--max_iter=4"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr == "error: unknown config key 'max_iter'; did you mean 'max_iters'?\n"


def test_files_refused_where_not_allowed():
    with pytest.raises(ConfigError, match="unexpected argument"):
        parse_args(DEFAULTS, ["config.py"], allow_files=False)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(max_size=20),
            st.builds(lambda s: "--" + s, st.text(max_size=12)),
            st.builds(
                lambda k, v: f"--{k}={v}",
                st.sampled_from(list(DEFAULTS) + ["x", "batch"]),
                st.text(max_size=30),
            ),
            st.builds(lambda k: f"--{k}", st.sampled_from(list(DEFAULTS))),
        ),
        max_size=6,
    )
)
def test_parser_raises_only_its_own_error(argv):
    argv = [a for a in argv if not a or a.startswith("--") or not a.endswith(".py")]
    try:
        config = parse_args(DEFAULTS, argv, allow_files=False)
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    for key, value in config.items():  # whatever got through kept its type
        # or is None, where the field's type has it (compile, top_k)
        if value is None:
            assert type(None) in HINTS[key].__args__
        elif DEFAULTS[key] is not None:
            assert type(value) is type(DEFAULTS[key])


@dataclasses.dataclass(frozen=True)
class Example:
    """Settings as a dataclass, the way train.py keeps its own."""

    # sizes
    batch_size: int = 12  # sequences per step
    # a comment above the field
    out_dir: str = "out"
    top_k: int | None = None


def test_none_only_where_the_fields_type_admits_it(tmp_path):
    assert parse_settings(Example, ["--top_k=None"]).top_k is None
    for argv in (["--batch_size=None"], ["--batch_size", "None"]):
        with pytest.raises(ConfigError) as e:
            parse_settings(Example, argv)
        assert str(e.value) == "batch_size cannot be None; give it a value like 12"
    f = tmp_path / "c.py"
    f.write_text("out_dir = None\n")  # a config file too
    with pytest.raises(ConfigError, match="out_dir cannot be None; give it a value like 'out'"):
        parse_settings(Example, [str(f)])


@dataclasses.dataclass(frozen=True)
class OptionalFields:
    """Fields whose default is None and whose type has one type beside it."""

    num_proc: int | None = None
    val_fraction: float | None = None
    run_name: str | None = None
    compile: bool | None = None
    lengths: tuple | None = None


def test_an_optional_field_takes_none_or_its_type(tmp_path):
    """Each value of its field's type beside None, as a non-optional field's is of its
    default's; a text option keeps what was typed, and None where None is its default."""
    got = parse_settings(
        OptionalFields,
        ["--num_proc=4e0", "--val_fraction=1", "--run_name=2024", "--compile", "--lengths=[1, 2]"],
    )
    assert got == OptionalFields(
        num_proc=4, val_fraction=1.0, run_name="2024", compile=True, lengths=(1, 2)
    )
    assert type(got.val_fraction) is float
    assert parse_settings(OptionalFields, ["--run_name=1e400"]).run_name == "1e400"
    assert parse_settings(OptionalFields, ["--run_name=None"]).run_name is None
    for argv, message in (
        (["--num_proc=abc"], "num_proc expects int or None, got 'abc'"),
        (["--val_fraction=abc"], "val_fraction expects float or None, got 'abc'"),
        (["--val_fraction=[]"], "val_fraction expects float or None, got []"),
        (["--compile=maybe"], "compile expects bool or None, got 'maybe'"),
        (["--num_proc"], "--num_proc needs a value"),
    ):
        with pytest.raises(ConfigError) as e:
            parse_settings(OptionalFields, argv)
        assert str(e.value) == message
    f = tmp_path / "c.py"
    f.write_text("num_proc = 'four'\n")  # a config file too
    with pytest.raises(ConfigError, match="num_proc expects int or None, got 'four'"):
        parse_settings(OptionalFields, [str(f)])


def test_an_integer_fits_in_64_bits():
    """What torch's seeds, sizes and thread counts take: beyond, one line, not an overflow."""
    assert parse_settings(Example, [f"--batch_size={2**63 - 1}"]).batch_size == 2**63 - 1
    assert parse_settings(Example, [f"--batch_size={-(2**63)}"]).batch_size == -(2**63)
    for value in (2**63, -(2**63) - 1, "1e30"):
        with pytest.raises(ConfigError, match="batch_size must fit in a signed 64-bit integer"):
            parse_settings(Example, [f"--batch_size={value}"])
    with pytest.raises(ConfigError, match="top_k must fit in a signed 64-bit integer"):
        parse_settings(Example, [f"--top_k={2**64}"])


def test_a_settings_dataclass_is_filled_as_a_dict_is(tmp_path):
    f = tmp_path / "c.py"
    f.write_text("batch_size = 64\n")
    argv = [str(f), "--top_k=5", "--out_dir=1e3"]
    got = parse_settings(Example, argv)
    assert got == Example(batch_size=64, out_dir="1e3", top_k=5)
    assert dataclasses.asdict(got) == parse_args(dataclasses.asdict(Example()), argv)
    with pytest.raises(ConfigError, match="unknown config key 'batch'; did you mean"):
        parse_settings(Example, ["--batch=3"])
    with pytest.raises(ConfigError, match="batch_size expects int"):
        parse_settings(Example, ["--batch_size=many"])


def test_help_shows_every_field_with_its_default_and_comments():
    assert describe_settings(Example).splitlines() == [
        "  # sizes",
        "  --batch_size=12  # sequences per step",
        "  # a comment above the field",
        "  --out_dir='out'",
        "  --top_k=None",
    ]
