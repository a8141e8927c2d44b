"""Precision from the hardware: the dtype that 'auto' picks for each kind of CPU
and GPU (capabilities faked), and Muon's orthogonalisation in float32 where
bfloat16 is emulated, checked against torch.optim.Muon and a float64 oracle."""

import copy

import pytest
import torch

import hardware
import optim
import train

X86 = {"architecture": "x86_64", "avx2": True, "avx512_bf16": False, "amx_bf16": False}


@pytest.fixture
def cpu(monkeypatch):
    """Fake the CPU's capabilities: cpu(**flags) sets them for the next native_bf16 call."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)

    def fake(**flags):
        hardware.cpu_native_bf16.cache_clear()
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: dict(X86, **flags))
    yield fake
    hardware.cpu_native_bf16.cache_clear()


@pytest.mark.parametrize("flags, dtype, why", [
    (dict(), "float32", "no native bfloat16"),  # a laptop or cloud CPU with AVX2 only
    (dict(avx512_bf16=True), "bfloat16", "native bfloat16: avx512_bf16"),
    (dict(amx_bf16=True), "bfloat16", "native bfloat16: amx_bf16"),
    (dict(avx512_f=True, avx512_bw=True), "float32", "no native bfloat16"),  # AVX-512 without BF16
])
def test_auto_dtype_on_x86_follows_the_bf16_flags(cpu, flags, dtype, why):
    cpu(**flags)
    assert hardware.auto_dtype("cpu") == (dtype, why)


def test_onednn_isa_limit_forces_the_float32_path(cpu, monkeypatch):
    cpu(avx512_bf16=True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    assert hardware.auto_dtype("cpu") == ("float32", "no native bfloat16: ONEDNN_MAX_CPU_ISA=AVX2")
    hardware.cpu_native_bf16.cache_clear()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # a level with bf16 kernels
    assert hardware.auto_dtype("cpu")[0] == "bfloat16"


@pytest.mark.parametrize("ratio, dtype", [(0.6, "bfloat16"), (35.0, "float32")])
def test_other_cpus_decide_by_a_timed_matmul(cpu, monkeypatch, ratio, dtype):
    cpu(architecture="aarch64", avx2=False)
    monkeypatch.setattr(hardware, "bf16_slowdown", lambda: ratio)
    chosen, why = hardware.auto_dtype("cpu")
    assert chosen == dtype and f"{ratio:.1f}x" in why


def test_the_timed_matmul_measures_this_cpu():
    ratio = hardware.bf16_slowdown()
    native = hardware.cpu_native_bf16()[0]
    assert ratio > 0 and torch.get_num_threads() == 1  # the thread count is restored
    if not native:
        assert ratio > 1.5  # emulated bfloat16 is slower than float32

@pytest.mark.parametrize("native, dtype", [(True, "bfloat16"), (False, "float16")])
def test_cuda_counts_only_native_bf16(monkeypatch, native, dtype):
    calls = []

    def is_bf16_supported(including_emulation=True):
        calls.append(including_emulation)
        return native or including_emulation  # a V100 or T4: bf16 only emulated
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert hardware.auto_dtype("cuda")[0] == dtype and calls == [False]


def test_training_start_line_names_the_choice_and_why(cpu, data_root, tmp_path, capsys):
    cpu()  # AVX2 only
    out = tmp_path / "out"
    train.main(["--dataset=shakespeare_char", f"--data_root={data_root}", f"--out_dir={out}", "--device=cpu",
                "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
                "--max_iters=1", "--eval_iters=1", "--compile=False", "--gradient_accumulation_steps=1"])
    assert "| cpu, float32 (no native bfloat16) |" in capsys.readouterr().out


def test_explicit_bfloat16_on_an_emulating_cpu_warns_once(cpu, data_root, tmp_path, capsys):
    cpu()
    out = tmp_path / "out"
    train.main(["--dataset=shakespeare_char", f"--data_root={data_root}", f"--out_dir={out}", "--device=cpu",
                "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
                "--max_iters=2", "--eval_iters=1", "--compile=False", "--gradient_accumulation_steps=1",
                "--dtype=bfloat16"])
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "emulated" in warnings[0] and "--dtype=auto" in warnings[0]
    assert "| cpu, bfloat16 (as set) |" in captured.out and "done at iter 2" in captured.out


# -----------------------------------------------------------------------------
# Muon in float32


def newton_schulz_float64(g, steps=5, coefficients=(3.4445, -4.7750, 2.0315)):
    """The same polynomial iteration, written out in float64: X <- aX + b(XX^T)X + c(XX^T)^2 X."""
    a, b, c = coefficients
    x = g.double()
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / x.norm()
    for _ in range(steps):
        s = x @ x.T
        x = a * x + b * (s @ x) + c * (s @ (s @ x))
    return x.T if transposed else x


SHAPES = [(48, 192), (192, 48), (96, 96)]  # wide, tall, square


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_iteration_is_the_bf16_iteration_without_rounding(shape):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    exact = newton_schulz_float64(g)
    ours = optim.newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7)
    theirs = torch.optim._muon._zeropower_via_newtonschulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7)
    assert ours.dtype == torch.float32 and theirs.dtype == torch.bfloat16
    assert (ours.double() - exact).abs().max() < 1e-4  # float32 rounding only
    gap = (theirs.double() - exact).norm() / exact.norm()
    assert 1e-3 < gap < 0.05  # bfloat16's 8-bit mantissa, compounded over 5 steps


def muon_pair(shape, seed=0):
    torch.manual_seed(seed)
    w = torch.randn(shape)
    p_ref, p_ours = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    kwargs = dict(lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    return (p_ref, torch.optim.Muon([p_ref], **kwargs)), (p_ours, optim.Muon([p_ours], float32=True, **kwargs))


def step_with(param, optimizer, grad):
    before = param.detach().clone()
    param.grad = grad.clone()
    optimizer.step()
    return param.detach() - before


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_muon_update_equals_torch_muon_within_bf16_tolerance(shape):
    (p_ref, ref), (p_ours, ours) = muon_pair(shape)
    for i in range(3):
        grad = torch.randn(shape, generator=torch.Generator().manual_seed(10 + i))
        # from the same state each time: the reference's, copied over
        p_ours.data.copy_(p_ref.data)
        ours.load_state_dict(copy.deepcopy(ref.state_dict()))  # no shared buffers
        d_ref, d_ours = step_with(p_ref, ref, grad), step_with(p_ours, ours, grad)
        assert (d_ours - d_ref).norm() / d_ref.norm() < 0.05
        assert torch.equal(ours.state[p_ours]["momentum_buffer"], ref.state[p_ref]["momentum_buffer"])
    assert torch.optim._muon._zeropower_via_newtonschulz.__name__ == "_zeropower_via_newtonschulz"  # restored


def test_muon_state_moves_between_the_two_and_resumes():
    (p_ref, ref), (p_ours, ours) = muon_pair((64, 32))
    grads = [torch.randn(64, 32, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    for g in grads[:3]:
        step_with(p_ref, ref, g)
    saved = copy.deepcopy(ref.state_dict())
    assert ours.state_dict()["param_groups"][0].keys() == saved["param_groups"][0].keys()
    # resume the bf16 run with the float32 optimizer: the next step matches the bf16 one's
    p_ours.data.copy_(p_ref.data)
    ours.load_state_dict(saved)
    d_ours, d_ref = step_with(p_ours, ours, grads[3]), step_with(p_ref, ref, grads[3])
    assert (d_ours - d_ref).norm() / d_ref.norm() < 0.05
    # and back: a float32 checkpoint resumes in torch.optim.Muon
    ref.load_state_dict(copy.deepcopy(ours.state_dict()))
    p_ref.data.copy_(p_ours.data)
    assert torch.equal(ref.state[p_ref]["momentum_buffer"], ours.state[p_ours]["momentum_buffer"])


@pytest.mark.parametrize("native", [True, False])
def test_training_picks_the_iteration_from_the_hardware(monkeypatch, native):
    monkeypatch.setattr(optim, "native_bf16", lambda device_type: (native, "faked"))
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11))
    cfg = dict(train.DEFAULTS, optimizer="muon")
    muon, adamw = optim.make_optimizers(model, cfg, "cpu")
    assert isinstance(muon, torch.optim.Muon) and muon.float32 == (not native)
