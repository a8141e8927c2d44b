"""
The verdict on bfloat16 where a CPU's flags promise it (support/hardware.py rules it
out where they do not): whether it runs, with the fix that makes it run, and which
precision trains a given model faster. Both are measured once per machine and cached
in the user's cache folder (XDG_CACHE_HOME, else ~/.cache), keyed by the CPU model and
flags, torch's version, the oneDNN cap and a simulated class, so that every later run
reads them there. The measuring itself is support/cpu_probe.py.

check_bf16 runs before torch loads (support/before_torch.py): the fix is an environment
variable that oneDNN reads then. Imports no torch at the top; time_cpu_dtypes, which
times the run's model, runs once torch is loaded.
"""

import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import time

from support.hardware import FLAG_FIELDS, ISA, SIMULATE, cpuinfo

AMX_FREE_ISA = "AVX512_CORE_BF16"  # oneDNN's highest level with bfloat16 but without AMX
NATIVE_SLOWDOWN = 1.5  # a bfloat16 matmul taking more than this x float32's time is emulated

_verdict = None  # this process's, set by check_bf16


def cache_path():
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "hackable-gpt", "bf16.json")


def machine_key():
    """What the verdict depends on: the CPU model and flags, torch's version, the
    oneDNN cap and a simulated class."""
    model = (
        cpuinfo(("model name", "Model", "Hardware")) or platform.processor() or platform.machine()
    )
    parts = [
        model,
        hashlib.sha256(cpuinfo(FLAG_FIELDS).encode()).hexdigest()[:16],
        importlib.metadata.version("torch"),  # read without importing torch
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
        from support.cpu_probe import new_verdict  # here only: a cached verdict needs no probe

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
    if os.environ.get(SIMULATE):
        from support.cpu_probe import simulate

        simulate(verdict)  # from the process's start, as on the real machine
    _verdict = verdict
    return verdict


def native_cpu():
    """(True or False, why): whether bfloat16 runs natively on this CPU, whose flags
    promise it, by the verdict."""
    v = check_bf16()
    note = measured(v.get("measured_at"))
    if not v["runs"]:
        return False, v["why"] + note
    if v["slowdown"] > NATIVE_SLOWDOWN:
        return (
            False,
            f"no native bfloat16: a matrix multiply takes {v['slowdown']:.0f}x "
            f"float32's time{note}",
        )
    if v["env"]:
        return True, (
            f"native bfloat16, with {ISA}={AMX_FREE_ISA}: oneDNN's AMX kernels crash on this CPU "
            f"({v['amx_crashed']}){note}"
        )
    return True, f"native bfloat16{note}"


def measured(when):
    """Where a cached measurement is quoted: when it was taken, and how to take it again."""
    if when is None:
        return ""
    return f"; measured {when}, python -m support.hardware --again measures again"


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


def time_cpu_dtypes(cfg, model, data):
    """('bfloat16' or 'float32', why) for dtype='auto' on a CPU with native bfloat16:
    whichever runs a forward and backward of this model faster (on up to 2048
    tokens at the run's shapes, the best of rounds that alternate the two), timed
    once per shape. Called once torch is loaded (this module is imported before it)."""
    import torch

    from data.dataset import get_batch
    from support.device import precision_context
    from support.settings import MODEL_KEYS

    n = max(1, min(cfg.batch_size, 2048 // cfg.block_size))
    x, y = get_batch(data, torch.zeros(n, dtype=torch.long), cfg.block_size, torch.device("cpu"))

    def seconds(dtype):
        best = float("inf")
        # dropout draws here must not shift the run's random numbers
        with torch.random.fork_rng(devices=[]):
            for _ in range(2):  # the first picks kernels and allocates
                t0 = time.perf_counter()
                with precision_context("cpu", dtype, cfg.block_size):
                    loss = model(x, y)[1]
                loss.backward()
                best = min(best, time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        return best

    shape = ",".join(f"{key}={getattr(cfg, key)}" for key in MODEL_KEYS + ("batch_size",))
    return faster_cpu_dtype(f"{shape},threads={torch.get_num_threads()}", seconds)
