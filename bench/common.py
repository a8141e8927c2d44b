"""
What every benchmark shares, written once: the model shapes, alternating timing,
Hugging Face GPT-2 holding our weights, the compiled decode path, markdown tables,
the machine header, the targets list, and the command line (--key=value options,
one line for bad input, the tables printed, every figure written to --out as JSON).
"""

import contextlib
import dataclasses
import datetime
import json
import os
import platform
import resource
import sys
import time

import torch

from support import engine
from support.cli import check_threads, try_writing_in
from support.configurator import (
    ConfigError,
    parse_settings,
    wants_help,
)
from support.help import describe_settings, print_help


# The options every benchmark takes; each adds its own
@dataclasses.dataclass
class Settings:
    device: str = "cpu"  # cpu or cuda
    # small repeat counts, no GPT-2 124M training, shorter generation: under a minute
    quick: bool = False
    threads: int = 0  # CPU threads; 0 keeps torch's default. 1 steadies ratios on a busy machine
    out: str = "bench.json"  # where every figure goes


# The model shapes the benchmarks share
NANOGPT_CPU = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65)
BABY = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65)
GPT2_124M = dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)

NOTES = [
    "Hugging Face GPT2LMHeadModel runs with attn_implementation='sdpa', its fastest "
    "attention; 'HF' uses activation gelu_new as GPT-2's config does, 'HF fused-GELU' "
    "uses gelu_pytorch_tanh (same function, PyTorch's fused kernel)",
    "both models hold the same weights (converted from ours) and dropout 0",
    "medians of alternating repeats; on CUDA, training runs under bf16 autocast, "
    "generation with bf16 weights and attention in bf16, for every contender alike",
]


class BenchError(Exception):
    """A benchmark that cannot give a figure to trust (the contenders disagree, a run
    under it failed): one line, exit 1. A bad option is a ConfigError, exit 2."""


# -----------------------------------------------------------------------------
# Timing


def sync(device):
    """Wait for the GPU's queued work, so the clock measures it."""
    if device == "cuda":
        torch.cuda.synchronize()


def alternate(fns, repeats, calls, device):
    """Time each of fns (name -> callable) for `calls` calls per repeat.

    The contenders take turns within every repeat and the order rotates between
    repeats, so background load and warm caches favour none of them.
    Returns name -> list of seconds per call, one entry per repeat.
    """
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[name]()
            sync(device)
            times[name].append((time.perf_counter() - t0) / calls)
    return times


def autocast(device):
    """bf16 on GPU for every contender alike; plain fp32 on CPU."""
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_rss_bytes():
    """The process's peak resident memory so far (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.platform == "darwin":
        return rss
    return rss * 1024


def peak_gpu_bytes(fn):
    """The GPU memory fn allocates on top of what is already held, at its peak."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


# -----------------------------------------------------------------------------
# The compiled decode path


def generate_compiled(model, prompt, max_new_tokens):
    """Greedy decoding through the compiled fixed-shape decode step (CUDA graphs on
    a GPU): the one place the benchmarks reach the compiled path."""
    return engine.generate_compiled(model, prompt, max_new_tokens, temperature=0.0)


def check_compiled_greedy(model, compiled, eager, what):
    """The compiled decode step must make the eager path's greedy choices. In
    float32 (CPU) the tokens are identical. In bf16 two different kernels may
    break a near-tie differently, after which the sequences part ways; there,
    every token the compiled path chose must be within rounding of the best
    logit of a plain forward over the same tokens."""
    if torch.equal(compiled, eager):
        return
    bs = model.config.block_size
    if model.lm_head.weight.dtype == torch.float32 or compiled.size(1) > bs:
        raise BenchError(
            f"{what}: compiled and eager greedy tokens differ; the benchmark would "
            "compare different work"
        )
    with torch.no_grad():
        logits = model(compiled[:, :-1])[0].float()  # (B, T - 1, vocab)
    chosen = logits.gather(-1, compiled[:, 1:, None])[..., 0]
    gap = (logits.max(-1).values - chosen).max().item()
    # bf16 logits of a few units carry about 1e-2 of rounding
    if gap > 0.1:
        raise BenchError(
            f"{what}: the compiled step chose a token {gap:.3f} below the best "
            "logit of a plain forward"
        )


# -----------------------------------------------------------------------------
# Hugging Face GPT-2 with our weights


def hf_config(config, activation="gelu_new"):
    """GPT2Config with our model's shape. gelu_new is GPT-2's own config value;
    sdpa is Hugging Face's fastest attention on CPU and GPU."""
    from transformers import GPT2Config

    return GPT2Config(
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        vocab_size=config.vocab_size,
        activation_function=activation,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
        attn_implementation="sdpa",
    )


def to_hf(model, activation="gelu_new"):
    """A GPT2LMHeadModel holding a copy of our model's weights."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel(hf_config(model.config, activation))
    sd = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to wte in both models
        # Hugging Face keeps these projections as Conv1D, (in, out): Linear's (out, in) transposed
        if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            tensor = tensor.t()
        sd[key] = tensor.clone()
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise BenchError(
            f"weight conversion to Hugging Face GPT-2 failed: missing {missing}, "
            f"unexpected {unexpected}"
        )
    hf.tie_weights()
    hf.generation_config.eos_token_id = None  # never stop early: every run makes all its tokens
    hf.generation_config.pad_token_id = 0
    return hf.to(next(model.parameters()).device)


def check_same_logits(ours, hf, idx, what):
    """Both models must compute the same function, or the timings compare different work."""
    with torch.no_grad():
        a = ours(idx)[0]
        b = hf(input_ids=idx).logits
    diff = (a - b).abs().max().item()
    tolerance = 1e-3
    if idx.is_cuda:
        tolerance = 2e-2  # TF32 matmuls
    if diff > tolerance:
        raise BenchError(
            f"{what}: our logits and Hugging Face's differ by {diff:.2e}; "
            "the weight converter in bench/common.py is out of date"
        )
    return diff


# -----------------------------------------------------------------------------
# Report


def markdown(lines):
    """A markdown table: the first line is the head."""
    out = ["| " + " | ".join(lines[0]) + " |", "|" + "---|" * len(lines[0])]
    out += ["| " + " | ".join(line) + " |" for line in lines[1:]]
    return "\n".join(out)


def percent(x):
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%"


def verdict(met):
    if met is None:
        return "not judged (--quick)"
    if met:
        return "met"
    return "NOT met"


def target(text, measured, met, quick=False):
    """A target as the results list it: what it asks, the figure measured, and
    whether it is met; None after --quick, whose short runs judge nothing."""
    met = None if quick else met
    return dict(target=text, measured=measured, met=met)


def targets_list(targets):
    return "## Targets\n\n" + "\n".join(
        f"- {t['target']}: {t['measured']:.2f}x, {verdict(t['met'])}" for t in targets
    )


def load_average():
    """How busy the machine was: other processes slow every contender."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_class():
    """The CPU's name and class, to stand beside every CPU figure: torch's kernel
    capability (AVX2, AVX512, ...) and which bfloat16 instructions the CPU has."""
    flags = set()
    name = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name in ("", "x86_64"):
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    native = sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile"))
    capability = torch.backends.cpu.get_cpu_capability()
    bf16 = ", ".join(native) or "none"
    return f"{name}, {os.cpu_count()} cores; torch {capability}; bf16 in hardware: {bf16}"


def header_lines(result, device):
    """The machine, the versions, the command and how busy the machine was."""
    return (
        f"{result['device']['name']} ({device}, {result['device']['threads']} threads), "
        f"torch {result['torch']}, transformers {result['transformers']}, {result['date']}\n"
        f"command: {result['command']}\n"
        f"load average (1 min) before / after: {result['load_average_before']} / "
        f"{result['load_average_after']}"
    )


# -----------------------------------------------------------------------------
# Running


def check_options(args):
    """The options every benchmark shares: device, threads and a writable --out. A bad
    one is bad input (ConfigError: exit 2, as in every command), not a failed run."""
    device = args.device
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("CUDA is not available here; run with --device=cpu")
    check_threads(args.threads)
    if not args.out or os.path.isdir(args.out):
        raise ConfigError(f"--out is the JSON file to write, got {args.out!r}; pass --out=PATH")
    folder = os.path.dirname(os.path.abspath(args.out))
    try:
        try_writing_in(folder)
    except OSError:
        raise ConfigError(
            f"cannot write {args.out}: {folder} is not a writable folder; "
            "pass --out=PATH somewhere writable"
        ) from None


def run(args, prog, sections, log=print):
    """Run each section (args, log) -> (figures, tables, targets) in order, after a
    header that says where and how: the result, with its markdown."""
    check_options(args)
    try:
        import transformers
    except ImportError:
        raise BenchError(
            "the benchmarks compare against Hugging Face GPT-2: "
            "pip install transformers (see requirements-dev.txt)"
        ) from None
    transformers.logging.set_verbosity_error()
    device = args.device
    if device == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for every contender alike
    if args.threads:
        torch.set_num_threads(args.threads)

    result = dict(
        device=dict(type=device, name=device_name(device), threads=torch.get_num_threads()),
        torch=torch.__version__,
        transformers=transformers.__version__,
        python=platform.python_version(),
        date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        command=" ".join(["python", "-m", prog] + sys.argv[1:]),
        quick=args.quick,
        notes=NOTES,
    )
    result["load_average_before"] = load_average()
    t0 = time.perf_counter()
    tables = []
    found = []
    for section in sections:
        figures, section_tables, section_targets = section(args, log)
        result.update(figures)
        tables += section_tables
        found += section_targets
    result["targets"] = found
    result["seconds"] = time.perf_counter() - t0
    result["load_average_after"] = load_average()
    if found:
        tables.append(targets_list(found))
    result["markdown"] = "\n\n".join([header_lines(result, device)] + tables)
    return result


def write_json(result, path):
    """Written whole or not at all: a temporary file, then renamed."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def main(prog, doc, settings, sections, argv):
    """The command line of `python -m prog`, its options the dataclass settings:
    sections(args) says what to run."""
    if wants_help(argv):
        print_help(doc, describe_settings(settings))
        return 0
    start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - start:5.0f} s] {msg}", file=sys.stderr, flush=True)

    try:
        args = parse_settings(settings, argv, allow_files=False)
        result = run(args, prog, sections(args), log)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except BenchError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except torch.OutOfMemoryError:
        print(f"{prog}: out of GPU memory; free the GPU or run with --quick", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing written", file=sys.stderr)
        return 130
    print(result["markdown"])
    try:
        write_json(result, args.out)
    except OSError as e:
        print(
            f"{prog}: cannot write {args.out} ({e.strerror}); pass --out=PATH somewhere writable",
            file=sys.stderr,
        )
        return 1
    print(f"\nwrote {args.out} ({result['seconds']:.0f} s)", file=sys.stderr)
    return 0
