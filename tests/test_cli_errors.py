"""Bad input through the command lines (train.py, sample.py, data/prepare.py): one
line each, with its exit code, and nothing written; and train.py's settings on
random command lines raise only its own one-line errors. docs/reliability.md
lists what each test proves.
"""

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import typing

import pytest
import torch
from conftest import ROOT, child_env, error_line, small_run
from hypothesis import given, settings
from hypothesis import strategies as st

import bench.__main__
import explore
import export
import heads
import sample
import train
from data import prepare
from support.checkpoint import checkpoint_path
from support.configurator import ConfigError, parse_settings

# -----------------------------------------------------------------------------
# Bad input through the command lines: one line each, and nothing written

NO_GPU = "this machine has a GPU" if torch.cuda.is_available() else None

# script -> {name: (argv, what the line must say)}; {hf} is the GPT-2 folder,
# {scratch} a folder for this table. train.py gets a tiny valid setup first, and
# sample.py, heads.py and explore.py a trained checkpoint, so each row tests one thing.
BAD_INPUT = {
    "train.py": {
        "unknown key": (["--batch_sze=3"], ["unknown config key", "'batch_size'"]),
        "a key in capitals": (["--BATCH_SIZE=3"], ["unknown config key", "'batch_size'"]),
        "a setting without its dashes": (
            ["batch_size=3"],
            ["config file not found: batch_size=3; a setting is written --batch_size=3"],
        ),
        "wrong type": (["--batch_size=abc"], ["batch_size expects int", "abc"]),
        "not a boolean": (["--bias=maybe"], ["bias expects bool"]),
        "n_layer=0": (["--n_layer=0"], ["n_layer must be a positive integer"]),
        "batch_size=0": (["--batch_size=0"], ["batch_size must be a positive integer"]),
        "block_size=-1": (["--block_size=-1"], ["block_size must be a positive integer"]),
        "max_iters=-5": (["--max_iters=-5"], ["max_iters must be", ">= 0"]),
        "negative learning_rate": (["--learning_rate=-1e-3"], ["learning_rate must be"]),
        "infinite learning_rate": (["--learning_rate=1e999"], ["learning_rate must be a finite"]),
        "lr_decay_time=-60": (["--lr_decay_time=-60"], ["lr_decay_time must be a finite number"]),
        "seq_warmup without lr_decay_time": (
            ["--seq_warmup=True"],
            ["seq_warmup warms up over lr_decay_time, which is 0", "--lr_decay_time"],
        ),
        "seq_warmup with a block_size not a multiple of 4": (
            ["--seq_warmup=True", "--lr_decay_time=60", "--block_size=18"],
            ["block_size 18 is not a multiple of 4"],
        ),
        "seq_warmup with context parallelism": (
            ["--seq_warmup=True", "--lr_decay_time=60", "--context_parallel=2"],
            ["seq_warmup cuts the sequences", "--context_parallel=1"],
        ),
        "beta2=1": (["--beta2=1.0"], ["beta2 must be in [0, 1)"]),
        "dropout=1.5": (["--dropout=1.5"], ["dropout must be in [0, 1)"]),
        "attn_dropout=2": (["--attn_dropout=2"], ["attn_dropout must be None or in [0, 1)"]),
        "attn_dropout=abc": (["--attn_dropout=abc"], ["attn_dropout expects float or None"]),
        "n_embd not divisible by n_head": (
            ["--n_embd=30", "--n_head=4"],
            ["n_embd (30) must be divisible by n_head (4)"],
        ),
        "seed past 64 bits": ([f"--seed={2**64}"], ["seed must fit"]),
        "block_size above the pretrained model's": (
            ["--dataset=small_gpt2", "--init_from={hf}", "--block_size=64"],
            ["block_size 64 is larger than the pretrained model's 32"],
        ),
        "unknown dataset": (
            ["--dataset=no_such_data"],
            ["unknown dataset 'no_such_data'", "data/prepare.py"],
        ),
        "dataset smaller than one block": (
            ["--dataset=tiny"],
            ["val split", "has 3 tokens", "block_size + 1 = 17"],
        ),
        "float16 on a CPU": (["--dtype=float16"], ["float16 training needs CUDA"]),
        "--device=cuda without a GPU": (["--device=cuda"], ["no CUDA GPU is available"]),
        "out_dir is a file": (["--out_dir={scratch}/a_file"], ["cannot write into out_dir"]),
        "config file that raises": (
            ["{scratch}/raises.py"],
            ["error in config file", "ZeroDivisionError"],
        ),
        "missing config file": (["config/no_such_file.py"], ["config file not found"]),
        "resume without a checkpoint": (["--init_from=resume"], ["no checkpoint at"]),
        # the window was ignored: linear attention's state sums the whole past
        "a window on linear attention": (
            ["--attention=linear", "--sliding_window=8"],
            ["sliding_window and sink_tokens shape softmax attention", "drop them"],
        ),
        # the heads were probed at the first evaluation: a traceback, perhaps after hours
        "log_heads on a model too small for its probe": (
            ["--block_size=2", "--log_heads=True"],
            ["log_heads=True: the induction probe needs block_size >= 4", "this model has 2"],
        ),
    },
    "sample.py": {
        "sample: unknown option": (["--temprature=0.5"], ["did you mean 'temperature'"]),
        "sample: wrong type": (["--max_new_tokens=many"], ["max_new_tokens expects int"]),
        "sample: max_new_tokens=0": (["--max_new_tokens=0"], ["--max_new_tokens must be"]),
        "sample: num_samples=-1": (["--num_samples=-1"], ["--num_samples must be"]),
        "sample: top_p=1.5": (["--top_p=1.5"], ["--top_p must be in (0, 1]"]),
        "sample: seed past 64 bits": (["--seed=1e30"], ["seed must fit in a signed 64-bit"]),
        "sample: character outside the vocabulary": (
            ["--prompt=ROMEO \u2603"],
            ["'\u2603'", "not in the vocabulary"],
        ),
        "sample: prompt file not UTF-8": (["--prompt=FILE:{scratch}/bytes"], ["UTF-8"]),
        "sample: --device=cuda without a GPU": (["--device=cuda"], ["no CUDA GPU"]),
        "sample: init_from nowhere": (["--init_from=/no/such/folder"], ["no such file or folder"]),
        # a file given where a checkpoint goes was called a damaged checkpoint, to delete
        "sample: init_from a file that is no checkpoint": (
            ["--init_from={scratch}/bytes"],
            ["{scratch}/bytes is not a checkpoint; pass a checkpoint (ckpt.pt"],
        ),
        "sample: init_from a Hugging Face folder's weights": (
            ["--init_from={hf}/model.safetensors"],
            ["model.safetensors is not a checkpoint; pass its folder, {hf}, which holds"],
        ),
    },
    "heads.py": {
        "heads: max_windows=-1": (["--max_windows=-1"], ["--max_windows"]),
        "heads: misspelt option": (["--max_windos=3"], ["did you mean 'max_windows'"]),
        "heads: unknown dataset": (["--dataset=nothing-here"], ["unknown dataset 'nothing-here'"]),
        "heads: seed past 64 bits": ([f"--seed={2**64}"], ["seed must fit in a signed 64-bit"]),
    },
    "explore.py": {
        "explore: port=70000": (["--port=70000"], ["--port"]),
        "explore: out_dir nowhere": (["--out_dir=/nonexistent/folder"], ["/nonexistent/folder"]),
        "explore: misspelt option": (["--prot=8000"], ["did you mean 'port'"]),
        "explore: threads past 64 bits": ([f"--threads={2**70}"], ["threads must fit"]),
        # OpenMP killed the process on its first matmul, without a word
        "explore: a billion threads": (["--threads=1e9"], ["(this machine's cores)"]),
        # an address no machine has (RFC 5737's TEST-NET-1): the host is at fault, not the port
        "explore: host not of this machine": (["--host=192.0.2.1"], ["pass another --host"]),
        # an empty host listens on every interface, as 0.0.0.0 does
        "explore: empty host": (["--host="], ["--host is empty", "0.0.0.0"]),
    },
    "data/prepare.py": {
        "prepare: too little text": (
            ["{scratch}/one.txt", "--data_root", "{scratch}"],
            ["too few to split"],
        ),
        # these two exited 1, as a corpus that cannot be prepared does
        "prepare: val_fraction above 1": (
            ["{scratch}/one.txt", "--val_fraction=1.5", "--data_root", "{scratch}"],
            ["--val_fraction must be between 0 and 1, got 1.5"],
        ),
        "prepare: an unknown tokenizer": (
            ["{scratch}/one.txt", "--tokenizer=sentencepiece", "--data_root", "{scratch}"],
            ["unknown --tokenizer 'sentencepiece'", "bpe:VOCAB"],
        ),
        # options of a corpus of documents, given for one text: they did nothing, silently
        "prepare: --val_docs for one text": (
            ["{scratch}/one.txt", "--val_docs=1", "--data_root", "{scratch}"],
            ["one.txt is prepared as one text", "only a corpus of documents takes --val_docs"],
        ),
        "prepare: --text_column and --shard_tokens for one text": (
            [
                "{scratch}/one.txt",
                "--tokenizer=gpt2",
                "--text_column=body",
                "--shard_tokens=1000",
                "--data_root",
                "{scratch}",
            ],
            ["takes --text_column and --shard_tokens: leave it out"],
        ),
    },
}
# bad input exits 2; a run that failed, 1: a text too short to split
EXIT_CODE = {"train.py": 2, "sample.py": 2, "heads.py": 2, "explore.py": 2, "data/prepare.py": 2}
FAILED_RUNS = {"prepare: too little text"}
# name -> the script of its row, in the table's order
SCRIPT = {name: script for script, rows in BAD_INPUT.items() for name in rows}
NEEDS_NO_GPU = {"--device=cuda without a GPU", "sample: --device=cuda without a GPU"}


@pytest.fixture(scope="module")
def bad_runs(forker, inputs):
    scratch = os.path.join(inputs["root"], "bad-input")
    os.makedirs(scratch)
    for name, data in (
        ("a_file", b"not a folder"),
        ("raises.py", b"batch_size = 1 // 0\n"),
        ("bytes", b"\xff\xfe\x00 not text"),
        ("one.txt", b"x"),
    ):
        with open(os.path.join(scratch, name), "wb") as f:
            f.write(data)
    jobs = {}
    for k, (name, script) in enumerate(SCRIPT.items()):
        argv, _ = BAD_INPUT[script][name]
        argv = [a.format(hf=inputs["hf"], scratch=scratch) for a in argv]
        if script == "train.py":
            argv = small_run(inputs, os.path.join(scratch, f"out{k}")) + argv
        elif script == "sample.py":
            argv = [f"--out_dir={inputs['ckpt']}", "--attn_dir", "", "--max_new_tokens=3"] + argv
        elif script in ("heads.py", "explore.py"):
            argv = [f"--out_dir={inputs['ckpt']}"] + argv
        # a command that does not stop (explore.py serving, say) is killed, and fails its row
        jobs[name] = (script, argv, {"delay": 120})
    before = sorted(os.listdir(scratch))
    results = dict(zip(jobs, forker.run(list(jobs.values()), workers=3)))
    after = sorted(os.listdir(scratch))
    return {"results": results, "before": before, "after": after, **inputs}


@pytest.mark.parametrize("name", list(SCRIPT))
def test_bad_input_is_one_line(bad_runs, name):
    if name in NEEDS_NO_GPU and NO_GPU:
        pytest.skip(NO_GPU)
    script = SCRIPT[name]
    _, needles = BAD_INPUT[script][name]
    proc = bad_runs["results"][name]
    line = error_line(proc)
    if name in FAILED_RUNS:
        assert proc.returncode == 1, line
    else:
        assert proc.returncode == EXIT_CODE[script], line
    scratch = os.path.join(bad_runs["root"], "bad-input")
    for needle in needles:
        assert needle.format(hf=bad_runs["hf"], scratch=scratch) in line, line
    assert "delete it" not in line  # the user's file, or no file at all
    assert bad_runs["after"] == bad_runs["before"]  # no output folder, checkpoint or dataset made


def run_from(folder, script, *argv):
    """The project's script, called by its path from another folder."""
    command = [sys.executable, os.path.join(ROOT, script), *argv]
    return subprocess.run(command, cwd=folder, env=child_env(), capture_output=True, text=True)


def test_a_config_file_named_from_another_folder_points_to_the_repositorys(tmp_path):
    # the README's command with train.py called by its path from another folder: the
    # config file's path is from that folder, where there is none
    proc = run_from(tmp_path, "train.py", "config/shakespeare_cpu.py")
    line = error_line(proc)
    assert proc.returncode == 2
    in_repo = os.path.join(ROOT, "config", "shakespeare_cpu.py")
    assert line == (
        f"error: config file not found: config/shakespeare_cpu.py in {tmp_path}; "
        f"the repository's is {in_repo}"
    )
    assert os.listdir(tmp_path) == []
    # a file the repository lacks as well gets no such pointer
    proc = run_from(tmp_path, "train.py", "config/no_such.py")
    assert error_line(proc) == "error: config file not found: config/no_such.py"


def test_a_missing_checkpoint_names_the_folders_beside_it_that_hold_one(inputs, tmp_path):
    # the CPU recipe trained into its own out_dir, then sample.py run with its default
    # (the main command's out_dir), from the folder both are in
    os.makedirs(tmp_path / "out-shakespeare-char-cpu")
    shutil.copy(checkpoint_path(inputs["ckpt"]), tmp_path / "out-shakespeare-char-cpu")
    argv = ["--max_new_tokens=3", "--num_samples=1", "--attn_dir="]
    proc = run_from(tmp_path, "sample.py", *argv)
    # the command run from this folder, the repository elsewhere: train.py by its path
    train = f"python {ROOT}/train.py {ROOT}/config/shakespeare.py"
    assert error_line(proc) == (
        "error: no checkpoint at out-shakespeare-char; out-shakespeare-char-cpu holds one: "
        f"--out_dir=out-shakespeare-char-cpu, or train one with `{train}`"
    )
    # the folder it names is one
    proc = run_from(tmp_path, "sample.py", *argv, "--out_dir=out-shakespeare-char-cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # none beside it: the pointer alone
    proc = run_from(tmp_path, "sample.py", *argv, f"--out_dir={tmp_path / 'a' / 'b'}")
    assert error_line(proc) == (
        f"error: no checkpoint at {tmp_path / 'a' / 'b'}; point --out_dir at one, "
        f"or train one with `{train}`"
    )
    # more than three beside it: three named, and how many more (before, three alone)
    for name in ("run-a", "run-b", "run-c", "run-d"):
        os.makedirs(tmp_path / name)
        shutil.copy(checkpoint_path(inputs["ckpt"]), tmp_path / name)
    proc = run_from(tmp_path, "sample.py", *argv)
    assert error_line(proc).startswith(
        "error: no checkpoint at out-shakespeare-char; out-shakespeare-char-cpu, run-a, run-b "
        "and 2 more hold one: --out_dir=out-shakespeare-char-cpu, "
    )
    # from the repository's root, as the README runs it, the command as it types it
    proc = run_from(ROOT, "sample.py", *argv, f"--out_dir={tmp_path / 'a' / 'b'}")
    assert error_line(proc).endswith("train one with `python train.py config/shakespeare.py`")


def test_the_folder_a_missing_checkpoint_names_can_be_pasted(inputs, tmp_path):
    """The option the line names works pasted into a shell as it is printed, for a
    folder with a space and a quote in its name, and for the option that was given."""
    mine = tmp_path / "my runs" / "o'brien 1"
    os.makedirs(mine)
    shutil.copy(checkpoint_path(inputs["ckpt"]), mine)
    os.makedirs(tmp_path / "my runs" / "empty")
    argv = ["--max_new_tokens=3", "--num_samples=1", "--attn_dir="]
    for option in ("--out_dir", "--init_from"):
        proc = run_from(tmp_path, "sample.py", *argv, f"{option}=my runs/empty")
        line = error_line(proc)
        assert line.startswith("error: no checkpoint at my runs/empty") and proc.returncode == 2
        pasted = line.split(" holds one: ")[1].split(", or train one")[0]
        assert pasted == f"{option}='my runs/o'\"'\"'brien 1'"
        script = shlex.join([sys.executable, os.path.join(ROOT, "sample.py"), *argv])
        proc = subprocess.run(
            f"{script} {pasted}",
            shell=True,
            cwd=tmp_path,
            env=child_env(),
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]


# -----------------------------------------------------------------------------
# train.py's settings: random command lines give its own errors or a usable config

KEYS = sorted(field.name for field in dataclasses.fields(train.Settings))
VALUES = st.one_of(
    st.integers(-3, 2**65),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(
        [
            "[1]",
            "(1, 2)",
            "{}",
            "1e999",
            "-0",
            "nan",
            "'x'",
            "None",
            "__import__('os').getcwd()",
            "gpt2",
            "resume",
            "cuda",
        ]
    ),
)
ARG = st.one_of(
    st.builds(lambda k, v: f"--{k}={v}", st.sampled_from(KEYS), VALUES),
    st.builds(lambda k: f"--{k}", st.sampled_from(KEYS)),
    st.builds(lambda s: "--" + s, st.text(max_size=10)),
    st.text(max_size=10),  # a config file path, almost surely missing
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ARG, max_size=6))
def test_train_settings_raise_only_user_errors(argv):
    argv = [a for a in argv if a.startswith("--") or not os.path.exists(a)]  # never run a real file
    try:
        cfg = train.get_config(argv)
    except (ConfigError, ValueError) as e:  # what train.py prints as one line
        assert str(e) and "\n" not in str(e)
        return
    for field in dataclasses.fields(cfg):
        if field.default is not None:
            assert type(getattr(cfg, field.name)) is type(field.default), field.name


# -----------------------------------------------------------------------------
# Every command's settings: what its parser accepts is of each field's type

COMMANDS = {
    "train.py": train.Settings,
    "sample.py": sample.Settings,
    "heads.py": heads.Settings,
    "explore.py": explore.Settings,
    "export.py": export.Settings,
    "data/prepare.py": prepare.Settings,
    "python -m bench": bench.__main__.Settings,
}


@pytest.mark.parametrize("command", list(COMMANDS))
@settings(max_examples=150, deadline=None)
@given(draws=st.data())
def test_every_command_takes_each_setting_of_its_type_or_says_why(command, draws):
    """A value a command's parser lets through is of its field's type (None only where
    the type has it, an integer within the 64 bits torch takes), or it is one line: what
    a command then checks (a range, a file) meets the type it was written for."""
    cls = COMMANDS[command]
    keys = sorted(field.name for field in dataclasses.fields(cls))
    option = st.builds(lambda k, v: f"--{k}={v}", st.sampled_from(keys), VALUES)
    argv = draws.draw(st.lists(option, max_size=6))
    try:
        cfg = parse_settings(cls, argv, allow_files=False)
    except ConfigError as e:
        assert str(e) and "\n" not in str(e)
        return
    hints = typing.get_type_hints(cls)
    for key in keys:
        value = getattr(cfg, key)
        kinds = typing.get_args(hints[key]) or (hints[key],)
        assert type(value) in kinds, (key, value)
        if type(value) is int:
            assert -(2**63) <= value < 2**63, (key, value)


# -----------------------------------------------------------------------------
# support/cli.py: what any command's run meets


@dataclasses.dataclass
class Sizes:
    n: int = 2**50  # bytes: a petabyte, more than any machine's memory


def test_the_cpu_running_out_of_memory_is_one_line(capsys):
    """The CPU's allocator refuses a tensor with a RuntimeError (CUDA's is
    torch.OutOfMemoryError): any command run through cli.run says so in one line,
    with the size asked for, and exits 1, as a run that failed."""
    from support import cli

    def main(cfg):
        torch.empty(cfg.n, dtype=torch.uint8)  # the real allocator, asked too much

    assert cli.run(main, [], "doc", Sizes) == 1
    err = capsys.readouterr().err
    assert err == (
        "error: out of memory (one tensor of 1048576.0 GiB); "
        "ask for less: smaller sizes, or fewer at once\n"
    )
    # any other RuntimeError is a bug, and keeps its traceback
    with pytest.raises(RuntimeError, match="shape"):
        cli.run(lambda cfg: torch.zeros(2).view(3), [], "doc", Sizes)


@pytest.mark.parametrize("script", ["train.py", "heads.py", "compare.py"])
def test_help_into_a_reader_that_stopped_is_quiet(script):
    """`python train.py --help | head`: the reader has gone before the help is written (its
    end of the pipe closed first, as head's is once it has its lines). The command ends as
    --help does, with no traceback of the broken pipe."""
    proc = subprocess.Popen(
        [sys.executable, script, "--help"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and stderr == "", stderr[-2000:]
