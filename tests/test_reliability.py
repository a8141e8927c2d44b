"""Faults through the real command lines: SIGKILL at random moments, Ctrl-C, a
full disk, no memory, a log that cannot be written, and a process of a DDP run
that dies or hangs.

Every failure must leave the last good state on disk and say what happened in
one line on stderr (no traceback). Damaged and hostile files are
tests/test_untrusted_files.py's, bad input tests/test_cli_errors.py's;
docs/reliability.md lists what each test proves.
"""

import concurrent.futures
import errno
import glob
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import (
    error_line,
    file_hash,
    messages,
    own_data_env,
    read_log,
    signal_when_training,
    small_run,
    start_training,
    torchrun,
)
from forker import read

import train
from support.loading import load_checkpoint

REPO = os.path.dirname(os.path.abspath(train.__file__))


# -----------------------------------------------------------------------------
# SIGKILL at random moments, 20 times: nothing is lost and the result is exact

# Seconds from a child's start to its SIGKILL: through start-up, training and saves.
_draw = random.Random(2024)
DELAYS = [_draw.uniform(0.05, 1.0) for _ in range(20)]
SLOW_SAVE_S = 4 * 0.015  # the least a slowed checkpoint write takes; every step writes one
# so the killed runs cannot finish: each step of theirs takes at least SLOW_SAVE_S
KILL_ITERS = 240
assert sum(DELAYS) / SLOW_SAVE_S + len(DELAYS) < KILL_ITERS


def test_sigkill_at_random_moments_loses_nothing(forker, inputs, tmp_path):
    out, straight, log = tmp_path / "out", tmp_path / "straight", str(tmp_path / "children.log")
    common = [
        "--dropout=0.1",
        f"--max_iters={KILL_ITERS}",
        f"--lr_decay_iters={KILL_ITERS}",
        "--always_save_checkpoint=True",
    ]
    # the uninterrupted run, a plain `python train.py`, alongside the killed ones
    reference = subprocess.Popen(
        [sys.executable, "train.py", *small_run(inputs, straight, *common)],
        cwd=REPO,
        env=own_data_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def start(delay, slow=True):
        resume = (
            ["--init_from=resume"] if (out / "ckpt.pt").exists() else []
        )  # the first start: scratch
        return forker.run(
            [
                (
                    "train.py",
                    small_run(inputs, out, *common, *resume),
                    {"delay": delay, "slow": slow, "log": log},
                )
            ]
        )[0]

    iters, mid_write = [], 0
    for kill, delay in enumerate(DELAYS):
        result = start(delay)
        assert result.killed and result.returncode == -signal.SIGKILL, (kill, result.returncode)
        mid_write += bool(
            glob.glob(str(out / "ckpt.pt.tmp.*"))
        )  # the temporary file of a write cut short
        if (out / "ckpt.pt").exists():
            iters.append(load_checkpoint(str(out))["iter_num"])  # complete and loadable, every time
    last = start(delay=None, slow=False)
    assert last.returncode == 0, read(log)[-3000:]
    _, stderr = reference.communicate(timeout=300)
    assert reference.returncode == 0, stderr[-3000:]

    assert iters, "no killed run got as far as its first checkpoint"
    assert iters == sorted(iters) and iters[-1] < KILL_ITERS, iters  # never went back
    assert mid_write >= 1, "no kill landed inside a checkpoint write"
    assert not glob.glob(str(out / "ckpt.pt.tmp.*"))  # leftovers are swept by the next save
    assert "Traceback" not in read(log)

    final, expected = load_checkpoint(str(out)), load_checkpoint(str(straight))
    assert final["iter_num"] == expected["iter_num"] == KILL_ITERS
    assert final["model"].keys() == expected["model"].keys()
    for key in expected["model"]:
        assert torch.equal(final["model"][key], expected["model"][key]), key
    for state, ref in zip(
        final["optimizer"]["state"].values(), expected["optimizer"]["state"].values()
    ):
        for name in ref:
            assert torch.equal(state[name], ref[name]), name
    assert torch.equal(final["rng"]["cpu"], expected["rng"]["cpu"])
    # every evaluation the killed runs logged (some twice, after a resume) is the
    # uninterrupted one's
    straight_log = {
        rec["iter"]: (rec["train_loss"], rec["val_loss"], rec["lr"]) for rec in read_log(straight)
    }
    logged = read_log(out)
    assert [rec["iter"] for rec in logged] == sorted(rec["iter"] for rec in logged)
    for rec in logged:
        assert (rec["train_loss"], rec["val_loss"], rec["lr"]) == straight_log[rec["iter"]], rec
    print(
        f"{len(DELAYS)} kills, {mid_write} inside a checkpoint write, checkpoints at iters {iters}"
    )


# -----------------------------------------------------------------------------
# Ctrl-C, and a full disk


def test_ctrl_c_saves_and_exits_zero(inputs, tmp_path):
    out = tmp_path / "out"
    child = start_training(small_run(inputs, out, "--max_iters=1000000", "--eval_interval=1000000"))
    stdout, stderr = signal_when_training(child, out, signal.SIGINT)
    assert child.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and not messages(stderr)
    stopped = load_checkpoint(str(out))["iter_num"]
    assert stopped >= 1 and f"stopped by SIGINT at iter {stopped}" in stdout


def under_file_limit(command, limit, **env):
    """command (a script and its arguments) run in a process whose files may not grow
    past limit bytes (RLIMIT_FSIZE, which any user may lower): a write past it fails
    part way with EFBIG, as on a full disk with ENOSPC. Nothing in the process is
    replaced."""

    def limit_file_size():
        # a write past the limit then fails instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, *command],
        cwd=REPO,
        env=dict(own_data_env(), **env),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit_file_size,
    )


def train_under_file_limit(inputs, out, limit, *extra):
    """train.py resuming the checkpoint in out, under a file size limit."""
    args = small_run(inputs, out, "--max_iters=4", "--init_from=resume", *extra)
    return under_file_limit(["train.py", *args], limit)


def test_full_disk_keeps_the_previous_checkpoint(inputs, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(inputs["ckpt"], out)
    before = file_hash(out / "ckpt.pt")
    proc = train_under_file_limit(inputs, out, os.path.getsize(out / "ckpt.pt") // 2)
    line = error_line(proc)
    assert proc.returncode == 1
    # the kernel's own reason, not the RuntimeError torch.save turns it into
    assert "could not write checkpoint" in line and os.strerror(errno.EFBIG) in line, line
    assert "previous checkpoint is kept" in line
    assert file_hash(out / "ckpt.pt") == before
    # the half-written temporary file is gone (.lock: out_dir's lock, an empty file)
    assert sorted(os.listdir(out)) == [".lock", "ckpt.pt", "log.jsonl"]


def test_full_disk_at_a_snapshot_says_the_checkpoint_is_kept(inputs, tmp_path):
    """A snapshot is written before ckpt.pt at an evaluation, and has no earlier version
    of its own: its failed write says that ckpt.pt is kept, not that nothing was."""
    out = tmp_path / "out"
    shutil.copytree(inputs["ckpt"], out)
    before = file_hash(out / "ckpt.pt")
    # a snapshot is the weights alone, a third of ckpt.pt (weights and AdamW's two moments)
    limit = os.path.getsize(out / "ckpt.pt") // 6
    line = error_line(train_under_file_limit(inputs, out, limit, "--snapshots=True"))
    assert f"{out / 'snapshots'}" in line and os.strerror(errno.EFBIG) in line, line
    assert line.endswith("no snapshot at iter 3; the last checkpoint is kept"), line
    assert file_hash(out / "ckpt.pt") == before
    assert os.listdir(out / "snapshots") == []


@pytest.mark.parametrize("source", ["one text", "shards"])
def test_full_disk_while_preparing_names_the_file(inputs, tmp_path, source):
    """data/prepare.py's line said `cannot read or write a file (1000002 requested and
    524288 written)` for one text (numpy's words), and named no file for shards."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = "All the world's a stage, and all the men and women merely players.\n" * 300
    for i in range(4):
        (corpus / f"part{i}.txt").write_text(text)
    root = tmp_path / "data"
    if source == "one text":
        args = [str(corpus / "part0.txt"), "--name=full"]
        written = root / "full" / "train.bin"
    else:
        args = [str(corpus), "--tokenizer=gpt2", "--name=full", "--num_proc=1"]
        written = root / "full" / "train_00000.bin"
    command = ["data/prepare.py", *args, f"--data_root={root}"]
    proc = under_file_limit(command, 4_000)
    line = error_line(proc)
    assert proc.returncode == 1
    assert line == f"error: cannot write {written} ({os.strerror(errno.EFBIG)})", line
    assert os.listdir(root / "full") == []  # no part of a dataset, not even a temporary file


@pytest.mark.parametrize("command", ["sample.py", "heads.py"])
def test_full_disk_keeps_the_earlier_results(inputs, tmp_path, command):
    """The maps (sample.py) and the head report (heads.py) of an earlier run stay as they
    were when a new run cannot write its own; they were overwritten one by one, and the
    first file that did not fit was left cut short."""
    out = tmp_path / "out"
    shutil.copytree(inputs["ckpt"], out)
    args = [command, f"--out_dir={out}", f"--data_root={inputs['data']}", "--max_windows=2"]
    folder = out / "heads"
    if command == "sample.py":
        args = [command, f"--out_dir={out}", "--max_new_tokens=8", "--num_samples=1"]
        folder = out / "attention"
    first = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=own_data_env(), capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr[-3000:]
    before = {name: file_hash(folder / name) for name in os.listdir(folder)}
    assert len(before) >= 3, before
    proc = under_file_limit([*args, "--seed=2"], 2_000)
    line = error_line(proc)
    assert proc.returncode == 1  # the run failed: no option caused it (2 is bad input)
    assert f"{folder} ({os.strerror(errno.EFBIG)})" in line, line
    assert {name: file_hash(folder / name) for name in os.listdir(folder)} == before


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_full_disk_while_exporting_is_one_line(inputs, tmp_path, form):
    """export.py's Hugging Face folder ended in safetensors' SafetensorError traceback;
    a GGUF file's line named no file. Neither leaves anything behind."""
    pytest.importorskip("gguf")
    target = tmp_path / "exported"
    if form == "gguf":
        target = tmp_path / "exported.gguf"
    command = ["export.py", f"--init_from={inputs['hf']}", f"--to={target}", f"--format={form}"]
    proc = under_file_limit(command, 100_000)
    line = error_line(proc)
    assert proc.returncode == 1
    assert line.startswith(f"error: cannot write {target} ({os.strerror(errno.EFBIG)})"), line
    assert os.listdir(tmp_path) == []


# torch's own log lines (`W1130 01:57:38.492000 19907 torch/utils/cpp_extension.py:178] No
# CUDA runtime is found, using CUDA_HOME='/usr/local'`): PyPI's CUDA build of torch says so
# where it builds for the CPU on a machine with a CUDA toolkit and no GPU
TORCH_LOG = re.compile(r"^[DIWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] ")


def compile_error_line(proc):
    """error_line of a torch.compile run, torch's own log lines left out."""
    kept = [line for line in proc.stderr.splitlines() if not TORCH_LOG.match(line)]
    return error_line(
        subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, "\n".join(kept))
    )


@pytest.mark.parametrize("command", ["train.py", "sample.py"])
def test_torch_compile_without_a_compiler_is_one_line(inputs, tmp_path, command):
    """--compile=True on a CPU where no C++ compiler runs (CXX names none, as on a laptop
    without build tools): before, torch's InvalidCxxCompiler traceback."""
    out = tmp_path / "out"
    if command == "train.py":
        args = small_run(inputs, out, "--compile=True", "--dtype=float32")
    else:
        shutil.copytree(inputs["ckpt"], out)
        args = [f"--out_dir={out}", "--compile=True", "--max_new_tokens=4", "--attn_dir="]
    env = dict(
        own_data_env(), CXX=str(tmp_path / "no-compiler"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path)
    )
    proc = subprocess.run(
        [sys.executable, command, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = compile_error_line(proc)
    assert proc.returncode == 1
    assert line.startswith("error: torch.compile needs a C++ compiler and found none"), line
    assert line.endswith("install g++ or clang, or pass --compile=False"), line


def test_torch_compile_s_cache_that_cannot_grow_is_one_line(inputs, tmp_path):
    """torch.compile writes its kernels into its cache (TORCHINDUCTOR_CACHE_DIR, or a folder
    in /tmp) during the first step; a full disk there ended in InductorError's traceback.
    Under a file size limit, as on a full disk (a real full one said the same)."""
    cache = tmp_path / "cache"
    command = ["train.py", *small_run(inputs, tmp_path / "out", "--compile=True")]
    proc = under_file_limit(command, 5_000, TORCHINDUCTOR_CACHE_DIR=str(cache))
    line = compile_error_line(proc)
    assert proc.returncode == 1
    reason = os.strerror(errno.EFBIG)
    assert line.startswith(f"error: cannot write torch.compile's cache in {cache} ({reason})")
    assert "set TORCHINDUCTOR_CACHE_DIR to a folder that can be written" in line, line


def test_output_closed_by_its_reader_is_one_line(inputs, tmp_path):
    """`python train.py ... | head -1`: the next line printed met a closed pipe, and
    BrokenPipeError's traceback followed."""
    out = tmp_path / "out"
    child = start_training(small_run(inputs, out, "--max_iters=100000", "--eval_interval=2"))
    child.stdout.readline()  # the run's first line, as `head -1` reads it
    child.stdout.close()
    stderr = child.stderr.read()
    assert child.wait(timeout=120) == 1
    assert "Traceback" not in stderr, stderr[-3000:]
    line = messages(stderr)[-1]
    assert line.startswith("error: the output's reader went away (Broken pipe"), line


def no_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("fault", ["no memory while training", "log not writable"])
def test_resource_faults_keep_the_checkpoint(inputs, tmp_path, monkeypatch, capsys, fault):
    """In process, with the fault injected where it would happen: a GPU's out of memory
    (no GPU here; a CPU's is real, below) and a log that cannot be appended to."""
    out = tmp_path / "out"
    shutil.copytree(inputs["ckpt"], out)
    before = file_hash(out / "ckpt.pt")
    if fault == "no memory while training":
        monkeypatch.setattr(train, "forward_backward", no_memory)
    else:
        os.remove(out / "log.jsonl")
        os.mkdir(out / "log.jsonl")  # appending to it fails, as on a full or read-only disk
    with pytest.raises(SystemExit) as exit_info:
        train.main(small_run(inputs, out, "--max_iters=4", "--init_from=resume"))
    lines = messages(capsys.readouterr().err)
    assert len(lines) == 1, lines
    expected = {
        "no memory while training": (1, "out of memory while training; lower --batch_size"),
        "log not writable": (1, "log.jsonl (Is a directory); the last checkpoint is kept"),
    }[fault]
    assert exit_info.value.code == expected[0] and expected[1] in lines[0], lines[0]
    assert file_hash(out / "ckpt.pt") == before


# train.main under a real memory limit: RLIMIT_AS, set once torch and the project are
# loaded, to what the process maps then and 1.5 GiB more
LOW_MEMORY = """
import os, resource, sys
sys.path.insert(0, os.getcwd())
import train

with open("/proc/self/status") as f:
    mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (mapped + 1536 * 2**20, resource.RLIM_INFINITY))
train.main(sys.argv[1:])
"""


@pytest.mark.parametrize("fault", ["model", "batch"])
def test_out_of_cpu_memory_is_one_line(inputs, tmp_path, fault):
    """The CPU's allocator refusing for real: a model of 4 GiB of float32 weights, or a
    resumed run's batch whose activations pass the limit, where 2 GiB would do."""
    out = tmp_path / "out"
    wrapper = tmp_path / "low_memory.py"
    wrapper.write_text(LOW_MEMORY)
    if fault == "model":
        # 12 layers of 12 x 5120^2 weights: 3.8G parameters
        extra = ["--n_layer=12", "--n_embd=5120", "--n_head=8", "--dtype=float32"]
        args = small_run(inputs, out, *extra)
    else:
        shutil.copytree(inputs["ckpt"], out)
        extra = ["--max_iters=4", "--init_from=resume", "--batch_size=200000"]
        args = small_run(inputs, out, *extra)
    before = file_hash(out / "ckpt.pt") if fault == "batch" else None
    proc = subprocess.run(
        [sys.executable, str(wrapper), *args],
        cwd=REPO,
        env=own_data_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = error_line(proc)
    if fault == "model":
        assert proc.returncode == 2
        assert line.startswith("error: out of memory building the model"), line
        assert not os.path.exists(out / "ckpt.pt")
    else:
        assert proc.returncode == 1
        assert line.startswith("error: out of memory while training; lower --batch_size"), line
        assert line.endswith("the last checkpoint is kept"), line
        assert file_hash(out / "ckpt.pt") == before


# -----------------------------------------------------------------------------
# Data parallel: a process that dies or hangs stops the others, with a message

DDP_FAULT = """
import os, signal, sys, time
sys.path.insert(0, os.getcwd())
import train

fault, step = sys.argv[1], train.forward_backward
calls = [0]

def faulty_step(r, x, y, before):
    calls[0] += 1
    if r.rank == 1 and calls[0] == 2:  # after one step together
        if fault == "die":
            os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(600)  # stuck, e.g. on a dead file system
    return step(r, x, y, before)

train.forward_backward = faulty_step
train.main(sys.argv[2:])
"""


@pytest.mark.exclusive
def test_ddp_rank_failure_stops_all_ranks(inputs, tmp_path):
    wrapper = tmp_path / "ddp_fault.py"
    wrapper.write_text(DDP_FAULT)
    timeout = 5

    def launch(fault):
        argv = small_run(
            inputs,
            tmp_path / fault,
            "--max_iters=50",
            "--eval_interval=1000",
            "--gradient_accumulation_steps=2",
            f"--ddp_timeout={timeout}",
        )
        t0 = time.monotonic()
        proc = torchrun(2, [fault, *argv], timeout=120, script=str(wrapper))
        return proc, time.monotonic() - t0

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(("die", "hang"), pool.map(launch, ("die", "hang"))))
    for fault, (proc, seconds) in results.items():
        assert proc.returncode != 0 and seconds < 90, (fault, seconds)
        output = proc.stdout + proc.stderr
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "process 0 lost contact with the others" in errors[0], output[
            -4000:
        ]
        if fault == "hang":
            assert "Timed out" in errors[0], errors[0]  # ended by ddp_timeout
        assert 'train.py", line' not in output, output[-4000:]  # no traceback from train.py itself
