"""
Which precision is safe and fast on this machine.

bfloat16 halves the bytes moved and, where the hardware multiplies it natively,
runs matrix multiplies several times faster than float32: CUDA GPUs from Ampere
on, and x86 CPUs with AVX512-BF16 or AMX. Elsewhere PyTorch emulates it, and a
CPU matrix multiply in bfloat16 is then about 40x slower than in float32
(docs/benchmarks.md).

A CPU's flags are not proof. Some virtual machines advertise AMX and then do not
let a process use it: oneDNN (PyTorch's CPU bfloat16 matmul library) picks its
AMX kernels and the process dies with SIGILL, no message. So every entry point
calls check_bf16() before it imports torch: a child process runs bfloat16 at the
training step's shapes, and only its death is at stake. Where it dies, a second
child tries oneDNN capped at AVX512-BF16 (ONEDNN_MAX_CPU_ISA, which oneDNN reads
when torch loads); where that lives, this process sets the same cap before
torch loads, and says so. The verdict is cached per CPU model, flags, torch
version and cap, in the user's cache folder, so later runs pay nothing;
`python -m support.hardware` prints it (and probes again with --again).

On a CPU that runs bfloat16 natively, dtype='auto' still trains in it only if a
forward and backward pass of the run's own model is faster than in float32
(faster_cpu_dtype; cached too), and Muon's orthogonalisation follows the
training precision.

Capping oneDNN below AVX512-BF16 (ONEDNN_MAX_CPU_ISA=AVX2) makes bfloat16 really
emulated on a CPU that has it: how the float32 path of a CPU without native
bfloat16 is measured here.

A busy machine must not decide for good: the slowdown is the best of several
rounds that alternate the two precisions, and a figure that contradicts the
CPU's flags (native flags but a slow bfloat16, or the reverse) is measured
again before it is believed. The verdict keeps when it was measured, and the
start-up line says so.

GPT_SIMULATE_CPU makes the probe behave as one of the CPU classes below
(SIMULATED_CLASSES), so that the tests of every class run on any machine: the
verdict, its cache, dtype='auto' and the one-line errors, as on that class.
"""

import hashlib
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import time

ISA = "ONEDNN_MAX_CPU_ISA"
AMX_FREE_ISA = "AVX512_CORE_BF16"  # oneDNN's highest level with bfloat16 but without AMX
# Tests and CI: the CPU class the probe behaves as (see SIMULATED_CLASSES)
SIMULATE = "GPT_SIMULATE_CPU"
# Each class, with the flags such a CPU advertises:
#   avx2         bfloat16 emulated: the probe's child runs with oneDNN and ATen capped to
#                AVX2, so its bfloat16 is really emulated, and its slowdown really measured
#   avx512_bf16  native bfloat16 (where this CPU emulates it, the measured slowdown is kept
#                beside a simulated 1.0)
#   amx          native bfloat16 through AMX tiles, the same way
#   amx_sigill   AMX advertised but not allowed: the probe's child dies with SIGILL unless
#                oneDNN is capped below AMX; capped, it is native (as avx512_bf16)
#   sigill       bfloat16 kills the process whatever the cap
AVX2_FLAGS = {"avx2"}
BF16_FLAGS = AVX2_FLAGS | {"avx512f", "avx512_bf16"}
AMX_FLAGS = BF16_FLAGS | {"amx_tile", "amx_bf16"}
SIMULATED_CLASSES = {
    "avx2": AVX2_FLAGS,
    "avx512_bf16": BF16_FLAGS,
    "amx": AMX_FLAGS,
    "amx_sigill": AMX_FLAGS,
    "sigill": AMX_FLAGS,
}
# the flags that promise native bfloat16 (x86; Arm's bf16 extension)
NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}
# oneDNN's ISA levels (its "CPU dispatcher control" docs): those below AMX, and
# those below its native bfloat16 kernels
ISAS_WITHOUT_BF16 = {
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
}
ISAS_WITHOUT_AMX = ISAS_WITHOUT_BF16 | {"AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16"}
NATIVE_SLOWDOWN = 1.5  # a bfloat16 matmul taking more than this x float32's time is emulated

_verdict = None  # this process's, set by check_bf16


def cache_path():
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "hackable-gpt", "bf16.json")


def simulated_class():
    """The CPU class named by GPT_SIMULATE_CPU, or None. An unknown name stops the
    process with one line: a typo must not test the real machine unnoticed."""
    name = os.environ.get(SIMULATE, "")
    if not name:
        return None
    if name not in SIMULATED_CLASSES:
        sys.exit(
            f"error: {SIMULATE}={name} is no CPU class; use one of {', '.join(SIMULATED_CLASSES)}"
        )
    return name


def read_cpuinfo():
    """(the CPU's model name, its flags as one string), as /proc/cpuinfo says."""
    model = ""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = (part.strip() for part in line.partition(":"))
                if name in ("model name", "Model", "Hardware") and not model:
                    model = value
                elif name in ("flags", "Features") and not flags:
                    flags = value
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    return model, flags


def cpu_flags():
    """The flags this CPU advertises, or those of the simulated class."""
    simulated = simulated_class()
    if simulated is not None:
        return SIMULATED_CLASSES[simulated]
    return set(read_cpuinfo()[1].split())


def machine_key():
    """What the verdict depends on: the CPU model and flags, torch's version, the
    oneDNN cap and a simulated class."""
    model, flags = read_cpuinfo()
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    parts = [
        model,
        hashlib.sha256(flags.encode()).hexdigest()[:16],
        torch_version,
        os.environ.get(ISA, "").upper(),
        os.environ.get(SIMULATE, ""),
    ]
    return "|".join(parts)


def read_cache():
    try:
        with open(cache_path()) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_cache(key, field, value):
    """Add one entry; a cache that cannot be written only means probing again next time."""
    data = read_cache()
    data.setdefault(key, {})[field] = value
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)  # atomic: several processes may probe at once
    except OSError:
        pass


def probe(extra_env=None):
    """Run probe_child in a child process: its result dict, or {'crashed': signal
    name} when it died of a signal, or {'failed': reason}."""
    env = dict(os.environ, **(extra_env or {}))
    if simulated_class() == "avx2":
        # oneDNN and ATen without their bfloat16 kernels: the child's bfloat16 is really
        # emulated, so its slowdown is measured, not assumed
        env.update({ISA: "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    t0 = time.perf_counter()
    try:
        r = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return dict(failed=str(e).splitlines()[0])
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f"signal {-r.returncode}"
        return dict(crashed=name)
    if r.returncode != 0 or not r.stdout.strip():
        lines = (r.stderr or "no output").strip().splitlines()
        return dict(failed=lines[-1] if lines else f"exit {r.returncode}")
    return dict(
        json.loads(r.stdout.strip().splitlines()[-1]), probe_s=round(time.perf_counter() - t0, 2)
    )


def new_verdict():
    """A verdict measured now (see probe_verdict), with the time it was measured and,
    under GPT_SIMULATE_CPU, the simulated class."""
    verdict = probe_verdict()
    verdict["measured_at"] = time.strftime("%Y-%m-%d %H:%M")
    simulated = simulated_class()
    if simulated is None:
        return verdict
    verdict["simulated"] = simulated
    # a native class simulated on a CPU that emulates bfloat16: the speed is the class's,
    # the figure this CPU measured is kept beside it
    native_class = bool(SIMULATED_CLASSES[simulated] & NATIVE_BF16_FLAGS)
    if native_class and verdict["runs"] and verdict["slowdown"] > NATIVE_SLOWDOWN:
        verdict["measured_slowdown"] = verdict["slowdown"]
        verdict["slowdown"] = 1.0
    return verdict


def probe_verdict():
    """Probe, and if bfloat16 kills the child, probe again with oneDNN capped below AMX."""
    first = probe()
    if "crashed" not in first:
        return dict(first, runs="failed" not in first, env={})
    user_isa = os.environ.get(ISA)
    if user_isa:
        return dict(
            runs=False,
            env={},
            why=f"bfloat16 crashes on this CPU ({first['crashed']} in a test run, "
            f"with {ISA}={user_isa})",
        )
    second = probe({ISA: AMX_FREE_ISA})
    if "failed" in second:  # not a verdict: not cached, tried again next time
        return dict(second, runs=False, env={})
    if "crashed" in second:
        return dict(
            runs=False,
            env={},
            why=f"bfloat16 crashes on this CPU ({first['crashed']} in a test run, "
            f"also with {ISA}={AMX_FREE_ISA})",
        )
    return dict(second, runs=True, env={ISA: AMX_FREE_ISA}, amx_crashed=first["crashed"])


def check_bf16(again=False):
    """The verdict on CPU bfloat16, from the cache or a probe, with its fix applied:
    call before `import torch`. A dict: runs (bool), why (when it does not),
    slowdown (bfloat16 matmul time / float32's), env (what was set to make it run),
    measured_at (when), and under GPT_SIMULATE_CPU the simulated class."""
    global _verdict
    if _verdict is not None and not again:
        return _verdict
    key = machine_key()
    verdict = None if again else read_cache().get(key, {}).get("verdict")
    if verdict is None:
        verdict = new_verdict()
        if "failed" not in verdict:
            write_cache(key, "verdict", verdict)
        if again:
            # the models' timings were taken under the old verdict: taken again at next use
            write_cache(key, "timed", {})
    verdict = dict(verdict)
    if "failed" in verdict:
        verdict["why"] = f"bfloat16 was not tried: the check could not run ({verdict['failed']})"
    for name, value in verdict["env"].items():
        if os.environ.get(name) == value:
            continue
        if "torch" in sys.modules:  # oneDNN has read its settings: too late for the fix
            verdict.update(
                runs=False,
                why=(
                    f"bf16 crashes in oneDNN's AMX kernels on this CPU; set "
                    f"{name}={value} to use AVX512-BF16"
                ),
            )
        else:
            os.environ[name] = value
    if simulated_class() is not None and not verdict["runs"] and "torch" not in sys.modules:
        simulate_crash()  # from the process's start, as on the real machine
    _verdict = verdict
    return verdict


def simulate_crash():
    """Tests: make this process die as such a CPU's would, at its first bfloat16
    op on the CPU, so that a path that still runs one cannot pass unseen."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    def cpu_bf16(x):
        return (
            x is torch.bfloat16
            or isinstance(x, torch.Tensor)
            and x.dtype == torch.bfloat16
            and x.is_cpu
        )

    class DieOnBf16(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if any(cpu_bf16(x) for x in tree_leaves((args, kwargs or {}))):
                sys.stderr.write(
                    f"simulated SIGILL: {getattr(func, '__name__', func)} in bfloat16\n"
                )
                os.kill(os.getpid(), signal.SIGILL)
            return func(*args, **(kwargs or {}))

    DieOnBf16().__enter__()  # for the rest of the process


def probe_child():
    """In the child: bfloat16 through every kind of op a training step runs, at
    the CPU recipe's shapes, then one matmul timed against float32. Prints JSON."""
    simulated = simulated_class()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    amx_allowed = os.environ.get(ISA, "").upper() not in ISAS_WITHOUT_AMX
    if simulated == "sigill" or (simulated == "amx_sigill" and amx_allowed):
        os.kill(os.getpid(), signal.SIGILL)
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    linear = torch.nn.Linear(128, 512)  # the MLP's first layer, batch 32 x 64
    x = torch.randn(32 * 64, 128, requires_grad=True)
    with torch.autocast("cpu", bf16):
        loss = linear(x).float().square().mean()
    q, k, v = (torch.randn(32, 4, 64, 32, dtype=bf16, requires_grad=True) for _ in range(3))
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            loss = (
                loss
                + F.scaled_dot_product_attention(q, k, v, is_causal=True).float().square().mean()
            )
    loss.backward()
    g = torch.randn(128, 512).bfloat16()  # Muon's Newton-Schulz iteration multiplies in bfloat16
    gram = g @ g.T
    torch.addmm(g, torch.addmm(gram, gram, gram, beta=-4.7, alpha=2.0), g, beta=3.4)
    slowdown, attempts = steady_slowdown(bool(cpu_flags() & NATIVE_BF16_FLAGS))
    print(json.dumps(dict(slowdown=round(slowdown, 2), attempts=attempts)))


def steady_slowdown(flags_promise_native, attempts=3):
    """(bf16_slowdown, attempts): measured again, up to `attempts` times, while the
    figure contradicts what the CPU's flags promise. Load from other processes
    slows both precisions alike within a round, so the best of the rounds holds;
    a figure that still contradicts the flags after that is this CPU's truth
    (a virtual machine may hide what its flags advertise)."""
    for attempt in range(1, attempts + 1):
        slowdown = bf16_slowdown()
        if (slowdown <= NATIVE_SLOWDOWN) == flags_promise_native:
            break
    return slowdown, attempt


def bf16_slowdown(n=256, rounds=5, repeats=3):
    """Time of a bfloat16 (n, n) matrix multiply over a float32 one on one thread
    (other threads' load would blur the ratio): each precision's best over rounds
    that alternate the two, so a burst of other work cannot fall on one alone."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    matrices = {}
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        matrices[dtype] = (torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype))
        best[dtype] = float("inf")
    try:
        for _ in range(rounds):
            for dtype, (a, b) in matrices.items():
                a @ b  # warm: the first call picks the kernel
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    a @ b
                    best[dtype] = min(best[dtype], time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return best[torch.bfloat16] / best[torch.float32]


def measured(when):
    """Where a cached measurement is quoted: when it was taken, and how to take it again."""
    if when is None:
        return ""
    return f"; measured {when}, python -m support.hardware --again measures again"


def cpu_bf16():
    """(True or False, why): whether bfloat16 runs on this CPU, natively."""
    v = check_bf16()
    note = measured(v.get("measured_at"))
    if not v["runs"]:
        return False, v["why"] + note
    if v["slowdown"] > NATIVE_SLOWDOWN:
        isa = os.environ.get(ISA, "").upper()
        cap = f"{ISA}={isa}, " if isa in ISAS_WITHOUT_BF16 else ""
        return (
            False,
            f"no native bfloat16: {cap}a matrix multiply takes {v['slowdown']:.0f}x "
            f"float32's time{note}",
        )
    if v["env"]:
        return True, (
            f"native bfloat16, with {ISA}={AMX_FREE_ISA}: oneDNN's AMX kernels crash on this CPU "
            f"({v['amx_crashed']}){note}"
        )
    return True, f"native bfloat16{note}"


def native_bf16(device_type):
    """(True or False, why) for the device type ('cuda', 'cpu', 'mps')."""
    if device_type == "cuda":
        import torch

        # including_emulation=False: pre-Ampere GPUs (V100, T4) run bf16 emulated
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return native, "native bfloat16" if native else "no native bfloat16 on this GPU"
    if device_type == "cpu":
        return cpu_bf16()
    return False, f"bfloat16 not used on {device_type}"


def auto_dtype(device_type):
    """(dtype name, why) for dtype='auto' before timing the model: bfloat16 where it
    is native; on CUDA otherwise float16 (with a GradScaler), elsewhere float32."""
    native, why = native_bf16(device_type)
    if native:
        return "bfloat16", why
    return ("float16" if device_type == "cuda" else "float32"), why


def bf16_error(device_type):
    """A one-line reason why an explicit bfloat16 cannot run here, or None."""
    if device_type != "cpu":
        return None
    v = check_bf16()
    return (
        None if v["runs"] else f"--dtype=bfloat16 cannot run here: {v['why']}; use --dtype=float32"
    )


def faster_cpu_dtype(key, seconds_per_pass, rounds=3):
    """'bfloat16' or 'float32', whichever seconds_per_pass(dtype name) finds
    faster for this model here, with why; cached under key (the model's shapes).
    Each precision's best of `rounds` that alternate the two, so that other work
    on the machine for a while slows both, not one."""
    machine = machine_key()
    cached = read_cache().get(machine, {}).get("timed", {}).get(key)
    if cached is None:
        print(
            "timing bfloat16 against float32 on this model (once per model shape and machine)",
            flush=True,
        )
        cached = {"bfloat16": float("inf"), "float32": float("inf")}
        for _ in range(rounds):
            for dtype in ("bfloat16", "float32"):
                cached[dtype] = min(cached[dtype], seconds_per_pass(dtype))
        cached["measured_at"] = time.strftime("%Y-%m-%d %H:%M")
        # read again: other processes may have added
        timed = read_cache().get(machine, {}).get("timed", {})
        write_cache(machine, "timed", dict(timed, **{key: cached}))
    bf, fp = cached["bfloat16"] * 1e3, cached["float32"] * 1e3
    verdict = check_bf16()
    fix = "".join(
        f"; {name}={value} set: oneDNN's AMX kernels crash on this CPU ({verdict['amx_crashed']})"
        for name, value in verdict["env"].items()
    )
    why = fix + measured(cached.get("measured_at"))
    if bf < fp:
        return (
            "bfloat16",
            f"faster than float32 here: {bf:.0f} vs {fp:.0f} ms per forward and backward{why}",
        )
    return (
        "float32",
        f"faster than bf16 here: {fp:.0f} vs {bf:.0f} ms per forward and backward{why}",
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        probe_child()
    else:
        verdict = check_bf16(again="--again" in sys.argv)
        print(json.dumps(verdict, indent=1))
        print("cpu:", ", ".join(auto_dtype("cpu")), f"(cached in {cache_path()})")
