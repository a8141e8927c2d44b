"""Precision from the hardware: whether bfloat16 runs on this CPU (tried in a
child process, with crashes simulated), the dtype that 'auto' picks from that
verdict and from timing the model, the entry points on a CPU where bfloat16
crashes, and Muon's orthogonalisation in float32, checked against
torch.optim.Muon and a float64 oracle."""

import ast
import copy
import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import train
from data.dataset import load_split
from support import bf16_verdict, cpu_probe, hardware, optim
from support.settings import Settings, model_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "--device=cpu",
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=16",
    "--batch_size=2",
    "--eval_iters=1",
    "--compile=False",
    "--gradient_accumulation_steps=1",
]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty verdict cache and no verdict yet in this process; bf16_verdict's state is
    restored after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(bf16_verdict, "_verdict", None)
    return tmp_path / "cache"


def given_verdict(monkeypatch, verdict):
    """This process's verdict, on a CPU whose flags promise native bfloat16: the
    verdict decides, whatever this machine's flags say (bf16_ruled_out)."""
    monkeypatch.setattr(hardware, "bf16_ruled_out", lambda: "")
    monkeypatch.setattr(bf16_verdict, "_verdict", verdict)


def python(code, without=(), **env):
    """Run code in a fresh interpreter from the repo root, in this environment less
    the variables named in without, plus env: (exit code, stdout, stderr). A child
    that simulates a CPU class is that machine, not this one as its caller capped it:
    it keeps no ONEDNN_MAX_CPU_ISA or ATEN_CPU_CAPABILITY of the caller's."""
    if "GPT_SIMULATE_CPU" in env:
        without = (*without, "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
    kept = {k: v for k, v in os.environ.items() if k not in without}
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(kept, OMP_NUM_THREADS="1", **env),
    )
    return r.returncode, r.stdout, r.stderr


# -----------------------------------------------------------------------------
# The probe: bfloat16 tried in a child process, its verdict cached


def test_the_probe_sees_this_cpu_run_bfloat16_and_caches_it(fresh, monkeypatch):
    if "torch" in sys.modules and os.environ.get(hardware.ISA) == bf16_verdict.AMX_FREE_ISA:
        monkeypatch.delenv(hardware.ISA)  # probe this machine as it is, not as the fix left it
    verdict = bf16_verdict.check_bf16()
    assert verdict["runs"] in (True, False) and (verdict["runs"] or verdict["why"])
    if verdict["runs"]:
        assert verdict["slowdown"] > 0
    assert time.strptime(verdict["measured_at"], "%Y-%m-%d %H:%M")
    # the second call reads the cache: no child process
    monkeypatch.setattr(bf16_verdict, "_verdict", None)
    monkeypatch.setattr(cpu_probe, "probe", lambda extra_env=None: pytest.fail("probed again"))
    assert bf16_verdict.check_bf16() == verdict
    # another torch version, CPU cap or simulated class is another machine: probe again
    monkeypatch.delenv(hardware.SIMULATE, raising=False)
    monkeypatch.setenv(hardware.ISA, "AVX2")
    keys = {bf16_verdict.machine_key()}
    monkeypatch.delenv(hardware.ISA)
    keys.add(bf16_verdict.machine_key())
    for simulated in cpu_probe.SIMULATED_CLASSES:
        monkeypatch.setenv(hardware.SIMULATE, simulated)
        keys.add(bf16_verdict.machine_key())
    assert len(keys) == 2 + len(cpu_probe.SIMULATED_CLASSES)


def test_a_cpu_whose_amx_crashes_gets_bfloat16_through_the_onednn_cap(tmp_path):
    """As on a VM that advertises AMX but kills a process that uses it: the first
    child dies with SIGILL, the second, capped at AVX512-BF16, lives; this process
    sets the cap before torch loads and then really multiplies in bfloat16."""
    code = (
        "import os; from support import bf16_verdict, hardware; "
        "v = bf16_verdict.check_bf16(); import torch; "
        "x = torch.nn.Linear(64, 64).bfloat16()(torch.randn(4, 64).bfloat16()); "
        "print(v['runs'], v['env'], v['amx_crashed'], os.environ['ONEDNN_MAX_CPU_ISA'], x.dtype); "
        "print(hardware.auto_dtype('cpu')[1])"
    )
    code_rc, out, err = python(
        code, without=(hardware.ISA,), XDG_CACHE_HOME=str(tmp_path), GPT_SIMULATE_CPU="amx_sigill"
    )
    assert code_rc == 0, err
    first, why = out.splitlines()
    assert (
        first
        == "True {'ONEDNN_MAX_CPU_ISA': 'AVX512_CORE_BF16'} SIGILL AVX512_CORE_BF16 torch.bfloat16"
    )
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16" in why and "AMX" in why


def test_a_cpu_where_bfloat16_always_crashes_falls_back_to_float32(tmp_path):
    code = (
        "from support import bf16_verdict, hardware; "
        "v = bf16_verdict.check_bf16(); print(v['runs']); "
        "print(hardware.auto_dtype('cpu')); print(hardware.bf16_error('cpu'))"
    )
    code_rc, out, err = python(code, XDG_CACHE_HOME=str(tmp_path), GPT_SIMULATE_CPU="sigill")
    assert code_rc == 0, err
    runs, auto, error = out.splitlines()
    assert runs == "False" and auto.startswith("('float32', 'bfloat16 crashes on this CPU (SIGILL")
    assert (
        error.startswith("--dtype=bfloat16 cannot run here: bfloat16 crashes")
        and "--dtype=float32" in error
    )
    # and the simulated machine really dies at a bfloat16 op, as the real one would
    code_rc, _, err = python(
        "from support import bf16_verdict; bf16_verdict.check_bf16(); import torch; "
        "torch.randn(8, 8).bfloat16() @ torch.randn(8, 8).bfloat16()",
        XDG_CACHE_HOME=str(tmp_path),
        GPT_SIMULATE_CPU="sigill",
    )
    assert code_rc == -4 and "simulated SIGILL" in err


# What each CPU class gets, simulated (GPT_SIMULATE_CPU), so that every class is
# tested on any machine: (the verdict's runs, auto's dtype, the start of auto's
# reason, whether an explicit --dtype=bfloat16 is refused)
CLASSES = {
    # from the flags alone: nothing to measure
    "avx2": (
        True,
        "float32",
        "no native bfloat16: the CPU's flags name none of avx512_bf16, amx_bf16, bf16",
        False,
    ),
    "avx512_bf16": (True, "bfloat16", "native bfloat16; measured ", False),
    "amx": (True, "bfloat16", "native bfloat16; measured ", False),
    "amx_sigill": (
        True,
        "bfloat16",
        "native bfloat16, with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16: oneDNN's AMX kernels crash "
        "on this CPU (SIGILL); measured ",
        False,
    ),
    "sigill": (
        False,
        "float32",
        "bfloat16 crashes on this CPU (SIGILL in a test run, also with "
        "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16); measured ",
        True,
    ),
}
VERDICT_CODE = (
    "import json; from support import bf16_verdict, hardware; v = bf16_verdict.check_bf16(); "
    "print(json.dumps(dict(v, auto=hardware.auto_dtype('cpu'), error=hardware.bf16_error('cpu'))))"
)


def test_every_class_is_simulated():
    assert set(CLASSES) == set(cpu_probe.SIMULATED_CLASSES)


@pytest.mark.parametrize("simulated", CLASSES)
def test_each_cpu_class_gets_its_verdict_its_cache_and_its_dtype(data_root, tmp_path, simulated):
    """The verdict of each class, probed once and cached; then train.py with dtype=auto
    reads it: its start-up line names the precision, why, and when the choice was
    measured, and it trains."""
    runs, dtype, why, refused = CLASSES[simulated]
    without = (hardware.ISA, hardware.SIMULATE)
    env = dict(XDG_CACHE_HOME=str(tmp_path / "cache"), GPT_SIMULATE_CPU=simulated)
    code_rc, out, err = python(VERDICT_CODE, without, **env)
    assert code_rc == 0, err
    verdict = json.loads(out)
    assert verdict["simulated"] == simulated and verdict["runs"] == runs
    assert verdict["auto"][0] == dtype and verdict["auto"][1].startswith(why), verdict
    measured = simulated != "avx2"
    if measured:
        assert verdict["auto"][1].endswith("python -m support.hardware --again measures again")
    else:
        assert verdict["auto"][1] == why
    if refused:
        assert verdict["error"].startswith("--dtype=bfloat16 cannot run here: bfloat16 crashes")
    else:
        assert verdict["error"] is None
    if simulated == "avx2":
        # tried all the same (an explicit --dtype=bfloat16 asks whether it runs): really
        # emulated in the probe's child, oneDNN and ATen capped there
        assert verdict["slowdown"] > bf16_verdict.NATIVE_SLOWDOWN
    # the second process reads the same verdict from the cache, measured_at included
    assert json.loads(python(VERDICT_CODE, without, **env)[1]) == verdict
    cache = json.loads((tmp_path / "cache" / "hackable-gpt" / "bf16.json").read_text())
    assert [entry["verdict"]["simulated"] for entry in cache.values()] == [simulated]

    kept = {k: v for k, v in os.environ.items() if k not in without}
    argv = ["train.py", "--dataset=shakespeare_char", f"--data_root={data_root}"]
    argv += [f"--out_dir={tmp_path}/out", *TINY, "--max_iters=1"]
    r = run(argv, dict(kept, OMP_NUM_THREADS="1", **env))
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(line for line in r.stdout.splitlines() if "parameters |" in line)
    if measured:
        assert "python -m support.hardware --again measures again" in line
    if dtype == "bfloat16":
        # native: the faster of the two on this model, timed
        assert re.search(r"\| cpu, (bfloat16|float32) \(faster than", line), line
    elif not measured:
        assert f"| cpu, float32 ({why}) |" in line, line
    else:
        # the cached verdict, not a new one
        assert f"| cpu, float32 ({why}" in line and verdict["measured_at"] in line, line
    assert "done at iter 1" in r.stdout


def test_an_unknown_class_is_one_line(tmp_path):
    code_rc, _, err = python(VERDICT_CODE, XDG_CACHE_HOME=str(tmp_path), GPT_SIMULATE_CPU="avx3")
    assert code_rc == 1 and "Traceback" not in err
    assert err.strip() == (
        "error: GPT_SIMULATE_CPU=avx3 is no CPU class; use one of "
        "avx2, avx512_bf16, amx, amx_sigill, sigill"
    )


def test_the_verdicts_command_refuses_an_option_it_does_not_take(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "support.hardware", "--again=False"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)),
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (
        "error: unknown option '--again=False'; python -m support.hardware [--again]"
    )
    assert os.listdir(tmp_path) == []  # nothing probed, nothing cached


def test_the_fix_comes_too_late_once_torch_is_loaded(fresh, monkeypatch):
    monkeypatch.setenv(hardware.SIMULATE, "amx_sigill")
    monkeypatch.delenv(hardware.ISA, raising=False)
    verdict = bf16_verdict.check_bf16()  # torch is loaded in this process
    assert not verdict["runs"] and hardware.ISA not in os.environ
    assert verdict["why"] == (
        "bf16 crashes in oneDNN's AMX kernels on this CPU; "
        "set ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 to use AVX512-BF16"
    )


@pytest.mark.parametrize(
    "verdict, dtype, why",
    [
        (dict(runs=True, env={}, slowdown=0.5), "bfloat16", "native bfloat16"),
        (
            dict(runs=True, env={}, slowdown=40.0),
            "float32",
            "no native bfloat16: a matrix multiply takes 40x",
        ),
        (
            dict(runs=False, env={}, why="bfloat16 crashes on this CPU"),
            "float32",
            "bfloat16 crashes on this CPU",
        ),
    ],
)
def test_auto_dtype_follows_the_verdict(monkeypatch, verdict, dtype, why):
    monkeypatch.delenv(hardware.ISA, raising=False)
    given_verdict(monkeypatch, verdict)
    chosen, reason = hardware.auto_dtype("cpu")
    assert chosen == dtype and reason.startswith(why)


def test_onednn_cap_below_bf16_is_named_and_nothing_is_tried(monkeypatch):
    monkeypatch.setenv(hardware.ISA, "avx2")
    monkeypatch.setattr(bf16_verdict, "check_bf16", lambda again=False: pytest.fail("tried"))
    assert hardware.auto_dtype("cpu") == (
        "float32",
        "no native bfloat16: ONEDNN_MAX_CPU_ISA=AVX2 leaves out its instructions",
    )


@pytest.mark.parametrize(
    "flags, ruled_out",
    [
        ("fpu sse2 avx avx2 fma", True),  # x86 with AVX2 alone: most laptops
        ("fpu avx2 avx512f avx512_bf16", False),
        ("fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16", False),
        ("fp asimd sve bf16", False),  # Arm with its bf16 extension
        ("fp asimd", True),
        ("", False),  # no /proc/cpuinfo (macOS): tried, not assumed
    ],
)
def test_only_flags_without_bfloat16_rule_it_out(monkeypatch, flags, ruled_out):
    monkeypatch.delenv(hardware.ISA, raising=False)
    monkeypatch.delenv(hardware.SIMULATE, raising=False)
    monkeypatch.setattr(hardware, "cpuinfo", lambda fields: flags)
    why = hardware.bf16_ruled_out()
    assert bool(why) == ruled_out
    if ruled_out:
        assert why == "the CPU's flags name none of avx512_bf16, amx_bf16, bf16"


def test_cpuinfo_gives_the_first_value_that_is_there(tmp_path):
    # a field may be listed empty before it is given (some virtual machines' first
    # processor); an empty value then would rule bfloat16 in on an AVX2 CPU, or name
    # no model in the verdict's cache key
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t:\nflags\t\t:\nmodel name\t: Some CPU\nflags\t\t: fpu avx2\n")
    assert hardware.cpuinfo(("model name",), info) == "Some CPU"
    assert hardware.cpuinfo(hardware.FLAG_FIELDS, info) == "fpu avx2"
    assert hardware.cpuinfo(("Hardware",), info) == ""
    assert hardware.cpuinfo(hardware.FLAG_FIELDS, tmp_path / "none") == ""


def test_a_cpu_without_bfloat16_flags_runs_no_probe(tmp_path):
    """An entry point on an AVX2-only CPU (simulated): dtype='auto' is float32 from
    the flags alone: no child process, no cache written, the reason said."""
    code = (
        "import support.before_torch; from support import hardware; import sys; "
        "print(hardware.auto_dtype('cpu')); print('support.cpu_probe' in sys.modules)"
    )
    cache = tmp_path / "cache"
    code_rc, out, err = python(
        code, (hardware.ISA,), XDG_CACHE_HOME=str(cache), GPT_SIMULATE_CPU="avx2"
    )
    assert code_rc == 0, err
    assert out.splitlines() == [
        "('float32', \"no native bfloat16: the CPU's flags name none of avx512_bf16, amx_bf16, "
        'bf16")',
        "True",  # imported for the simulated class's flags, but nothing probed
    ]
    assert not cache.exists()


def test_the_faster_precision_wins_and_is_timed_once(fresh, monkeypatch):
    given_verdict(monkeypatch, dict(runs=True, env={}, slowdown=0.5))
    calls = []

    def seconds(dtype):
        calls.append(dtype)
        return {"bfloat16": 0.170, "float32": 0.132}[dtype]

    dtype, why = bf16_verdict.faster_cpu_dtype("shape A", seconds)
    assert dtype == "float32"
    assert why.startswith(
        "faster than bf16 here: 132 vs 170 ms per forward and backward; measured "
    )
    assert why.endswith(", python -m support.hardware --again measures again")
    # rounds that alternate the two precisions, then the cache
    assert calls == ["bfloat16", "float32"] * 3
    assert bf16_verdict.faster_cpu_dtype("shape A", seconds) == (dtype, why)
    assert len(calls) == 6
    dtype, why = bf16_verdict.faster_cpu_dtype(
        "shape B", lambda d: {"bfloat16": 0.07, "float32": 0.1}[d]
    )
    assert dtype == "bfloat16"
    assert why.startswith("faster than float32 here: 70 vs 100 ms per forward and backward")


def test_a_burst_of_load_does_not_decide_the_precision(fresh, monkeypatch):
    """Other work on the machine while one precision is timed (here: bfloat16's first
    pass, five times slower) is outvoted by the rounds after it."""
    given_verdict(monkeypatch, dict(runs=True, env={}, slowdown=0.5))
    passes = []

    def seconds(dtype):
        passes.append(dtype)
        if passes == ["bfloat16"]:
            return 0.35
        return {"bfloat16": 0.07, "float32": 0.1}[dtype]

    assert bf16_verdict.faster_cpu_dtype("shape C", seconds)[0] == "bfloat16"


def test_a_busy_machine_gets_the_quiet_machines_verdict(fresh):
    """The bfloat16 probe measured while two processes keep both cores busy finds the
    same class as without them: its rounds alternate the precisions and keep the best."""
    quiet = cpu_probe.new_verdict()
    spin = [sys.executable, "-c", "while True: pass"]
    spinners = [subprocess.Popen(spin) for _ in range(2)]
    try:
        busy = cpu_probe.new_verdict()
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert busy["runs"] == quiet["runs"]
    if quiet["runs"]:
        native = quiet["slowdown"] <= bf16_verdict.NATIVE_SLOWDOWN
        assert (busy["slowdown"] <= bf16_verdict.NATIVE_SLOWDOWN) == native, (quiet, busy)


def test_a_slowdown_that_contradicts_the_flags_is_measured_again(monkeypatch):
    figures = iter([9.0, 8.0, 0.6])
    monkeypatch.setattr(cpu_probe, "bf16_slowdown", lambda: next(figures))
    # native flags and an emulated figure: measured again until it agrees
    assert cpu_probe.steady_slowdown(flags_promise_native=True) == (0.6, 3)
    # no native flags: the first emulated figure agrees
    monkeypatch.setattr(cpu_probe, "bf16_slowdown", lambda: 40.0)
    assert cpu_probe.steady_slowdown(flags_promise_native=False) == (40.0, 1)
    # a CPU that never does what its flags say is believed after the last attempt
    assert cpu_probe.steady_slowdown(flags_promise_native=True) == (40.0, 3)


@pytest.mark.bf16
def test_the_real_timing_measures_both_precisions(fresh, data_root, monkeypatch):
    given_verdict(monkeypatch, dict(runs=True, env={}, slowdown=0.5))
    cfg = Settings(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=2)
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(**model_args(cfg, 65)))
    data = load_split(
        os.path.join(data_root, "shakespeare_char"), "val", 16, 65, torch.device("cpu")
    )
    rng = torch.get_rng_state()
    dtype, why = bf16_verdict.time_cpu_dtypes(cfg, model, data)
    assert dtype in ("bfloat16", "float32") and "ms per forward and backward" in why
    assert torch.equal(torch.get_rng_state(), rng) and all(
        p.grad is None for p in model.parameters()
    )


@pytest.mark.parametrize("native, dtype", [(True, "bfloat16"), (False, "float16")])
def test_cuda_counts_only_native_bf16(monkeypatch, native, dtype):
    calls = []

    def is_bf16_supported(including_emulation=True):
        calls.append(including_emulation)
        return native or including_emulation  # a V100 or T4: bf16 only emulated

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert hardware.auto_dtype("cuda")[0] == dtype and calls == [False]


def test_training_start_line_names_the_choice_and_why(data_root, tmp_path, capsys, monkeypatch):
    given_verdict(monkeypatch, dict(runs=True, env={}, slowdown=35.0))  # emulated after all
    # as on an AVX2 CPU, where nothing caps oneDNN (a cap set here would be named)
    monkeypatch.delenv(hardware.ISA, raising=False)
    train.main(
        [
            "--dataset=shakespeare_char",
            f"--data_root={data_root}",
            f"--out_dir={tmp_path}",
            *TINY,
            "--max_iters=1",
        ]
    )
    assert (
        "| cpu, float32 (no native bfloat16: a matrix multiply takes 35x float32's time) |"
        in capsys.readouterr().out
    )


@pytest.mark.bf16
def test_explicit_bfloat16_on_an_emulating_cpu_warns_once(data_root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bf16_verdict, "_verdict", dict(runs=True, env={}, slowdown=35.0))
    train.main(
        [
            "--dataset=shakespeare_char",
            f"--data_root={data_root}",
            f"--out_dir={tmp_path}",
            *TINY,
            "--max_iters=2",
            "--dtype=bfloat16",
        ]
    )
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "emulated" in warnings[0] and "--dtype=auto" in warnings[0]
    assert "| cpu, bfloat16 (as set) |" in captured.out and "done at iter 2" in captured.out


# -----------------------------------------------------------------------------
# Entry points on a CPU whose bfloat16 crashes (simulated: any bfloat16 op on
# the CPU kills the process with SIGILL, as oneDNN's AMX kernels do there)


def crashing(tmp_path, mode="sigill"):
    env = {k: v for k, v in os.environ.items() if k != hardware.ISA}
    return dict(
        env, OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), GPT_SIMULATE_CPU=mode
    )


def run(argv, env, timeout=300):
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_main_command_runs_in_float32_where_bfloat16_crashes(data_root, tmp_path):
    r = run(
        [
            "train.py",
            "config/shakespeare.py",
            f"--data_root={data_root}",
            f"--out_dir={tmp_path}/out",
            "--batch_size=2",
            "--gradient_accumulation_steps=1",
            "--max_iters=1",
            "--eval_iters=1",
            # the whole val split at the end runs no other path
            "--eval_full_val=False",
            "--compile=False",
        ],
        crashing(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("config/shakespeare.py: no GPU found")
    assert "| cpu, float32 (bfloat16 crashes on this CPU (SIGILL in a test run" in r.stdout


@pytest.mark.parametrize(
    "mode, dtype, why",
    [
        (
            "sigill",
            "float32",
            "bfloat16 crashes on this CPU (SIGILL in a test run, also with ONEDNN_MAX_CPU_ISA",
        ),
        (
            "amx_sigill",
            None,
            "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 set: "
            "oneDNN's AMX kernels crash on this CPU (SIGILL)",
        ),
    ],
)
def test_cpu_recipe_where_bfloat16_crashes(data_root, tmp_path, mode, dtype, why):
    # uncompiled: a simulated class changes the verdict, not the machine, and compiling
    # here would try this machine's compiler (tests/test_recipe_15min.py does) for 20 s;
    # two sequences a batch: amx_sigill times both precisions (bfloat16 emulated here)
    r = run(
        [
            "train.py",
            "config/shakespeare_cpu.py",
            f"--data_root={data_root}",
            f"--out_dir={tmp_path}/out",
            "--batch_size=2",
            "--max_iters=3",
            "--eval_iters=1",
            "--eval_full_val=False",
            "--compile=False",
        ],
        crashing(tmp_path, mode),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(line for line in r.stdout.splitlines() if "parameters |" in line)
    assert why in line and "done at iter 3" in r.stdout
    if dtype:
        assert f"| cpu, {dtype} (" in line


def test_explicit_bfloat16_where_it_crashes_is_one_line(data_root, tmp_path):
    for argv in (
        [
            "train.py",
            "config/shakespeare_cpu.py",
            f"--data_root={data_root}",
            "--dtype=bfloat16",
            f"--out_dir={tmp_path}/out",
        ],
        ["sample.py", f"--out_dir={tmp_path}/none", "--dtype=bfloat16", "--device=cpu"],
    ):
        r = run(argv, crashing(tmp_path))
        assert r.returncode not in (0, -4) and "Traceback" not in r.stderr, r.stderr
        last_line = r.stderr.strip().splitlines()[-1]
        assert last_line.endswith(
            "--dtype=bfloat16 cannot run here: bfloat16 crashes on this CPU (SIGILL in a test run, "
            "also with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16); use --dtype=float32"
        )


def test_tests_that_need_bfloat16_are_skipped_with_the_probes_reason(tmp_path):
    r = run(
        [
            "-m",
            "pytest",
            "-rs",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",  # one test: no workers to start
            "tests/test_train.py",
            "-k",
            "bfloat16_training_on_cpu_learns",
        ],
        crashing(tmp_path),
    )
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout[-2000:]
    assert "bfloat16 does not run on this CPU: bfloat16 crashes on this CPU (SIGILL" in r.stdout


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


@pytest.mark.bf16  # torch.optim.Muon orthogonalises in bfloat16
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
    return (p_ref, torch.optim.Muon([p_ref], **kwargs)), (
        p_ours,
        optim.Muon([p_ours], float32=True, **kwargs),
    )


def step_with(param, optimizer, grad):
    before = param.detach().clone()
    param.grad = grad.clone()
    optimizer.step()
    return param.detach() - before


@pytest.mark.bf16  # torch.optim.Muon orthogonalises in bfloat16
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
        assert torch.equal(
            ours.state[p_ours]["momentum_buffer"], ref.state[p_ref]["momentum_buffer"]
        )
    assert (
        torch.optim._muon._zeropower_via_newtonschulz.__name__ == "_zeropower_via_newtonschulz"
    )  # restored


@pytest.mark.bf16  # torch.optim.Muon orthogonalises in bfloat16
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


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_muon_orthogonalises_in_the_training_precision(dtype):
    from model import GPT, GPTConfig

    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11))
    cfg = Settings(optimizer="muon")
    muon, adamw = optim.make_optimizers(model, cfg, "cpu", dtype)
    assert isinstance(muon, torch.optim.Muon) and muon.float32 == (dtype == "float32")


ENTRY_POINTS = [
    "train.py",
    "sample.py",
    "heads.py",
    "explore.py",
    "bench/__main__.py",
    "bench/train_step.py",
    "bench/generate.py",
    "bench/attention.py",
    "bench/decode.py",
    "bench/recipes.py",
    "bench/long_context.py",
    "bench/smoke_gpu.py",
    "bench/gpu.py",
    "bench/explore.py",
    "experiments/induction_experiment.py",
    "experiments/shakespeare_induction.py",
    "experiments/linear_attention.py",
    "experiments/ring_attention_measure.py",
    "experiments/long_context.py",
    "experiments/trace_plain_gpt.py",
    "experiments/bottleneck.py",
    "experiments/why_sqrt_d.py",
    "experiments/path_length.py",
    "experiments/bidirectional.py",
    "support/hellaswag.py",
    "bench/corpus.py",
    "experiments/plot_loss.py",
    "experiments/shakespeare_induction.py",
    "export.py",
    "experiments/export_exactness.py",
    "experiments/lens_example.py",
    "support/arm_probe.py",
]


def imported_modules(node):
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return []


@pytest.mark.parametrize("path", ENTRY_POINTS)
def test_every_entry_point_checks_bfloat16_before_torch_loads(path):
    """The fix (ONEDNN_MAX_CPU_ISA) only works if it is set before torch loads: the
    first import of torch or of the project's code is support.before_torch."""
    tree = ast.parse(open(os.path.join(REPO, path)).read())
    ours = ("torch", "model", "support", "data", "train", "sample", "heads", "bench", "experiments")
    first = next(
        name
        for node in tree.body  # module level, in order
        for name in imported_modules(node)
        if name.split(".")[0] in ours
    )
    assert first == "support.before_torch"


def test_before_torch_runs_the_check_and_the_tests_do_it_too():
    for path in ("support/before_torch.py", "tests/conftest.py"):
        tree = ast.parse(open(os.path.join(REPO, path)).read())
        check = torch_import = None
        for node in tree.body:
            if check is None and "bf16_verdict.check_bf16()" in ast.unparse(node):
                check = node.lineno
            if torch_import is None and any(
                n.split(".")[0] == "torch" for n in imported_modules(node)
            ):
                torch_import = node.lineno
        assert check is not None and (torch_import is None or check < torch_import), path


def test_the_entry_point_list_is_complete():
    """Any script with a main block that imports torch is in ENTRY_POINTS."""
    scripts = set()
    for folder in ("", "experiments", "bench", "support"):
        for path in glob.glob(os.path.join(REPO, folder, "*.py")):
            text = open(path).read()
            if '__name__ == "__main__"' in text and "import torch" in text:
                scripts.add(os.path.relpath(path, REPO))
    scripts.discard("support/hardware.py")  # the bfloat16 check itself (torch only for CUDA)
    scripts.discard("support/cpu_probe.py")  # the probe, run as the child
    assert scripts <= set(ENTRY_POINTS), scripts - set(ENTRY_POINTS)
