"""
Which precision is safe and fast on this machine.

bfloat16 halves the bytes moved and, where the hardware multiplies it natively,
runs matrix multiplies several times faster than float32: CUDA GPUs from Ampere
on, and x86 CPUs with AVX512-BF16 or AMX. Elsewhere PyTorch emulates it, and a
CPU matrix multiply in bfloat16 is then about 40x slower than in float32
(docs/benchmarks.md).

A CPU's flags prove absence, not presence. Where they name no bfloat16 instruction
(AVX2 alone: most laptops and many cloud CPUs), bfloat16 is emulated and nothing
needs trying (bf16_ruled_out): this file is all such a machine reads. Where they
promise it, they may lie: some virtual machines advertise AMX and then do not let a
process use it: oneDNN (PyTorch's CPU bfloat16 matmul library) picks its AMX kernels
and the process dies with SIGILL, no message. So on such a CPU every entry point
calls bf16_verdict.check_bf16() before it imports torch: the verdict, cached per
machine, measured in child processes where none is cached yet, with oneDNN capped
at AVX512-BF16 if bfloat16 kills the first (support/bf16_verdict.py, and
support/cpu_probe.py with the CPU classes the tests simulate). Where the cap was
needed, the process sets it before torch loads (ONEDNN_MAX_CPU_ISA, which oneDNN
reads then), and says so. `python -m support.hardware` prints the verdict (and
probes again with --again).

On a CPU that runs bfloat16 natively, dtype='auto' still trains in it only if a
forward and backward pass of the run's own model is faster than in float32
(bf16_verdict.faster_cpu_dtype; cached too), and Muon's orthogonalisation follows
the training precision.

Capping oneDNN below AVX512-BF16 (ONEDNN_MAX_CPU_ISA=AVX2) makes bfloat16 really
emulated on a CPU that has it, and rules it out as the flags of a CPU without it
do: how the float32 path of such a CPU is measured on one that has it.
"""

import os

ISA = "ONEDNN_MAX_CPU_ISA"
# Tests and CI: the CPU class the probe behaves as (cpu_probe.SIMULATED_CLASSES)
SIMULATE = "GPT_SIMULATE_CPU"
# oneDNN's ISA levels below its native bfloat16 kernels (its "CPU dispatcher control" docs)
ISAS_WITHOUT_BF16 = {
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
}


def cpuinfo(fields, path="/proc/cpuinfo"):
    """The first value that path (/proc/cpuinfo) gives one of fields ("" where it gives
    none, or cannot be read): x86 names its flags "flags", Arm "Features"."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in fields and value.strip():
                    return value.strip()
    except OSError:
        pass
    return ""


FLAG_FIELDS = ("flags", "Features")
# the flags that promise native bfloat16: x86's AVX512-BF16 and AMX, Arm's bf16 extension
NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}


def bf16_ruled_out():
    """Why bfloat16 cannot be native here, where that is certain without trying it;
    else "". Flags prove absence, not presence: a CPU whose flags name none of
    NATIVE_BF16_FLAGS has no bfloat16 instruction for oneDNN to use (most laptops and
    many cloud CPUs: AVX2 alone), and oneDNN capped below AVX512-BF16 uses none. A
    CPU whose flags promise it is tried (bf16_verdict.check_bf16)."""
    isa = os.environ.get(ISA, "").upper()
    if isa in ISAS_WITHOUT_BF16:
        return f"{ISA}={isa} leaves out its instructions"
    if os.environ.get(SIMULATE):
        from support.cpu_probe import cpu_flags  # the simulated class's flags

        flags = cpu_flags()
    else:
        flags = set(cpuinfo(FLAG_FIELDS).split())
    if flags and not flags & NATIVE_BF16_FLAGS:
        return "the CPU's flags name none of avx512_bf16, amx_bf16, bf16"
    return ""


def native_bf16(device_type):
    """(True or False, why) for the device type ('cuda', 'cpu', 'mps'): whether
    bfloat16 runs there, natively."""
    if device_type == "cuda":
        import torch

        # including_emulation=False: pre-Ampere GPUs (V100, T4) run bf16 emulated
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return native, "native bfloat16" if native else "no native bfloat16 on this GPU"
    if device_type != "cpu":
        return False, f"bfloat16 not used on {device_type}"
    ruled_out = bf16_ruled_out()
    if ruled_out:
        return False, f"no native bfloat16: {ruled_out}"
    from support import bf16_verdict  # here only: flags that promise bfloat16

    return bf16_verdict.native_cpu()


def auto_dtype(device_type):
    """(dtype name, why) for dtype='auto' before timing the model: bfloat16 where it
    is native; on CUDA otherwise float16 (with a GradScaler), elsewhere float32."""
    native, why = native_bf16(device_type)
    if native:
        return "bfloat16", why
    return ("float16" if device_type == "cuda" else "float32"), why


def bf16_error(device_type):
    """A one-line reason why an explicit bfloat16 cannot run here, or None. On MPS:
    PyTorch's fused causal attention there let queries see later keys in float16 and
    bfloat16 (pytorch #195910), silently, so only float32 is trusted there."""
    if device_type == "mps":
        return (
            "--dtype=bfloat16 on MPS: PyTorch's causal attention there has let tokens see "
            "later ones in half precision (pytorch issue 195910); use --dtype=float32, "
            "what auto picks on MPS"
        )
    if device_type != "cpu":
        return None
    from support import bf16_verdict

    v = bf16_verdict.check_bf16()
    return (
        None if v["runs"] else f"--dtype=bfloat16 cannot run here: {v['why']}; use --dtype=float32"
    )


if __name__ == "__main__":
    import json
    import sys

    from support import bf16_verdict
    from support.configurator import BAD_INPUT, error, wants_help  # no torch there either

    if wants_help(sys.argv[1:]):
        print(__doc__.strip())
        sys.exit(0)
    unknown = [arg for arg in sys.argv[1:] if arg != "--again"]
    if unknown:
        error(f"unknown option {unknown[0]!r}; python -m support.hardware [--again]")
        sys.exit(BAD_INPUT)
    verdict = bf16_verdict.check_bf16(again="--again" in sys.argv)
    print(json.dumps(verdict, indent=1))
    print(f"(the verdict above is cached in {bf16_verdict.cache_path()})")
    print("cpu:", ", ".join(auto_dtype("cpu")))
