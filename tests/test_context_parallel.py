"""Context parallelism (context_parallel.py): torchrun with each sequence split
over 2 gloo processes trains exactly as one process does, and bad settings are
one-line errors before any work."""

import os

import pytest
import torch
import torch.distributed as dist
from conftest import read_log, tiny_run, torchrun

import train
from model import GPT, GPTConfig
from support.context_parallel import ContextParallel
from support.loading import load_checkpoint

REPO = os.path.dirname(os.path.abspath(train.__file__))
# the tiny run with two micro-steps per iter, evaluated twice, the last time on
# the whole val split too
CP_RUN = dict(
    batch_size=4,
    gradient_accumulation_steps=2,
    eval_iters=4,
    max_iters=4,
    eval_interval=2,
    lr_decay_iters=4,
    eval_full_val=True,
)


def args(data_root, out_dir, *extra):
    """The tiny run; each test's model keys follow in extra."""
    return tiny_run(data_root, out_dir, *extra, **CP_RUN)


@pytest.mark.parametrize(
    "processes, model",
    [
        (2, ["--n_head=2", "--context_parallel_layout=zigzag"]),  # learned positions
        (4, ["--n_head=4", "--n_kv_head=2", "--rope=True", "--context_parallel_layout=contiguous"]),
    ],
    ids=["learned-zigzag", "rope-gqa-contiguous-2x2"],
)
def test_sequence_split_over_two_processes_trains_as_one(
    data_root, tmp_path, cores_alone, processes, model
):
    """Each sequence over 2 processes: alone, or twice side by side, data-parallel."""
    one, two = tmp_path / "one", tmp_path / "two"
    train.main(args(data_root, one, *model))
    with cores_alone():
        result = torchrun(
            processes, args(data_root, two, *model, "--context_parallel=2"), timeout=240
        )
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    assert f"{processes} process(es) ({processes // 2} x 2 per sequence)" in result.stdout
    log_one, log_two = read_log(one), read_log(two)
    assert [r["iter"] for r in log_two] == [0, 2, 4]
    for a, b in zip(log_one, log_two):
        for key in ("train_loss", "val_loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-4), (a, b)
    assert log_one[-1]["val_loss_full"] == pytest.approx(log_two[-1]["val_loss_full"], abs=1e-4)
    c1, c2 = load_checkpoint(str(one)), load_checkpoint(str(two))
    for key in c1["model"]:
        torch.testing.assert_close(c1["model"][key], c2["model"][key], rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "world, extra, needles",
    [
        (1, ["--context_parallel=2"], ["context_parallel=2", "does not divide", "1 process"]),
        (2, ["--context_parallel=2", "--block_size=30"], ["30 tokens", "4 equal pieces", "zigzag"]),
        (
            2,
            ["--context_parallel=2", "--block_size=31", "--context_parallel_layout=contiguous"],
            ["31 tokens", "2 equal"],
        ),
        (2, ["--context_parallel=2", "--dropout=0.1"], ["--attn_dropout=0"]),
        (2, ["--context_parallel=2", "--compile=True"], ["compile=False"]),
        (
            2,
            ["--context_parallel=2", "--context_parallel_layout=spiral"],
            ["unknown context_parallel_layout"],
        ),
        (1, ["--context_parallel=0"], ["context_parallel", "positive"]),
    ],
)
def test_bad_context_parallel_settings_are_one_line_errors(
    data_root, tmp_path, monkeypatch, capsys, world, extra, needles
):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv(
        "WORLD_SIZE", str(world)
    )  # no process group is joined: the error comes first
    with pytest.raises(SystemExit) as exit_info:
        train.main(args(data_root, tmp_path / "out", "--n_head=2", *extra))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err
    assert not dist.is_initialized()


def join_alone(tmp_path, device):
    """A process group of one: gloo on the CPU, NCCL on a GPU."""
    if device.type == "cuda":
        dist.init_process_group(
            "nccl",
            init_method=f"file://{tmp_path / 'init'}",
            rank=0,
            world_size=1,
            device_id=device,
        )
    else:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1
        )


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda:0",  # NCCL's device_id needs an index
            marks=[
                pytest.mark.cuda,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
            ],
        ),
    ],
)
@pytest.mark.parametrize("zigzag", [False, True])
def test_attached_model_of_one_rank_is_the_model(tmp_path, float32_cuda_matmuls, device, zigzag):
    """A ring of one: the hooks (positions, ring attention) change neither the
    loss nor the gradients; no attention maps nor KV cache from a split model."""
    device = torch.device(device)
    join_alone(tmp_path, device)
    try:
        torch.manual_seed(0)
        config = GPTConfig(
            block_size=16, vocab_size=11, n_layer=2, n_head=4, n_kv_head=2, n_embd=16, rope=zigzag
        )
        model = GPT(config).to(device)
        split = ContextParallel(1, zigzag).attach(GPT(config).to(device))
        split.load_state_dict(model.state_dict())
        idx = torch.randint(0, 11, (2, 16), device=device)
        losses = [m(idx, idx)[1] for m in (split, model)]
        torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=1e-5)
        for loss in losses:
            loss.backward()
        for (name, a), b in zip(split.named_parameters(), model.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-5, msg=name)
        with pytest.raises(ValueError, match="no attention maps"):
            split.attention_maps(idx)
        with pytest.raises(ValueError, match="no attention maps"):
            split.generate(idx[:, :2], 2)
    finally:
        dist.destroy_process_group()
