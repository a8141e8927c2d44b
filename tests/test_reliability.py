"""Faults, bad inputs and untrusted files, through the real command lines.

Every failure must leave the last good state on disk and say what happened in
one line on stderr (no traceback); a file that would run code when loaded is
refused without running it. docs/reliability.md lists what each test proves.
"""

import concurrent.futures
import dataclasses
import glob
import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile

import pytest
import torch
from conftest import read_log, signal_when_training, start_training, tiny_run, torchrun
from hypothesis import given, settings
from hypothesis import strategies as st

import support.loading
import train
from data.text import prepare_text
from support.checkpoint import load_checkpoint
from support.configurator import ConfigError

REPO = os.path.dirname(os.path.abspath(train.__file__))
# the tiny run, smaller still: one layer, a context of 16
RUN = dict(n_layer=1, block_size=16, batch_size=4, eval_iters=1, min_lr=6e-5, seed=11)
# tqdm's progress bar shares stderr with the error line; its updates are not messages
PROGRESS = re.compile(r"\d+%\||it/s|\d+it \[")


def child_env():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TINYSHAKESPEARE_PATH", None)  # no dataset may be prepared from elsewhere
    return env


def messages(stderr):
    """stderr's lines less the progress bars (and the blank lines that clear a nested bar)."""
    lines = (line.replace("\x1b[A", "") for line in stderr.splitlines())
    return [line for line in lines if line.strip() and not PROGRESS.search(line)]


def error_line(proc):
    """The single line a failed command printed, after checking that is all it printed."""
    assert proc.returncode not in (0, None), proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = messages(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


def file_hash(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class RunsCode:
    """Unpickling this runs a shell command: what a hostile file would hold."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


# -----------------------------------------------------------------------------
# Shared inputs: datasets, a trained checkpoint, a Hugging Face GPT-2 folder


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, corpus_path):
    root = tmp_path_factory.mktemp("reliability")
    data = str(root / "data")
    with open(corpus_path, encoding="utf-8") as f:
        text = f.read()
    prepare_text(
        text[:20_000], os.path.join(data, "small"), "char"
    )  # small enough to copy and damage
    prepare_text(text[:4_000], os.path.join(data, "small_gpt2"), "gpt2")
    prepare_text(
        "hello there, general kenobi\n", os.path.join(data, "tiny"), "char"
    )  # val: 3 tokens

    transformers = pytest.importorskip("transformers")
    hf = root / "gpt2-tiny"
    config = transformers.GPT2Config(n_positions=32, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(hf)

    ckpt_dir = str(root / "trained")
    train.main(tiny_run(data, ckpt_dir, dataset="small", max_iters=2, eval_interval=2, **RUN))
    return {"root": str(root), "data": data, "hf": str(hf), "ckpt": ckpt_dir}


def train_args(inputs, out_dir, *extra, dataset="small"):
    return tiny_run(
        inputs["data"], out_dir, *extra, dataset=dataset, max_iters=2, eval_interval=1, **RUN
    )


# -----------------------------------------------------------------------------
# Running the command lines many times, fast

# A process that imports torch and the project once, then forks one child per
# command and runs the script in it as __main__, with its argv, working folder
# and output files: the command line exactly as `python train.py ...` runs it,
# without paying the interpreter's start-up each time. A request is one JSON
# line {"jobs": [...], "workers": n}; each job may give a delay after which the
# child is SIGKILLed, and "slow" to make checkpoint writes slow (four chunks
# with pauses between them, so that kills land inside the writes).
FORKER = r"""
import io, json, os, runpy, signal, sys, time, traceback
sys.path.insert(0, os.getcwd())
import torch
import torch._dynamo  # torch.optim imports it on first use: seconds, better spent once here
import sample, train  # noqa: F401  (imported once, for every child)
from support import attention_maps  # noqa: F401
import data.dataset  # noqa: F401

real_save, slow = torch.save, [False]


def save(obj, f, *args, **kwargs):
    if not slow[0]:
        return real_save(obj, f, *args, **kwargs)
    buf = io.BytesIO()
    real_save(obj, buf, *args, **kwargs)
    data = buf.getvalue()
    step = len(data) // 4 + 1
    for i in range(0, len(data), step):
        f.write(data[i:i + step])
        f.flush()
        time.sleep(0.015)


torch.save = save


def child(job):
    code = 1
    try:
        os.chdir(job["cwd"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND), 1)
        os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND), 2)
        slow[0] = job["slow"]
        sys.argv = [job["script"], *job["argv"]]
        sys.path[0] = os.path.dirname(os.path.abspath(job["script"]))  # as `python script` sets it
        runpy.run_path(job["script"], run_name="__main__")
        code = 0
    except SystemExit as e:  # what the interpreter does with it
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(jobs, workers):
    results, running, queue = [None] * len(jobs), {}, list(range(len(jobs)))
    while queue or running:
        while queue and len(running) < workers:
            i = queue.pop(0)
            pid = os.fork()
            if pid == 0:
                child(jobs[i])
            delay = jobs[i]["delay"]
            running[pid] = (i, None if delay is None else time.monotonic() + delay)
        for pid, (i, deadline) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            killed = not done and deadline is not None and time.monotonic() >= deadline
            if killed:
                os.kill(pid, signal.SIGKILL)  # not reaped yet, so the pid is still this child's
                done, status = os.waitpid(pid, 0)
            if done:
                del running[pid]
                results[i] = {"killed": killed, "code": os.waitstatus_to_exitcode(status)}
        time.sleep(0.002)
    return results


for line in sys.stdin:
    request = json.loads(line)
    print(json.dumps(run(request["jobs"], request["workers"])), flush=True)
"""


class Forker:
    def __init__(self, folder):
        self.folder, self.count = folder, 0
        script = os.path.join(folder, "forker.py")
        with open(script, "w") as f:
            f.write(FORKER)
        self.proc = subprocess.Popen(
            [sys.executable, script],
            cwd=REPO,
            env=child_env(),
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def run(self, jobs, workers=1):
        """jobs: [(script, argv)] or [(script, argv, options)]; options: cwd, delay, slow, log
        (one file for stdout and stderr, appended to). Returns CompletedProcess-likes
        with .killed added."""
        requests, outputs = [], []
        for script, argv, *options in jobs:
            options = options[0] if options else {}
            self.count += 1
            out = options.get("log") or os.path.join(self.folder, f"{self.count}.out")
            err = options.get("log") or os.path.join(self.folder, f"{self.count}.err")
            requests.append(
                {
                    "script": os.path.join(REPO, script),
                    "argv": [str(a) for a in argv],
                    "cwd": str(options.get("cwd", REPO)),
                    "delay": options.get("delay"),
                    "slow": options.get("slow", False),
                    "stdout": out,
                    "stderr": err,
                }
            )
            outputs.append((out, err))
        self.proc.stdin.write(json.dumps({"jobs": requests, "workers": workers}) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, "the forker died"
        results = []
        for request, (out, err), result in zip(requests, outputs, json.loads(reply)):
            proc = subprocess.CompletedProcess(
                request["argv"], result["code"], read(out), read(err)
            )
            proc.killed = result["killed"]
            results.append(proc)
        return results

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def read(path):
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


@pytest.fixture(scope="module")
def forker(tmp_path_factory):
    f = Forker(str(tmp_path_factory.mktemp("forker")))  # imports while the inputs are made
    yield f
    f.close()


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
        [sys.executable, "train.py", *train_args(inputs, straight, *common)],
        cwd=REPO,
        env=child_env(),
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
                    train_args(inputs, out, *common, *resume),
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
    child = start_training(
        train_args(inputs, out, "--max_iters=1000000", "--eval_interval=1000000")
    )
    stdout, stderr = signal_when_training(child, out, signal.SIGINT)
    assert child.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and not messages(stderr)
    stopped = load_checkpoint(str(out))["iter_num"]
    assert stopped >= 1 and f"stopped by SIGINT at iter {stopped}" in stdout


DISK_FULL = """
import errno, os, sys
sys.path.insert(0, os.getcwd())
import torch
import train

def disk_full(obj, f, *args, **kwargs):
    f.write(b"PK\\x03\\x04 half a checkpoint")  # some bytes got out before the disk filled up
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

torch.save = disk_full
train.main(sys.argv[1:])
"""


def test_full_disk_keeps_the_previous_checkpoint(inputs, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(inputs["ckpt"], out)
    before = file_hash(out / "ckpt.pt")
    wrapper = tmp_path / "disk_full.py"
    wrapper.write_text(DISK_FULL)
    proc = subprocess.run(
        [
            sys.executable,
            str(wrapper),
            *train_args(inputs, out, "--max_iters=4", "--init_from=resume"),
        ],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = error_line(proc)
    assert proc.returncode == 1
    assert "could not write checkpoint" in line and "No space left on device" in line
    assert "previous checkpoint is kept" in line
    assert file_hash(out / "ckpt.pt") == before
    assert sorted(os.listdir(out)) == [
        "ckpt.pt",
        "log.jsonl",
    ]  # the half-written temporary file is gone


def no_memory(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def no_cpu_memory(*args, **kwargs):
    raise RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"
    )


@pytest.mark.parametrize(
    "fault", ["no memory for the model", "no memory while training", "log not writable"]
)
def test_resource_faults_keep_the_checkpoint(inputs, tmp_path, monkeypatch, capsys, fault):
    """In process, with the fault injected where it would happen."""
    out = tmp_path / "out"
    shutil.copytree(inputs["ckpt"], out)
    before = file_hash(out / "ckpt.pt")
    if fault == "no memory for the model":
        monkeypatch.setattr(support.loading, "GPT", no_cpu_memory)  # resuming builds the model
    elif fault == "no memory while training":
        monkeypatch.setattr(train, "forward_backward", no_memory)
    else:
        os.remove(out / "log.jsonl")
        os.mkdir(out / "log.jsonl")  # appending to it fails, as on a full or read-only disk
    with pytest.raises(SystemExit) as exit_info:
        train.main(train_args(inputs, out, "--max_iters=4", "--init_from=resume"))
    lines = messages(capsys.readouterr().err)
    assert len(lines) == 1, lines
    expected = {
        "no memory for the model": (2, "out of memory building the model"),
        "no memory while training": (1, "out of memory while training; lower --batch_size"),
        "log not writable": (1, "log.jsonl (Is a directory); the last checkpoint is kept"),
    }[fault]
    assert exit_info.value.code == expected[0] and expected[1] in lines[0], lines[0]
    assert file_hash(out / "ckpt.pt") == before


# -----------------------------------------------------------------------------
# Untrusted and damaged files, through train.py and sample.py


def damage_files(inputs, marker):
    """Copies of the good files, each damaged in one way: {name: path}."""
    root = os.path.join(inputs["root"], "damaged")
    good = os.path.join(inputs["ckpt"], "ckpt.pt")
    with open(good, "rb") as f:
        blob = f.read()
    rng = random.Random(7)
    made = {}

    def checkpoint(name, data):
        folder = os.path.join(root, name)
        os.makedirs(folder)
        if isinstance(data, bytes):
            with open(os.path.join(folder, "ckpt.pt"), "wb") as f:
                f.write(data)
        else:
            torch.save(data, os.path.join(folder, "ckpt.pt"))
        made[name] = folder

    checkpoint("ckpt_truncated", blob[: len(blob) // 2])
    checkpoint("ckpt_empty", b"")
    checkpoint("ckpt_random", rng.randbytes(len(blob)))
    checkpoint("ckpt_flipped", flip_bytes_inside_a_tensor(blob))
    ckpt = torch.load(good, weights_only=True)
    checkpoint("ckpt_runs_code", dict(ckpt, model=RunsCode(marker)))
    checkpoint("ckpt_wrong_field", dict(ckpt, iter_num="2"))
    checkpoint("ckpt_wrong_shapes", dict(ckpt, model_args=dict(ckpt["model_args"], n_embd=64)))

    def dataset(name, filename, data):
        folder = os.path.join(root, name)
        shutil.copytree(os.path.join(inputs["data"], "small"), os.path.join(folder, "small"))
        with open(os.path.join(folder, "small", filename), "wb") as f:
            f.write(data)
        made[name] = folder

    with open(os.path.join(inputs["data"], "small", "meta.json"), "rb") as f:
        meta = f.read()
    with open(os.path.join(inputs["data"], "small", "train.bin"), "rb") as f:
        tokens = f.read()
    dataset("meta_python", "meta.json", f"__import__('os').system('touch {marker}')".encode())
    dataset("meta_pickle", "meta.json", pickle.dumps(RunsCode(marker)))
    dataset("meta_truncated", "meta.json", meta[: len(meta) // 2])
    dataset("meta_random", "meta.json", rng.randbytes(300))
    dataset("meta_wrong_vocab", "meta.json", meta.replace(b'"vocab_size": ', b'"vocab_size": 1'))
    dataset("bin_truncated", "train.bin", tokens[:-1])
    dataset("bin_random", "train.bin", rng.randbytes(len(tokens) // 2))
    dataset("bin_random_same_size", "train.bin", rng.randbytes(len(tokens)))

    def hf_folder(name, change):
        folder = os.path.join(root, name)
        shutil.copytree(inputs["hf"], folder)
        change(folder)
        made[name] = folder

    def runs_code(folder):
        os.remove(os.path.join(folder, "model.safetensors"))
        torch.save(
            {"transformer.wte.weight": RunsCode(marker)}, os.path.join(folder, "pytorch_model.bin")
        )

    def truncate(folder):
        path = os.path.join(folder, "model.safetensors")
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])

    hf_folder("hf_runs_code", runs_code)
    hf_folder("hf_truncated", truncate)
    return made


def flip_bytes_inside_a_tensor(blob):
    """blob with 64 bytes flipped in the middle of its largest tensor: still a valid zip archive."""
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        member = max(z.infolist(), key=lambda info: info.file_size)
    at = member.header_offset
    name_len, extra_len = struct.unpack("<HH", blob[at + 26 : at + 30])  # the local file header
    middle = at + 30 + name_len + extra_len + member.file_size // 2
    flipped = bytearray(blob)
    for i in range(middle, middle + 64):
        flipped[i] ^= 0xFF
    return bytes(flipped)


# name -> (which command lines read it, what the error line must name besides the file)
DAMAGED = {
    "ckpt_truncated": ("both", "truncated"),
    "ckpt_empty": ("both", "truncated"),
    "ckpt_random": ("both", "not a checkpoint"),
    "ckpt_flipped": ("both", "CRC"),
    "ckpt_runs_code": ("both", "could run code"),
    "ckpt_wrong_field": ("train", "iter_num"),
    "ckpt_wrong_shapes": ("both", "does not match"),
    "meta_python": ("train", "not valid JSON"),
    "meta_pickle": ("train", "not valid JSON"),
    "meta_truncated": ("train", "not valid JSON"),
    "meta_random": ("train", "not valid JSON"),
    "meta_wrong_vocab": ("train", "vocab_size"),
    "bin_truncated": ("train", "odd number of bytes"),
    "bin_random": ("train", "meta.json says"),
    "bin_random_same_size": ("train", "outside the vocabulary"),
    "hf_runs_code": ("both", "could run code"),
    "hf_truncated": ("both", "could not load GPT-2 weights"),
}


def named_file(name, folder):
    if name.startswith("ckpt"):
        return os.path.join(folder, "ckpt.pt")
    if name.startswith("meta"):
        return os.path.join(folder, "small", "meta.json")
    if name.startswith("bin"):
        return os.path.join(folder, "small", "train.bin")
    return folder


@pytest.fixture(scope="module")
def damaged(forker, inputs):
    marker = os.path.join(inputs["root"], "CODE_RAN")
    made = damage_files(inputs, marker)
    out = os.path.join(inputs["root"], "damaged-out")
    sample = ["--max_new_tokens=3", "--num_samples=1", "--attn_dir", "", "--prompt=ROMEO"]
    jobs = {}
    for name, folder in made.items():
        if name.startswith("ckpt"):
            jobs[(name, "train")] = (
                "train.py",
                train_args(inputs, folder, "--max_iters=4", "--init_from=resume"),
            )
            jobs[(name, "sample")] = ("sample.py", [f"--out_dir={folder}", *sample])
        elif name.startswith("hf"):
            jobs[(name, "train")] = (
                "train.py",
                train_args(inputs, out + name, f"--init_from={folder}", dataset="small_gpt2"),
            )
            jobs[(name, "sample")] = ("sample.py", [f"--init_from={folder}", *sample])
        else:
            jobs[(name, "train")] = (
                "train.py",
                train_args(inputs, out + name) + [f"--data_root={folder}"],
            )
    jobs = {key: job for key, job in jobs.items() if DAMAGED[key[0]][0] in ("both", key[1])}
    hashes = {name: folder_hashes(folder) for name, folder in made.items()}
    results = dict(zip(jobs, forker.run(list(jobs.values()), workers=3)))
    return {"made": made, "results": results, "marker": marker, "hashes": hashes}


def folder_hashes(folder):
    return {
        path: file_hash(path)
        for path in glob.glob(os.path.join(folder, "**"), recursive=True)
        if os.path.isfile(path)
    }


@pytest.mark.parametrize(
    "name, cli",
    [
        (n, c)
        for n, (which, _) in DAMAGED.items()
        for c in ("train", "sample")
        if which in ("both", c)
    ],
)
def test_damaged_or_hostile_file_is_refused_in_one_line(damaged, name, cli):
    folder = damaged["made"][name]
    line = error_line(damaged["results"][(name, cli)])
    assert named_file(name, folder) in line and DAMAGED[name][1] in line, line
    assert not os.path.exists(damaged["marker"])  # nothing in any file ran
    # refusing a file leaves it, and everything beside it, as it was: nothing changed or added
    assert folder_hashes(folder) == damaged["hashes"][name]


def test_overrides_are_never_evaluated(forker, inputs, tmp_path):
    """Config files are Python by design; --key=value never is."""
    payload = "__import__('os').system('touch MARKER')"
    ok, bad = forker.run(
        [
            ("train.py", train_args(inputs, payload, "--max_iters=0"), {"cwd": tmp_path}),
            ("train.py", train_args(inputs, "out", f"--batch_size={payload}"), {"cwd": tmp_path}),
        ],
        workers=2,
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert os.path.isfile(tmp_path / payload / "ckpt.pt")  # the text became a folder name
    assert "batch_size expects int" in error_line(bad)
    assert not (tmp_path / "MARKER").exists()


# -----------------------------------------------------------------------------
# Bad input through the command lines: one line each, and nothing written

NO_GPU = "this machine has a GPU" if torch.cuda.is_available() else None

# name -> (script, argv, exit code, what the line must say); {hf} is the GPT-2
# folder, {scratch} a folder for this table. train.py gets a tiny valid setup
# first and sample.py a trained checkpoint, so each row tests one thing.
BAD_INPUT = {
    "unknown key": ("train.py", ["--batch_sze=3"], 2, ["unknown config key", "'batch_size'"]),
    "wrong type": ("train.py", ["--batch_size=abc"], 2, ["batch_size expects int", "abc"]),
    "not a boolean": ("train.py", ["--bias=maybe"], 2, ["bias expects bool"]),
    "n_layer=0": ("train.py", ["--n_layer=0"], 2, ["n_layer must be a positive integer"]),
    "batch_size=0": ("train.py", ["--batch_size=0"], 2, ["batch_size must be a positive integer"]),
    "block_size=-1": (
        "train.py",
        ["--block_size=-1"],
        2,
        ["block_size must be a positive integer"],
    ),
    "max_iters=-5": ("train.py", ["--max_iters=-5"], 2, ["max_iters must be", ">= 0"]),
    "negative learning_rate": ("train.py", ["--learning_rate=-1e-3"], 2, ["learning_rate must be"]),
    "infinite learning_rate": (
        "train.py",
        ["--learning_rate=1e999"],
        2,
        ["learning_rate must be a finite"],
    ),
    "beta2=1": ("train.py", ["--beta2=1.0"], 2, ["beta2 must be in [0, 1)"]),
    "dropout=1.5": ("train.py", ["--dropout=1.5"], 2, ["dropout must be in [0, 1)"]),
    "n_embd not divisible by n_head": (
        "train.py",
        ["--n_embd=30", "--n_head=4"],
        2,
        ["n_embd (30) must be divisible by n_head (4)"],
    ),
    "seed past 64 bits": ("train.py", [f"--seed={2**64}"], 2, ["seed must fit"]),
    "block_size above the pretrained model's": (
        "train.py",
        ["--dataset=small_gpt2", "--init_from={hf}", "--block_size=64"],
        2,
        ["block_size 64 is larger than the pretrained model's 32"],
    ),
    "unknown dataset": (
        "train.py",
        ["--dataset=no_such_data"],
        2,
        ["unknown dataset 'no_such_data'", "data/prepare.py"],
    ),
    "dataset smaller than one block": (
        "train.py",
        ["--dataset=tiny"],
        2,
        ["val split", "has 3 tokens", "block_size + 1 = 17"],
    ),
    "float16 on a CPU": ("train.py", ["--dtype=float16"], 2, ["float16 training needs CUDA"]),
    "--device=cuda without a GPU": ("train.py", ["--device=cuda"], 2, ["no CUDA GPU is available"]),
    "out_dir is a file": (
        "train.py",
        ["--out_dir={scratch}/a_file"],
        2,
        ["cannot write into out_dir"],
    ),
    "config file that raises": (
        "train.py",
        ["{scratch}/raises.py"],
        2,
        ["error in config file", "ZeroDivisionError"],
    ),
    "missing config file": ("train.py", ["config/no_such_file.py"], 2, ["config file not found"]),
    "resume without a checkpoint": ("train.py", ["--init_from=resume"], 2, ["no checkpoint at"]),
    "sample: unknown option": (
        "sample.py",
        ["--temprature=0.5"],
        2,
        ["did you mean 'temperature'"],
    ),
    "sample: wrong type": (
        "sample.py",
        ["--max_new_tokens=many"],
        2,
        ["max_new_tokens expects int"],
    ),
    "sample: max_new_tokens=0": (
        "sample.py",
        ["--max_new_tokens=0"],
        2,
        ["--max_new_tokens must be"],
    ),
    "sample: num_samples=-1": ("sample.py", ["--num_samples=-1"], 2, ["--num_samples must be"]),
    "sample: top_p=1.5": ("sample.py", ["--top_p=1.5"], 2, ["--top_p must be in (0, 1]"]),
    "sample: character outside the vocabulary": (
        "sample.py",
        ["--prompt=ROMEO \u2603"],
        2,
        ["'\u2603'", "not in the vocabulary"],
    ),
    "sample: prompt file not UTF-8": ("sample.py", ["--prompt=FILE:{scratch}/bytes"], 2, ["UTF-8"]),
    "sample: --device=cuda without a GPU": ("sample.py", ["--device=cuda"], 2, ["no CUDA GPU"]),
    "sample: init_from nowhere": (
        "sample.py",
        ["--init_from=/no/such/folder"],
        2,
        ["no such file or folder"],
    ),
    "prepare: too little text": (
        "data/prepare.py",
        ["{scratch}/one.txt", "--data_root", "{scratch}"],
        1,
        ["too few to split"],
    ),
}
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
    for k, (name, (script, argv, _, _)) in enumerate(BAD_INPUT.items()):
        argv = [a.format(hf=inputs["hf"], scratch=scratch) for a in argv]
        if script == "train.py":
            argv = train_args(inputs, os.path.join(scratch, f"out{k}")) + argv
        elif script == "sample.py":
            argv = [f"--out_dir={inputs['ckpt']}", "--attn_dir", "", "--max_new_tokens=3"] + argv
        jobs[name] = (script, argv)
    before = sorted(os.listdir(scratch))
    results = dict(zip(jobs, forker.run(list(jobs.values()), workers=3)))
    return {"results": results, "before": before, "after": sorted(os.listdir(scratch))}


@pytest.mark.parametrize("name", list(BAD_INPUT))
def test_bad_input_is_one_line(bad_runs, name):
    if name in NEEDS_NO_GPU and NO_GPU:
        pytest.skip(NO_GPU)
    _, _, code, needles = BAD_INPUT[name]
    proc = bad_runs["results"][name]
    line = error_line(proc)
    assert proc.returncode == code, line
    for needle in needles:
        assert needle in line, line
    assert bad_runs["after"] == bad_runs["before"]  # no output folder, checkpoint or dataset made


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


def test_ddp_rank_failure_stops_all_ranks(inputs, tmp_path):
    wrapper = tmp_path / "ddp_fault.py"
    wrapper.write_text(DDP_FAULT)
    timeout = 5

    def launch(fault):
        argv = train_args(
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
