"""train.py on CPU with tiny models: learning, GPT-2's weights, memory-mapped
batches, DDP equivalence, wandb, the run estimate, and one-line errors. Checkpoints,
resume and stopping are tests/test_resume.py's."""

import copy
import dataclasses
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import (
    ROOT,
    child_env,
    losses,
    read_log,
    run_in_process,
    tiny_run,
    torchrun,
    torchrun_command,
    train_step,
)

import train
from data import dataset
from data.dataset import ensure_dataset, load_tokens
from model import GPT, GPTConfig
from support import run_estimate
from support.device import precision_context
from support.loading import load_checkpoint
from support.settings import Settings

REPO = os.path.dirname(os.path.abspath(train.__file__))


def run_cli(argv, env=None, timeout=120):
    """train.py as a separate process, from the repo root."""
    return subprocess.run(
        [sys.executable, "train.py", *argv],
        cwd=REPO,
        env=child_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(stderr, *needles):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# -----------------------------------------------------------------------------
# Learning


def unigram_entropy(tokens):
    """Entropy (nats) of the train split's character frequencies: the best loss
    of a model that ignores context."""
    counts = np.array(list(Counter(tokens.tolist()).values()), dtype=np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def independent_full_val(model, val, T):
    """Mean next-token loss over every val token in non-overlapping windows."""
    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(val) - 1, T):
            x = torch.from_numpy(val[s : s + T + 1].astype(np.int64))
            inp, tgt = x[:-1][None], x[1:][None]
            logits, _ = model(inp)
            total += F.cross_entropy(logits[0], tgt[0], reduction="sum").item()
            count += tgt.numel()
    return total / count


def test_tiny_model_beats_unigram_baseline(data_root, tmp_path):
    out = tmp_path / "out"
    run_in_process(
        tiny_run(
            data_root,
            out,
            "--n_embd=64",
            "--batch_size=16",
            "--max_iters=300",
            "--lr_decay_iters=300",
            "--learning_rate=1e-2",
            "--eval_interval=100",
            "--eval_iters=10",
            "--eval_full_val=True",
        )
    )
    dataset_dir = os.path.join(data_root, "shakespeare_char")
    baseline = unigram_entropy(load_tokens(dataset_dir, "train"))
    assert 3.0 < baseline < 3.6  # sanity of the oracle itself: ln(65) = 4.17 is the uniform one

    final = read_log(out)[-1]
    assert final["iter"] == 300 and final["tokens"] == 300 * 16 * 32
    assert final["val_loss_full"] < baseline - 0.5, (final, baseline)
    assert abs(final["val_loss"] - final["val_loss_full"]) < 0.15  # sampled estimate agrees

    ckpt = load_checkpoint(str(out))
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    expected = independent_full_val(model, load_tokens(dataset_dir, "val"), 32)
    assert final["val_loss_full"] == pytest.approx(expected, abs=1e-4)


def attention_ops(block_size, dtype):
    """The attention kernels one forward and backward run under precision_context."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=65, n_layer=1, n_head=2, n_embd=32))
    idx = torch.randint(0, 65, (2, block_size))
    with torch.profiler.profile() as prof:
        with precision_context("cpu", dtype, block_size):
            _, loss = model(idx, idx)
        loss.backward()
    names = {e.key for e in prof.key_averages()}
    return {name for name in names if "flash_attention" in name or name == "aten::_softmax"}, loss


@pytest.mark.bf16
def test_cpu_bfloat16_uses_the_math_attention_path_for_short_contexts():
    short, loss = attention_ops(64, "bfloat16")
    assert "aten::_softmax" in short and not any("flash" in n for n in short)
    assert torch.isfinite(loss)
    long_, _ = attention_ops(256, "bfloat16")
    assert any("flash" in n for n in long_)  # longer contexts keep the fused kernel
    f32, loss32 = attention_ops(64, "float32")
    assert any("flash" in n for n in f32)  # float32 is left alone
    assert abs(loss.float().item() - loss32.item()) < 0.05  # bf16 autocast: close, not equal


@pytest.mark.bf16
def test_bfloat16_training_on_cpu_learns(data_root, tmp_path):
    out = tmp_path / "out"
    run_in_process(
        tiny_run(
            data_root,
            out,
            "--dtype=bfloat16",
            "--max_iters=60",
            "--lr_decay_iters=60",
            "--learning_rate=1e-2",
            "--eval_interval=60",
        )
    )
    log = read_log(out)
    assert log[-1]["iter"] == 60 and log[-1]["val_loss"] < log[0]["val_loss"] - 0.8, log


# -----------------------------------------------------------------------------
# GPT-2's weights from a local folder, and batches from a memory map


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """A randomly initialised GPT-2 in Hugging Face's format, small enough for a test."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("gpt2-tiny")
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_positions=64, n_embd=32, n_layer=2, n_head=2)
    )
    hf.save_pretrained(folder)
    return folder, hf.state_dict()


def test_init_from_a_local_gpt2_folder(data_root, corpus_path, tmp_path, gpt2_folder, capsys):
    folder, hf = gpt2_folder
    ensure_dataset("shakespeare", data_root, input_path=corpus_path)  # GPT-2 BPE tokens
    out = tmp_path / "out"
    base = [
        "--dataset=shakespeare",
        f"--data_root={data_root}",
        f"--out_dir={out}",
        f"--init_from={folder}",
        "--device=cpu",
        "--compile=False",
        "--batch_size=2",
        "--eval_iters=1",
        "--max_iters=0",
    ]
    capsys.readouterr()
    run_in_process(base + ["--block_size=32"])
    # the settings' shape (the defaults, GPT-2 124M's) gives way to the folder's, in a note
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note:")]
    kept = "n_layer=2 (not 12), n_head=2 (not 12), n_embd=32 (not 768)"
    assert notes == [f"note: the model keeps the shape it was trained with: {kept}"]
    ckpt = load_checkpoint(str(out))
    assert ckpt["model_args"]["vocab_size"] == 50257 and ckpt["model_args"]["block_size"] == 32
    assert ckpt["tokenizer"] == {"kind": "gpt2"} and ckpt["config"]["n_embd"] == 32
    assert torch.equal(ckpt["model"]["transformer.wte.weight"], hf["transformer.wte.weight"])
    assert torch.equal(ckpt["model"]["transformer.wpe.weight"], hf["transformer.wpe.weight"][:32])
    # Hugging Face stores GPT-2's projections as (in, out); a Linear holds (out, in)
    assert torch.equal(
        ckpt["model"]["transformer.h.1.mlp.c_fc.weight"], hf["transformer.h.1.mlp.c_fc.weight"].t()
    )

    capsys.readouterr()
    # into another folder: out holds a checkpoint that a new run may not replace
    base[2] = f"--out_dir={tmp_path / 'refused'}"
    with pytest.raises(SystemExit) as exit_info:
        run_in_process(base + ["--block_size=128"])
    assert exit_info.value.code == 2
    assert_one_line_error(capsys.readouterr().err, "block_size 128", "64")
    with pytest.raises(SystemExit):
        run_in_process(base + ["--dataset=shakespeare_char"])
    assert_one_line_error(capsys.readouterr().err, "GPT-2 BPE", "--dataset=shakespeare")
    with pytest.raises(SystemExit):
        run_in_process(base + ["--attention=linear"])
    assert_one_line_error(capsys.readouterr().err, "which need softmax attention")


def test_init_from_another_run_s_checkpoint(data_root, tmp_path, capsys):
    """A new run from another's weights: its folder (ckpt.pt) or a snapshot's file. With
    max_iters=0 the new run saves what it started from, which must be those weights, at
    iter 0 with a new optimizer; before, the folder was taken for GPT-2's and refused
    with advice to use GPT-2's BPE, and the file was refused outright."""
    first = tmp_path / "first"
    run_in_process(tiny_run(data_root, first, "--snapshots=True", max_iters=3, eval_interval=1))
    ckpt = load_checkpoint(str(first))
    snapshot = first / "snapshots" / "iter_000002.pt"
    for source, n in ((first, 3), (snapshot, 2)):
        out = tmp_path / f"from_{n}"
        # other settings' shape and dropout: the model keeps its own, and says so
        extra = [f"--init_from={source}", "--n_layer=5", "--dropout=0.1"]
        capsys.readouterr()
        run_in_process(tiny_run(data_root, out, *extra, max_iters=0))
        said = capsys.readouterr().out
        assert "note: the model keeps the shape it was trained with: n_layer=2 (not 5)" in said
        started = load_checkpoint(str(out))
        weights = load_checkpoint(str(source))["model"]
        assert started["iter_num"] == 0 and started["model"].keys() == weights.keys()
        for key in weights:
            assert torch.equal(started["model"][key], weights[key]), key
        assert started["optimizer"]["state"] == {} and started["model_args"]["dropout"] == 0.1
    assert load_checkpoint(str(snapshot))["iter_num"] == 2 and ckpt["iter_num"] == 3

    def refused(*extra, dataset="shakespeare_char", root=data_root):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            run_in_process(tiny_run(root, tmp_path / "refused", *extra, dataset=dataset))
        assert exit_info.value.code == 2
        assert not (tmp_path / "refused" / "ckpt.pt").exists()
        return capsys.readouterr().err

    # a corpus of other characters: another vocabulary, token for token
    other = tmp_path / "other_root"
    (other / "abc").mkdir(parents=True)
    (other / "abc" / "input.txt").write_text("abc cab bca " * 400, encoding="utf-8")
    prepared = subprocess.run(
        [sys.executable, "data/prepare.py", str(other / "abc" / "input.txt"), "--name=abc"]
        + [f"--data_root={other}", "--tokenizer=char"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert prepared.returncode == 0, prepared.stderr
    err = refused(f"--init_from={first}", dataset="abc", root=other)
    # the dataset and the folder it is in: with this run's --data_root it is not found
    options = f"--dataset=shakespeare_char --data_root={shlex.quote(data_root)},"
    assert_one_line_error(err, "was trained on another tokenizer", options)
    err = refused(f"--init_from={tmp_path / 'other_root'}")
    assert_one_line_error(err, "holds neither a checkpoint (ckpt.pt) nor a Hugging Face model")


def test_memmap_batches_equal_in_memory_batches(data_root, tmp_path, monkeypatch):
    common = ["--max_iters=4", "--eval_interval=2"]
    run_in_process(tiny_run(data_root, tmp_path / "memory", *common))
    monkeypatch.setattr(dataset, "SMALL_DATASET", 0)  # as if the corpus were too large to hold
    kinds = set()
    get_batch = dataset.get_batch

    def counted(data, *rest):
        kinds.add(type(data))
        return get_batch(data, *rest)

    monkeypatch.setattr(dataset, "get_batch", counted)  # the training batches
    monkeypatch.setattr(train, "get_batch", counted)  # the evaluation batches
    run_in_process(tiny_run(data_root, tmp_path / "memmap", *common))
    assert kinds == {np.memmap}
    assert losses(read_log(tmp_path / "memory")) == losses(read_log(tmp_path / "memmap"))


# -----------------------------------------------------------------------------
# Data parallel


def test_torchrun_two_processes_match_one(data_root, tmp_path, cores_alone):
    common = [
        "--gradient_accumulation_steps=2",
        "--batch_size=4",
        "--max_iters=6",
        "--eval_interval=3",
        "--lr_decay_iters=6",
        "--eval_iters=4",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    run_in_process(tiny_run(data_root, one, *common))
    with cores_alone():
        result = torchrun(2, tiny_run(data_root, two, *common), timeout=240)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    log_one, log_two = read_log(one), read_log(two)  # rank 0 alone writes the log
    assert [r["iter"] for r in log_two] == [0, 3, 6]
    for a, b in zip(log_one, log_two):
        assert a["tokens"] == b["tokens"]
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-4)
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-4)
    c1, c2 = load_checkpoint(str(one)), load_checkpoint(str(two))
    for key in c1["model"]:
        torch.testing.assert_close(c1["model"][key], c2["model"][key], rtol=1e-4, atol=1e-5)


def workers(parent):
    """{rank: pid} of the processes that parent (torchrun) started, read from /proc."""
    ranks = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue  # it has already exited
        for item in environ:
            if item.startswith(b"RANK="):
                ranks[int(item[len(b"RANK=") :])] = int(pid)
    return ranks


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds torchrun's processes in /proc")
def test_a_signal_to_one_process_stops_them_all_and_saves(data_root, tmp_path, cores_alone):
    out = tmp_path / "out"
    endless = ["--max_iters=100000", "--lr_decay_iters=100000", "--eval_interval=100000"]
    argv = tiny_run(data_root, out, "--gradient_accumulation_steps=2", "--log_interval=4", *endless)
    log = out / "log.jsonl"
    with cores_alone():
        child = subprocess.Popen(
            torchrun_command(2, argv),
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.time() + 120
            # the evaluation at iter 0 and two log steps (rank 0 alone writes the log)
            while not (log.exists() and len(log.read_text().splitlines()) >= 3):
                assert time.time() < deadline and child.poll() is None, child.stderr.read()
                time.sleep(0.05)
            # a scheduler or a kill that reaches the second process alone
            os.kill(workers(child.pid)[1], signal.SIGTERM)
            stdout, stderr = child.communicate(timeout=120)
        finally:
            child.kill()
    assert child.returncode == 0, stderr[-3000:]
    # rank 0, which saves, had no signal: the processes agreed to stop at a log step
    iter_num = load_checkpoint(str(out))["iter_num"]
    assert iter_num > 0 and iter_num % 4 == 0
    assert f"stopped by a signal to another process at iter {iter_num}; saved" in stdout
    assert "error" not in stderr


def test_gradient_accumulation_must_divide_among_processes(
    data_root, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_info:
        run_in_process(tiny_run(data_root, tmp_path, "--gradient_accumulation_steps=3"))
    assert exit_info.value.code == 2
    # the setting that works, the next multiple (the CPU recipe's 1 failed under torchrun)
    assert_one_line_error(
        capsys.readouterr().err, "divisible", "pass --gradient_accumulation_steps=4"
    )


def test_under_torchrun_a_bad_setting_is_said_once(data_root, tmp_path, monkeypatch, capsys):
    # every process read the same command line and printed the same line, 8 on 8 GPUs
    monkeypatch.setenv("WORLD_SIZE", "2")
    said = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", rank)
        with pytest.raises(SystemExit) as exit_info:
            run_in_process(tiny_run(data_root, tmp_path, "--batch_sze=3"))
        assert exit_info.value.code == 2
        said[rank] = capsys.readouterr().err
    assert_one_line_error(said["0"], "unknown config key 'batch_sze'", "batch_size")
    assert said["1"] == ""


# -----------------------------------------------------------------------------
# Errors and logging


@pytest.mark.parametrize(
    "extra, needles",
    [
        (["--batch_sze=3"], ["batch_sze", "batch_size"]),
        (["--batch_size=abc"], ["batch_size", "int", "abc"]),
        (["config/no_such_config.py"], ["config file not found", "no_such_config.py"]),
        (["--n_embd=30", "--n_head=4"], ["n_embd", "divisible"]),
        (["--dataset=no_such_dataset"], ["unknown dataset", "no_such_dataset"]),
        (["--block_size=200000"], ["block_size"]),
        (["--dtype=float8"], ["unknown dtype", "float8"]),
        (["--optimizer=sgd"], ["unknown optimizer"]),
        (["--muon_ns_steps=0"], ["muon_ns_steps", "positive integer"]),
        (["--init_from=nowhere"], ["init_from", "nowhere"]),
        (["--init_from=resume"], ["no checkpoint"]),
    ],
)
def test_bad_settings_give_one_line_errors(data_root, tmp_path, capsys, extra, needles):
    with pytest.raises(SystemExit) as exit_info:
        run_in_process(tiny_run(data_root, tmp_path / "out", *extra))
    assert exit_info.value.code == 2
    assert_one_line_error(capsys.readouterr().err, *needles)
    assert not os.path.exists(tmp_path / "out" / "ckpt.pt")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu_is_a_one_line_error(data_root, tmp_path):
    result = run_cli(tiny_run(data_root, tmp_path, "--device=cuda"))
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "no CUDA GPU is available", "--device=cpu")


def test_no_corpus_and_no_network_says_what_train_py_takes(corpus_path, tmp_path):
    """Tiny Shakespeare neither on disk nor downloadable (a proxy that refuses, as a
    machine offline does): after the download it tried, one line that says where to put
    it and names only what train.py takes; done as it says, the run prepares and trains."""
    # the CPU recipe's config file, its model and evaluations the tests' tiny ones
    tiny = tiny_run(tmp_path / "data", tmp_path / "out", max_iters=2, eval_interval=2)
    argv = ["config/shakespeare_cpu.py", *tiny, "--eval_full_val=False"]
    refused = "http://127.0.0.1:9"
    env = child_env(https_proxy=refused, HTTPS_PROXY=refused, no_proxy="", NO_PROXY="")
    env.pop("TINYSHAKESPEARE_PATH", None)
    cli = [sys.executable, "train.py", *argv]
    result = subprocess.run(cli, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    tried, line = [line for line in result.stderr.splitlines() if line.strip()]
    assert tried.startswith("downloading tiny Shakespeare")
    assert line.startswith("error: cannot download tiny Shakespeare"), line
    keys = {field.name for field in dataclasses.fields(Settings)}
    assert set(re.findall(r"--(\w+)", line)) <= keys, line
    where = str(tmp_path / "data" / "shakespeare_char" / "input.txt")
    assert f"put tiny Shakespeare at {where}" in line and "TINYSHAKESPEARE_PATH=" in line
    # done as it says: the copy where the line puts it
    os.makedirs(os.path.dirname(where))
    with open(corpus_path, "rb") as f, open(where, "wb") as g:
        g.write(f.read())
    result = subprocess.run(cli, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert os.path.exists(tmp_path / "out" / "ckpt.pt")


@pytest.mark.parametrize("server", [None, "unreachable"])
def test_wandb_that_cannot_start_stops_in_one_line_before_any_work(data_root, tmp_path, server):
    """A machine where wandb was never logged in, with no terminal to ask on: one line that
    names both ways out, before the data or the model is touched. No network is needed to
    find this out. With a key but no server to take it (no network; here a closed port,
    given up after 1 s rather than wandb's 90), a traceback ended the run."""
    env = child_env(
        HOME=str(tmp_path), WANDB_DIR=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path / "wandb-config")
    )
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_SILENT", "NETRC", "WANDB_BASE_URL"):
        env.pop(key, None)
    if server == "unreachable":
        env.update(WANDB_API_KEY="0" * 40, WANDB_BASE_URL="http://127.0.0.1:9")
        # and its retries cut short: 6 s in all rather than 12
        env.update(WANDB_INIT_TIMEOUT="1", WANDB_X_GRAPHQL_RETRY_MAX="1")
        env.update(WANDB_X_GRAPHQL_RETRY_WAIT_MIN_SECONDS="0.05")
        env.update(WANDB_X_GRAPHQL_RETRY_WAIT_MAX_SECONDS="0.1")
    out_dir = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            *tiny_run(data_root, out_dir, "--max_iters=2", "--wandb_log=True"),
        ],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "WANDB_MODE=offline" in errors[0]
    assert ("wandb login" in errors[0]) == (server is None)
    assert not out_dir.exists() or not any(out_dir.iterdir())  # no checkpoint, no log


def test_help_lists_the_keys():
    result = run_cli(["--help"])
    assert result.returncode == 0
    for field in dataclasses.fields(Settings):
        assert f"--{field.name}={field.default!r}" in result.stdout
    assert "  --eval_only=False  # evaluate once and exit\n" in result.stdout
    assert "  # optimizer: 'adamw', or 'muon'" in result.stdout  # a heading over its keys


def test_wandb_offline_run_records_the_metrics(data_root, tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    result = run_cli(
        tiny_run(
            data_root,
            tmp_path / "out",
            "--max_iters=2",
            "--eval_interval=1",
            "--wandb_log=True",
            "--wandb_project=test",
            "--wandb_run_name=tiny",
        ),
        env=env,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = glob.glob(os.path.join(tmp_path, "wandb", "offline-run-*"))
    assert len(runs) == 1
    records = glob.glob(os.path.join(runs[0], "*.wandb"))
    assert len(records) == 1
    with open(records[0], "rb") as f:
        record = f.read()  # protobuf records: keys and JSON values are stored as plain bytes
    assert b"val_loss" in record and b"tiny" in record
    log = read_log(tmp_path / "out")
    assert [r["iter"] for r in log] == [0, 1, 2]
    for rec in log:
        assert json.dumps(rec["val_loss"]).encode() in record, rec


# -----------------------------------------------------------------------------
# The main command on a machine without a GPU, and the run estimate


def test_run_estimate_counts_every_step_and_evaluation():
    cfg = Settings(
        max_iters=2500,
        eval_interval=250,
        eval_iters=200,
        eval_full_val=True,
        block_size=256,
        batch_size=64,
        max_time=0.0,
    )
    val_tokens = 111_540

    def counted(start, resumed):  # the training loop's own rule, iter by iter
        evals = (
            sum(
                1
                for i in range(start, cfg.max_iters)
                if i % cfg.eval_interval == 0 and not (resumed and i == start)
            )
            + 1
        )
        full_val_batches = len(range(0, val_tokens - 1, cfg.block_size * cfg.batch_size))
        return (cfg.max_iters - start) * 2.0 + (evals * 400 + full_val_batches) * 0.5, evals

    for start, resumed in [(0, False), (500, True), (500, False), (501, True), (2499, True)]:
        seconds, how = run_estimate.run_seconds(cfg, start, resumed, 2.0, 0.5, val_tokens)
        expected, evals = counted(start, resumed)
        assert seconds == pytest.approx(expected) and f"{evals} evaluations" in how
    capped, _ = run_estimate.run_seconds(
        dataclasses.replace(cfg, max_time=60.0), 0, False, 2.0, 0.5, val_tokens
    )
    assert capped == pytest.approx(60.0 + (11 * 400 + 7) * 0.5)
    # a resumed timed run has only what its checkpoint's seconds leave of max_time
    rest, _ = run_estimate.run_seconds(
        dataclasses.replace(cfg, max_time=60.0), 0, False, 2.0, 0.5, val_tokens, 45.0
    )
    assert rest == pytest.approx(15.0 + (11 * 400 + 7) * 0.5)


def test_no_evaluation_at_start_and_muon_ns_steps(data_root, tmp_path):
    out = tmp_path / "out"
    run_in_process(
        tiny_run(
            data_root,
            out,
            "--max_iters=4",
            "--eval_interval=2",
            "--eval_at_start=False",
            "--optimizer=muon",
            "--muon_ns_steps=3",
        )
    )
    assert [rec["iter"] for rec in read_log(out)] == [2, 4]  # no record before the first step
    ckpt = load_checkpoint(os.path.join(out, "ckpt.pt"))
    assert ckpt["optimizer"][0]["param_groups"][0]["ns_steps"] == 3  # Muon's, saved with its state
    cfg = Settings(max_iters=4, eval_interval=2, eval_iters=1)
    with_start, _ = run_estimate.run_seconds(cfg, 0, False, 1.0, 1.0, 100)
    without, how = run_estimate.run_seconds(
        cfg, 0, True, 1.0, 1.0, 100
    )  # what eval_at_start=False passes
    assert with_start - without == 2 and "2 evaluations" in how  # one evaluation of 2 batches fewer


def test_timing_a_step_leaves_the_run_untouched(data_root, tmp_path):
    cfg = train.get_config(
        tiny_run(
            data_root,
            tmp_path / "out",
            "--optimizer=muon",
            "--dropout=0.1",
            "--gradient_accumulation_steps=2",
        )
    )
    r = train.setup(cfg)
    train_step(r, 1e-3)  # optimizer state exists, as in a resumed run
    before = (
        copy.deepcopy(r.raw.state_dict()),
        copy.deepcopy([o.state_dict() for o in r.optimizers]),
        torch.get_rng_state(),
        r.data_gen.get_state(),
    )
    step_s, eval_s = run_estimate.time_iter(r)
    assert step_s > 0 and eval_s > 0
    after = (
        r.raw.state_dict(),
        [o.state_dict() for o in r.optimizers],
        torch.get_rng_state(),
        r.data_gen.get_state(),
    )
    for key in before[0]:
        assert torch.equal(before[0][key], after[0][key]), key
    for old, new in zip(before[1], after[1]):
        for p in old["state"]:
            for name, value in old["state"][p].items():
                assert torch.equal(
                    torch.as_tensor(value), torch.as_tensor(new["state"][p][name])
                ), name
    assert torch.equal(before[2], after[2]) and torch.equal(before[3], after[3])


@pytest.mark.exclusive
def test_a_gpu_config_without_a_gpu_says_so_estimates_and_stops_in_an_evaluation(
    data_root, tmp_path
):
    out = tmp_path / "out"
    # nanoGPT's baby GPT settings, which size nothing for the machine, shrunk; eval_iters so
    # large that the first evaluation would take hours
    argv = [
        "train.py",
        "config/shakespeare_classic.py",
        f"--data_root={data_root}",
        f"--out_dir={out}",
        "--n_layer=1",
        "--n_head=2",
        "--n_embd=32",
        "--batch_size=4",
        "--eval_iters=1000000",
    ]
    child = subprocess.Popen(
        [sys.executable, *argv],
        cwd=REPO,
        env=child_env(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # stderr read as it comes: the evaluation's progress bar would fill the pipe and
    # stop the child before it says anything more
    errors = []
    drain = threading.Thread(target=lambda: errors.extend(child.stderr), daemon=True)
    drain.start()
    try:
        lines = []
        while not any("should take about" in line for line in lines):
            line = child.stdout.readline()
            assert line, "".join(lines + errors)
            lines.append(line)
        time.sleep(2.0)  # inside the first evaluation
        child.send_signal(signal.SIGTERM)
        sent = time.time()
        child.wait(timeout=60)
        took = time.time() - sent
        stdout = "".join(lines) + child.stdout.read()
        drain.join(timeout=60)
        stderr = "".join(errors)
    finally:
        child.kill()
    assert child.returncode == 0, stderr
    assert "no GPU found" in lines[0] and "python train.py config/shakespeare.py" in lines[0]
    assert any(line.startswith("timing one step") for line in lines)  # said before the wait
    estimate = re.search(
        r"should take about ([\d.]+) (h|min|s) here \(5,000 iters x [\d.e-]+ s \+ "
        r"21 evaluations, 42,000,\d\d\d batches",
        stdout,
    )
    assert estimate and estimate.group(2) == "h", stdout  # 42M evaluation batches: hours
    assert "evaluating train" in stderr  # the evaluation shows progress
    assert (
        "stopped by SIGTERM at iter 0: nothing trained since the run began, so nothing was saved"
        in stdout
    )
    assert took < 20  # the evaluation stops within a batch, not after its 1M batches
    assert not (out / "ckpt.pt").exists() and (out / "log.jsonl").read_text() == ""


def test_the_main_config_sizes_the_model_for_the_machine(monkeypatch):
    """config/shakespeare.py without a GPU: the 10-minute CPU recipe in the main out_dir,
    which sample.py reads by default, and a note that says why; --device=cpu: the baby GPT."""
    import sample

    monkeypatch.chdir(REPO)
    baby = train.get_config(["config/shakespeare.py", "--device=cpu"])
    assert (baby.n_layer, baby.n_embd, baby.block_size, baby.max_iters) == (6, 384, 256, 2500)
    assert baby.note == "" and baby.eval_at_start is False and baby.max_time == 0
    assert baby.eval_iters * baby.batch_size * baby.block_size < 4 * 111_540  # the val split

    sized = train.get_config(["config/shakespeare.py"])
    recipe = train.get_config(["config/shakespeare_cpu_10min.py"])  # named, it is as it was
    assert recipe.out_dir == "out-shakespeare-char-10min"
    named = dict(out_dir=recipe.out_dir, note="", wandb_project="gpt", wandb_run_name=None)
    named["eval_interval"] = recipe.eval_interval  # evaluations: fewer, to fit 11 minutes
    assert dataclasses.replace(sized, **named) == recipe
    assert sized.wandb_run_name == "cpu-10min"
    assert sized.out_dir == baby.out_dir == sample.Settings().out_dir == "out-shakespeare-char"
    hours = re.search(r"the baby GPT's 2,500 iters would take ([\d.]+) h here", sized.note)
    assert sized.note.startswith("config/shakespeare.py: no GPU found") and hours, sized.note
    assert float(hours.group(1)) > 1 and "--device=cpu trains it anyway" in sized.note

    # the command line has the last word, over the recipe the config chose
    small = train.get_config(["config/shakespeare.py", "--max_iters=50000", "--n_layer=2"])
    assert small.n_layer == 2 and small.max_iters == 50000 and small.max_time == 600
    assert small.note == sized.note  # the baby GPT timed as the config writes it, once

    # under torchrun every process would time for itself: none does, all take the recipe
    monkeypatch.setenv("WORLD_SIZE", "2")
    untimed = train.get_config(["config/shakespeare.py"])
    assert dataclasses.replace(untimed, note=sized.note) == sized
    assert "the baby GPT's 2,500 iters; --device=cpu" in untimed.note


def test_main_command_without_a_gpu_trains_a_model_that_sample_finds(data_root, tmp_path):
    """The README's two commands on a CPU, the run cut to seconds: the first line says what
    was chosen, the second the model as trained (an override of the recipe's size
    included), nothing is evaluated before the first step, and sample.py reads the model."""
    out = tmp_path / "out-shakespeare-char"
    shrink = ["--max_time=2", "--lr_decay_time=2", "--compile=False", "--eval_iters=1"]
    shrink += ["--eval_full_val=False"]  # the whole val split: seconds that test nothing here
    shrink += ["--n_layer=3"]  # the recipe has 4: the lines must give the model trained
    argv = ["config/shakespeare.py", f"--data_root={data_root}", f"--out_dir={out}", *shrink]
    env = child_env(CUDA_VISIBLE_DEVICES="")
    trained = subprocess.run(
        [sys.executable, "train.py", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    first = trained.stdout.splitlines()[0]
    assert first.startswith("config/shakespeare.py: no GPU found, so a model sized for the CPU")
    assert "| cpu, float32" in trained.stdout or "| cpu, bfloat16" in trained.stdout
    log = read_log(out)
    assert log[0]["iter"] > 0  # no evaluation at iter 0
    ckpt = load_checkpoint(os.path.join(out, "ckpt.pt"))
    shape = ckpt["model_args"]
    assert shape["n_layer"] == 3 and ckpt["config"]["max_time"] == 2
    said = f"parameters | 3 layers, {shape['n_head']} heads, {shape['n_embd']} wide | cpu"
    assert said in trained.stdout and "4 layers" not in trained.stdout, trained.stdout[:1000]
    sampled = subprocess.run(
        [sys.executable, "sample.py", f"--out_dir={out}", "--prompt=ROMEO:"]
        + ["--max_new_tokens=20", "--num_samples=1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert sampled.stdout.startswith("ROMEO:") and (out / "attention").is_dir()


def test_an_evaluation_compiles_nothing(data_root, tmp_path, capsys):
    """A compiled run evaluates the model as written: estimate_loss gives the losses the
    uncompiled model gives, and dynamo compiles no graph for it."""
    import torch._dynamo

    cfg = train.get_config(tiny_run(data_root, tmp_path / "out", "--compile=True"))
    r = train.setup(cfg)
    assert r.ddp_model is not r.raw  # compiled, lazily: nothing compiles before the first call
    # and the wait at the first step is said before it
    assert capsys.readouterr().out.splitlines()[-1] == (
        "compiling the model: the first step waits for it (faster once cached)"
    )
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    losses = train.estimate_loss(r, seed=3)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0
    # another out_dir: r holds the lock of its own while it lives
    plain = train.setup(dataclasses.replace(cfg, compile=False, out_dir=str(tmp_path / "plain")))
    assert "compiling" not in capsys.readouterr().out
    assert losses == train.estimate_loss(plain, seed=3)
