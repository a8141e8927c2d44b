"""The CUDA path, checked without a GPU: the model, generation and training
steps on the meta device (with every op refused that mixes devices), the CUDA
branch of the compiled decode step forced on a CPU, faked GPU names and compute
capabilities, NCCL's settings, DDP around the compiled model under gloo, and
bench/smoke_gpu.py. Tests marked cuda run only on a GPU (python -m bench.smoke_gpu)."""

import datetime
import functools
import inspect
import os
import random
import subprocess
import sys
import types

import pytest
import torch
import torch.distributed as dist
from conftest import child_env, read_log, tiny_run, tiny_settings, torchrun, train_step
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import bench.__main__
import bench.attention
import sample
import support.device
import train
from bench import smoke_gpu
from bench.common import BenchError
from data import dataset
from model import GPT, GPTConfig, attention, causal_mask
from support import distributed, engine
from support.configurator import parse_settings
from support.engine import compiled_decoder, generate_compiled
from support.loading import load_checkpoint
from support.mfu import estimate_mfu, flops_per_token
from support.optim import get_lr, make_optimizers
from support.settings import model_args

REPO = os.path.dirname(os.path.abspath(train.__file__))
META = torch.device("meta")


def train_args(data_root, out_dir, *extra):
    """The tiny run at batch 4; each test sets compile and the micro-steps."""
    return tiny_run(data_root, out_dir, *extra, batch_size=4)


# -----------------------------------------------------------------------------
# The meta device: shapes and devices without any arithmetic


class OneDevicePerOp(TorchDispatchMode):
    """Refuses every op whose tensors sit on more than one device, as CUDA
    kernels do; the meta device alone lets some through (embedding, indexing,
    matmul). A 0-dim CPU tensor counts as a number, as it does on CUDA, and
    copies are how tensors move from one device to another."""

    MOVES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.MOVES:
            devices = {
                t.device
                for t in pytree.tree_leaves((args, kwargs))
                if isinstance(t, torch.Tensor) and not (t.device.type == "cpu" and t.dim() == 0)
            }
            if len(devices) > 1:
                raise RuntimeError(f"{func} mixes devices {sorted(map(str, devices))}")
        return func(*args, **kwargs)


def meta_model(**kw):
    config = GPTConfig(
        block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.1, **kw
    )
    with torch.device("meta"):
        return GPT(config)


def test_a_cpu_tensor_in_a_meta_forward_is_refused():
    model = meta_model()
    model(
        torch.zeros(2, 3, dtype=torch.long)
    )  # the meta device alone lets the embedding lookup pass
    with OneDevicePerOp(), pytest.raises(RuntimeError, match="mixes devices"):
        model(torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize(
    "options",
    [{}, dict(rope=True, qk_norm=True, activation="relu2", n_kv_head=2)],
    ids=["gpt2", "rope-gqa"],
)
def test_generation_on_the_meta_device(options):
    model = meta_model(**options).eval()
    prompt = torch.zeros(2, 5, dtype=torch.long, device=META)
    n = 20  # past block_size 16: the window slides and the cache is rebuilt
    with OneDevicePerOp():
        for use_cache in (True, False):
            for temperature in (0.0, 0.8):
                out = engine.generate(
                    model,
                    prompt,
                    n,
                    temperature=temperature,
                    top_k=10,
                    top_p=0.9,
                    use_cache=use_cache,
                )
                assert out.shape == (2, 5 + n) and out.device == META
        starts = set()
        for token, maps, start in engine.stream(model, prompt, n, temperature=0.0, attention=True):
            assert token.device == META and all(m.device == META for m in maps)
            starts.add(start)
        assert len(starts) > 1  # the window slid
        cache = model.make_kv_cache(2, zero=True)
        model(prompt, kv_cache=cache)
        logits = model.decode_step(prompt[:, -1:], torch.tensor([cache.pos], device=META), cache)
        assert logits.shape == (2, 37) and logits.device == META


@pytest.mark.parametrize("zigzag", [False, True])
def test_ring_attention_on_the_meta_device(zigzag):
    """Ring attention's masks and running sums are made on its inputs' device."""
    from support.ring_attention import Ring, ring_attention

    q = torch.empty(2, 4, 12, 8, device=META, requires_grad=True)
    k, v = (torch.empty(2, 2, 12, 8, device=META, requires_grad=True) for _ in range(2))
    ring = Ring(single=True)
    ring.zigzag = zigzag
    with OneDevicePerOp():
        out = ring_attention(q, k, v, ring=ring, block=5)
        out.sum().backward()
    assert out.shape == q.shape and {t.grad.device for t in (q, k, v)} == {META}


@pytest.fixture
def meta_run(data_root, tmp_path, monkeypatch):
    """setup() as on a GPU, with the meta device in its place."""

    def make(*extra):
        monkeypatch.setattr(train, "pick_device", lambda name, local_rank, ddp: META)
        cfg = train.get_config(
            train_args(
                data_root,
                tmp_path / "out",
                "--compile=False",
                "--grad_clip=1.0",
                "--gradient_accumulation_steps=3",
                "--dropout=0.1",
                *extra,
            )
        )
        return train.setup(cfg)

    return make


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("data", ["tensor", "memmap"])
def test_training_steps_on_the_meta_device(meta_run, monkeypatch, optimizer, data):
    if data == "memmap":
        monkeypatch.setattr(dataset, "SMALL_DATASET", 0)  # a split read batch by batch
    r = meta_run(f"--optimizer={optimizer}")
    assert isinstance(r.splits["train"], torch.Tensor) == (data == "tensor")
    with OneDevicePerOp():
        for it in range(2):
            loss_sum = train_step(r, get_lr(it, r.cfg))
            assert loss_sum.device == META and loss_sum.dim() == 0
        x, y = dataset.get_batch(r.splits["val"], torch.tensor([0, 5]), 8, r.device)
        assert x.device == y.device == META and x.shape == (2, 8)
    assert all(p.device == META for p in r.raw.parameters())
    states = [
        t
        for opt in r.optimizers
        for state in opt.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    ]
    assert states and all(t.device == META for t in states)  # the optimizers stepped, on the device


@pytest.mark.parametrize("data", ["tensor", "memmap"])
def test_a_batch_left_on_the_cpu_fails_the_meta_step(meta_run, monkeypatch, data):
    if data == "memmap":
        monkeypatch.setattr(dataset, "SMALL_DATASET", 0)
    r = meta_run()
    monkeypatch.setattr(dataset, "to_device", lambda t, device: t)  # the bug: a batch never moved
    with (
        OneDevicePerOp(),
        pytest.raises(RuntimeError, match="mixes devices|not on the expected device"),
    ):
        train_step(r, 1e-3)


# -----------------------------------------------------------------------------
# The compiled decode step's CUDA branch, forced on a CPU


@pytest.fixture
def inductor_graphs(monkeypatch):
    """What inductor compiled: per graph, its mutated and static input positions
    and the shapes of its example inputs."""
    import torch._inductor.output_code as output_code

    graphs, init = [], output_code.CompiledFxGraph.__init__
    params = inspect.signature(init)

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        bound = params.bind(self, *args, **kwargs).arguments
        graphs.append(
            dict(
                mutated=set(self.mutated_input_idxs),
                static=set(bound["static_input_idxs"]),
                shapes=[tuple(t.shape) for t in bound["example_inputs"]],
            )
        )

    monkeypatch.setattr(output_code.CompiledFxGraph, "__init__", spy)
    with torch._inductor.config.patch(fx_graph_cache=False):  # a cached graph skips __init__
        yield graphs  # config.patch restores the key; a monkeypatch would delete it from the config


def test_cuda_branch_of_the_compiled_decoder_on_cpu(inductor_graphs):
    torch.manual_seed(0)
    B, c = 2, GPTConfig(block_size=16, vocab_size=37, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
    model = GPT(c).eval()
    step, cache = compiled_decoder(model, B, cuda_graphs=True)
    assert compiled_decoder(model, B, cuda_graphs=True) == (step, cache)  # built once, kept
    assert all(
        getattr(t, "_dynamo_static_input_type", None) for t in cache.k + cache.v + [cache.at]
    )
    idx = torch.randint(0, 37, (B, 4))
    with torch.no_grad():
        logits = model(idx, kv_cache=cache)[0][:, -1]  # the prefill, eager, as generate does it
        for _ in range(6):
            idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
            logits = step(idx[:, -1:])[:, -1]  # advances the cache, on the host and the device
            expected = model(idx)[0][:, -1]  # a full forward, no cache
            torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    (graph,) = inductor_graphs
    cache_shape = (B, c.n_kv_head, c.block_size, c.n_embd // c.n_head)
    # the step writes into every layer's keys and values, and only there
    assert sorted(graph["shapes"][i] for i in graph["mutated"]) == [cache_shape] * (2 * c.n_layer)
    # a CUDA graph replays on the same addresses: whatever it writes must be a
    # static input; only the token is copied in each step (its position is the
    # cache's own device tensor, advanced in place, never copied from the host)
    assert graph["mutated"] <= graph["static"]
    moving = sorted(shape for i, shape in enumerate(graph["shapes"]) if i not in graph["static"])
    assert moving == [(B, 1)]
    assert cache.pos == 10 and cache.at.tolist() == [10]


# -----------------------------------------------------------------------------
# Faked GPUs: dtype choice, device selection, MFU


@pytest.fixture
def fake_gpus(monkeypatch):
    """Pretend to have GPUs; names[i] is the name of GPU i, major its compute capability."""
    gpu = types.SimpleNamespace(current=0, names=["NVIDIA H100 80GB HBM3"], major=9)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpu.names))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: gpu.current)
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: setattr(gpu, "current", torch.device(d).index)
    )
    monkeypatch.setattr(
        torch.cuda, "get_device_name", lambda d=None: gpu.names[gpu.current if d is None else d]
    )
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(major=gpu.major)
    )
    monkeypatch.setattr(
        torch.cuda, "_check_bf16_tensor_supported", lambda d: True
    )  # emulation works, as on a V100
    # a CUDA build of torch (PyPI's, on Linux) asks the driver for the stream at every
    # optimizer step once it sees a GPU; the fake one never captures a graph
    stream = types.SimpleNamespace(is_capturing=lambda: False)
    monkeypatch.setattr(torch.accelerator, "current_stream", lambda device=None: stream)
    return gpu


@pytest.mark.parametrize(
    "major, train_dtype, sample_dtype",
    [
        (7, "float16", torch.float32),  # V100, T4: bf16 only emulated
        (8, "bfloat16", torch.bfloat16),  # A100
        (9, "bfloat16", torch.bfloat16),  # H100
    ],
)
def test_auto_dtype_needs_native_bf16(fake_gpus, major, train_dtype, sample_dtype):
    fake_gpus.major = major
    assert torch.cuda.is_bf16_supported()  # what the check counted before: emulation
    device = support.device.pick_device("cuda")
    dtype, _ = support.device.training_dtype("auto", device)
    assert (device, dtype) == (torch.device("cuda", 0), train_dtype)
    assert support.device.inference_dtype("auto", device) == sample_dtype


def test_cuda_1_becomes_the_current_device(fake_gpus):
    fake_gpus.names = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe"]
    model = GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=1, n_head=2, n_embd=32))
    assert support.device.pick_device("cuda:1") == torch.device("cuda", 1)
    assert fake_gpus.current == 1
    # the MFU is then against GPU 1's peak, not GPU 0's
    assert estimate_mfu(model, 1000, 1.0) == pytest.approx(flops_per_token(model) * 1000 / 756e12)
    # one process per GPU under torchrun: LOCAL_RANK picks it
    assert support.device.pick_device("cuda", 0, True) == torch.device("cuda", 0)
    assert fake_gpus.current == 0
    with pytest.raises(ValueError, match="there is no cuda:2"):
        support.device.pick_device("cuda:2")


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),  # SXM
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("Tesla V100-SXM2-16GB", None),
        ("NVIDIA L4", 121e12),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_mfu_uses_the_peak_of_the_gpu_variant(fake_gpus, name, peak):
    fake_gpus.names = [name]
    model = GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=1, n_head=2, n_embd=32))
    mfu = estimate_mfu(model, 4096, 0.5)
    assert mfu == (pytest.approx(flops_per_token(model) * 4096 / 0.5 / peak) if peak else None)


def test_a_cpu_run_shows_no_mfu_on_a_machine_with_a_gpu(fake_gpus, data_root, tmp_path, capsys):
    model = GPT(GPTConfig(block_size=16, vocab_size=37, n_layer=1, n_head=2, n_embd=32))
    assert estimate_mfu(model, 4096, 0.5) is not None  # the model would report one
    train.main(
        train_args(
            data_root,
            tmp_path,
            "--compile=False",
            "--max_iters=3",
            "--eval_interval=3",
            "--gradient_accumulation_steps=1",
        )
    )
    err = capsys.readouterr().err
    assert "tok_per_s" in err and "mfu" not in err


# -----------------------------------------------------------------------------
# The attention benchmark's check (bench/attention.py), in bfloat16 as on a GPU


def attention_inputs(T, dtype, v_scale=1.0):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 12, T, 64) for _ in range(3))
    return q.to(dtype), k.to(dtype), (v * v_scale).to(dtype), causal_mask(T, T)


@pytest.mark.parametrize(
    "dtype", [pytest.param(torch.bfloat16, marks=pytest.mark.bf16), torch.float32]
)
def test_attention_check_allows_rounding_at_any_magnitude(dtype):
    q, k, v, mask = attention_inputs(
        256, dtype, v_scale=8.0
    )  # outputs near 28, where a bf16 ulp is 0.125
    outputs = {
        "explicit": attention(q, k, v, mask)[0],
        "sdpa": torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    errors = bench.attention.check_attention(q, k, v, mask, outputs, 256)
    assert set(errors) == {"explicit", "sdpa"} and all(
        0 <= e <= bench.attention.ATTENTION_TOLERANCE_ULPS for e in errors.values()
    )
    if dtype == torch.bfloat16:  # the absolute 0.02 this replaces would have stopped the benchmark
        assert (outputs["explicit"].float() - outputs["sdpa"].float()).abs().max() > 0.02


@pytest.mark.parametrize(
    "dtype", [pytest.param(torch.bfloat16, marks=pytest.mark.bf16), torch.float32]
)
def test_attention_check_catches_a_wrong_mask(dtype):
    q, k, v, mask = attention_inputs(128, dtype)
    outputs = {"sdpa": torch.nn.functional.scaled_dot_product_attention(q, k, v)}  # no causal mask
    with pytest.raises(BenchError, match="sdpa path is .* ulps"):
        bench.attention.check_attention(q, k, v, mask, outputs, 128)


# -----------------------------------------------------------------------------
# Several processes: NCCL's settings, DDP around the compiled model


def test_nccl_raises_instead_of_aborting(monkeypatch):
    calls = []
    monkeypatch.setattr(
        dist,
        "init_process_group",
        lambda backend, **kw: calls.append(
            (backend, kw, os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"))
        ),
    )
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # what torchrun sets
    timeout = datetime.timedelta(seconds=5)
    distributed.join_processes(torch.device("cuda", 1), 5)
    # mode 2: on a timeout or error NCCL's watchdog aborts the communicator, not
    # the process, and the next collective raises in the training loop
    assert calls == [("nccl", dict(timeout=timeout, device_id=torch.device("cuda", 1)), "2")]
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    distributed.join_processes(torch.device("cpu"), 5)
    assert calls[1] == ("gloo", dict(timeout=timeout), "1")


def test_ddp_splits_the_compiled_graph_at_its_buckets(tmp_path, monkeypatch):
    """DDPOptimizer splits the training graph where DDP's gradient buckets
    end, so each bucket's all-reduce can start while the backward pass goes on."""
    from torch._dynamo.testing import CompileCounter
    from torch.nn.parallel import DistributedDataParallel

    counter, compile_ = CompileCounter(), torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda m, **keys: compile_(m, backend=counter, **keys)
    )  # graphs counted, not built
    monkeypatch.setattr(
        distributed, "DDP", functools.partial(DistributedDataParallel, bucket_cap_mb=1)
    )
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    try:
        torch._dynamo.reset()
        torch.manual_seed(0)
        raw = GPT(
            GPTConfig(block_size=16, vocab_size=37, n_layer=4, n_head=4, n_embd=256, dropout=0.0)
        )
        ddp_model = distributed.wrap_model(raw, torch.device("cpu"), 2, use_compile=True)
        model = ddp_model.module  # compiled
        x = torch.randint(0, 37, (2, 16))
        with torch.no_grad():  # evaluation comes first in train.py, outside DDP: one graph
            model.eval()
            model(x, x)
            model.train()
        assert counter.frame_count == 1
        ddp_model(x, x)[1].backward()
        assert counter.frame_count - 1 >= 4  # 4 MB of weights in 1 MB buckets: several graphs
        assert all(p.grad is not None for p in raw.parameters())
    finally:
        # DDP's reducer holds the process group: freed after the group is destroyed,
        # gloo's destructor once waited for ever on its run-loop thread
        model = ddp_model = None
        dist.destroy_process_group()
        torch._dynamo.reset()


def test_ddp_compiled_with_no_sync_matches_one_process(data_root, tmp_path, cores_alone):
    """Two gloo processes with the compiled model and two micro-steps each (the
    first under no_sync) log the losses of one process doing all four."""
    common = [
        "--compile=True",
        "--gradient_accumulation_steps=4",
        "--max_iters=4",
        "--eval_interval=2",
        "--lr_decay_iters=4",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    single = subprocess.run(
        [sys.executable, "train.py", *train_args(data_root, one, *common)],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    with cores_alone():
        pair = torchrun(2, train_args(data_root, two, *common), timeout=300)
    assert pair.returncode == 0, (pair.stdout[-2000:], pair.stderr[-4000:])
    # the wait for the compiler is said once, by the process that prints
    assert single.stdout.count("compiling the model") == pair.stdout.count("compiling") == 1
    log_one, log_two = read_log(one), read_log(two)
    assert [r["iter"] for r in log_one] == [r["iter"] for r in log_two] == [0, 2, 4]
    for a, b in zip(log_one, log_two):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-4)
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-4)
    assert log_one[-1]["train_loss"] < log_one[0]["train_loss"]  # it trained
    # the checkpoints hold the model's own keys, not those of the compiled or DDP wrapper
    for out in (one, two):
        ckpt = load_checkpoint(str(out))
        keys = GPT(GPTConfig(**ckpt["model_args"])).state_dict().keys()
        assert ckpt["model"].keys() == keys


# -----------------------------------------------------------------------------
# The CPU's vector width in inductor's cache of compiled graphs

# a child compiles a layer norm as train.py's CPU path does, twice (dynamo's own
# memory of the first cleared between them), and says how many graphs it had found in
# inductor's cache after each: the second finds the first's, the cache is on. The
# scale (argv[1]) makes the graph one that no other test has put in the cache.
WIDTH_CHILD = """
import sys

import torch
from torch._dynamo.utils import counters

from support.device import pin_cpu_vector_width

pin_cpu_vector_width()
scale = float(sys.argv[1])
hits = []
for _ in range(2):
    norm = torch.compile(lambda x: torch.nn.functional.layer_norm(x, (32,)) * scale)
    norm(torch.randn(4, 32, 32))
    hits.append(counters["inductor"]["fxgraph_cache_hit"])
    torch._dynamo.reset()
print(*hits)
"""


def test_a_graph_cached_under_the_avx2_cap_is_not_read_back_at_full_width():
    """A graph compiled with ATEN_CPU_CAPABILITY=avx2 steps by 8 floats; read back by
    an AVX-512 process, whose kernels are built with 16-float vectors, its stores
    write past their buffers (heap corruption). The width must part the cache."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if pick_vec_isa().bit_width() <= 256:
        pytest.skip("this CPU's vectors are no wider than AVX2's: the cap changes nothing")
    # the session's kernel cache (tests/conftest.py), where inductor's probes of the
    # CPU's vector ISAs are already built (some 15 s in a new cache), with a graph
    # of this run's own
    full = child_env()
    full.pop("ATEN_CPU_CAPABILITY", None)
    capped = dict(full, ATEN_CPU_CAPABILITY="avx2")
    scale = str(2 + random.random())
    hits = []
    for env in (capped, full):
        r = subprocess.run(
            [sys.executable, "-c", WIDTH_CHILD, scale],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        hits.append([int(n) for n in r.stdout.split()[-2:]])
    # the full-width process compiles its own graph, though the capped one's is cached
    # and read back within that process
    assert hits == [[0, 1], [0, 1]]


# -----------------------------------------------------------------------------
# bench/smoke_gpu.py


def run_smoke_test(folder, *args):
    """`python -m bench.smoke_gpu args` from folder, the repository on its path."""
    return subprocess.run(
        [sys.executable, "-m", "bench.smoke_gpu", *args],
        cwd=folder,
        env=dict(child_env(), PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_smoke_test_without_cuda_says_so_and_does_nothing(tmp_path):
    proc = run_smoke_test(tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert len(proc.stdout.splitlines()) == 1 and "no CUDA GPU" in proc.stdout
    assert os.listdir(tmp_path) == []


def test_smoke_test_refuses_options_it_does_not_take(tmp_path):
    proc = run_smoke_test(tmp_path, "--device=cuda")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "error: python -m bench.smoke_gpu takes no options, got '--device=cuda'"
    )
    assert os.listdir(tmp_path) == []


def test_smoke_test_commands_are_valid_settings(tmp_path, monkeypatch):
    # config/shakespeare.py is found from the repo root, where bench.smoke_gpu runs
    monkeypatch.chdir(REPO)
    # read as on the GPU the smoke test is for: config/shakespeare.py times no CPU iter
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    parsers = {
        "train.py": train.get_config,
        "sample.py": lambda argv: sample.check_options(
            parse_settings(sample.Settings, argv, allow_files=False)
        ),
        "bench": lambda argv: parse_settings(bench.__main__.Settings, argv, allow_files=False),
    }
    seen = set()
    for name, command in smoke_gpu.steps(str(tmp_path), gpus=2):
        at = next(
            (i for i, word in enumerate(command) if word in parsers), None
        )  # python or torchrun
        if at is not None:
            parsers[command[at]](command[at + 1 :])  # raises on an unknown key or a bad value
            seen.add((command[at], "--context_parallel=2" in command))
    assert seen == {(script, False) for script in parsers} | {("train.py", True)}
    assert not any(
        "--context_parallel=2" in command for _, command in smoke_gpu.steps(str(tmp_path), gpus=1)
    )


def test_smoke_test_reads_the_figures_of_real_runs(data_root, tmp_path, monkeypatch):
    # run from another folder, as `python path/to/bench/gpu.py` is: the steps run in the repository
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    python = sys.executable
    rec = smoke_gpu.run_step(
        "train",
        [
            python,
            "train.py",
            *train_args(
                data_root,
                out,
                "--compile=False",
                "--max_iters=3",
                "--eval_interval=3",
                "--gradient_accumulation_steps=1",
            ),
        ],
        str(tmp_path),
    )
    assert rec["ok"] and rec["error"] is None, rec
    fig = rec["figures"]
    assert fig["best_val_loss"] == pytest.approx(
        min(r["val_loss"] for r in read_log(out)), abs=1e-4
    )
    assert (
        fig["ms_per_iter"] > 0
        and fig["train_tokens_per_s"] > 0
        and fig["device_and_dtype"] == "cpu, float32"
    )
    with open(rec["log"]) as f:
        assert "done at iter 3" in f.read()
    greedy = [
        python,
        "sample.py",
        f"--out_dir={out}",
        "--prompt=ROMEO:",
        "--max_new_tokens=30",
        "--temperature=0",
        "--num_samples=2",
        "--attn_dir=",
    ]
    rec = smoke_gpu.run_step("float32 greedy", greedy, str(tmp_path))
    assert rec["ok"] and rec["figures"]["sample_tokens_per_s"] > 0
    texts = smoke_gpu.samples(rec["stdout"])
    assert len(texts) == 2 and texts[0] == texts[1] and texts[0].startswith("ROMEO:")
    twin = dict(rec, name="float32 greedy --compile")
    (check,) = smoke_gpu.compare([rec, twin])
    assert check["ok"] and smoke_gpu.report(check).startswith("ok")
    twin["stdout"] = rec["stdout"].replace("ROMEO:", "ROMEO;", 1)
    (check,) = smoke_gpu.compare([rec, twin])
    assert not check["ok"] and "character 5" in smoke_gpu.report(check)
    failed = smoke_gpu.run_step("bad", [python, "train.py", "--batch_sze=3"], str(tmp_path))
    assert not failed["ok"] and failed["error"].startswith("error: unknown config key")
    assert smoke_gpu.report(failed).startswith("FAIL  bad")


# -----------------------------------------------------------------------------
# On a GPU only (python -m bench.smoke_gpu runs these)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_decoder_records_a_cuda_graph():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = (
        GPT(GPTConfig(block_size=32, vocab_size=37, n_layer=2, n_head=2, n_embd=32, dropout=0.0))
        .cuda()
        .eval()
    )
    counters.clear()
    prompt = torch.randint(0, 37, (2, 3), device="cuda")
    compiled = generate_compiled(model, prompt, 20, temperature=0.0)
    assert (
        counters["inductor"]["cudagraph_skips"] == 0
    )  # recorded, not skipped (e.g. for mutated inputs)
    assert torch.equal(compiled, model.generate(prompt, 20, temperature=0.0))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_training_step_on_cuda_matches_the_cpu(optimizer, float32_cuda_matmuls):
    def run(device):
        cfg = tiny_settings(
            block_size=16, batch_size=4, gradient_accumulation_steps=2, optimizer=optimizer
        )
        torch.manual_seed(0)
        raw = GPT(GPTConfig(**model_args(cfg, 37))).to(device)
        data = torch.randint(0, 37, (1000,), generator=torch.Generator().manual_seed(1)).to(device)
        r = types.SimpleNamespace(
            cfg=cfg,
            rank=0,
            world=1,
            dp_rank=0,
            dp_world=1,
            split=lambda t: t,
            device=device,
            raw=raw,
            ddp_model=raw,
            optimizers=make_optimizers(raw, cfg, device.type, "float32"),
            scaler=torch.amp.GradScaler(device.type, enabled=False),
            data_gen=torch.Generator().manual_seed(2),
            splits={"train": data},
            ctx=functools.partial(support.device.precision_context, device.type, "float32", 16),
            signals=None,
        )
        losses = [train_step(r, 1e-3).item() for _ in range(3)]
        return losses, [p.detach().cpu() for p in raw.parameters()]

    (cuda_losses, cuda_weights), (cpu_losses, cpu_weights) = (
        run(torch.device("cuda")),
        run(torch.device("cpu")),
    )
    # the two devices add in different orders (Muon orthogonalises in float32 on both)
    assert cuda_losses == pytest.approx(cpu_losses, abs=1e-3)
    for a, b in zip(cuda_weights, cpu_weights):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)
