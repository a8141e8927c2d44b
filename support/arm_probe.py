"""
What one arm of a comparison would train, asked of the arm's own code before any run
(compare.py runs this file in the arm's folder, whose modules come first on the path): the
settings parsed and checked as train.py does, the dataset prepared where it is missing, the
model built and put through one forward and backward pass on two windows of the val split,
and what 'auto' resolves to. It prints one JSON line. A setting that does not parse is one
line on stderr and exit code 2; code that fails (a hack's bug) is its last line, where it
failed, and exit code 1. Nothing is trained or saved.

    python -c "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')" \\
        support/arm_probe.py '{"argv": [...], "resolve_dtype": true}'
"""

import support.before_torch  # the arm's own bfloat16 check, before torch loads

import json
import os
import sys
import traceback

BAD_INPUT = 2
FAILED = 1


def failed_where(e):
    """The exception's last line, and the arm's file and line it was raised from."""
    said = str(e).strip()
    line = type(e).__name__
    if said:
        line += f": {said.splitlines()[0]}"
    here = os.getcwd()
    if isinstance(e, SyntaxError) and e.filename:
        return f"{line} ({os.path.relpath(e.filename, here)}, line {e.lineno})"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(here)]
    if frames:
        return f"{line} ({os.path.relpath(frames[-1].filename, here)}, line {frames[-1].lineno})"
    return line


def settings(argv):
    """The arm's Settings, checked, with its device and the dtype train.py would start from."""
    from support.configurator import parse_settings
    from support.device import pick_device, training_dtype
    from support.settings import Settings, check

    cfg = parse_settings(Settings, argv)
    check(cfg)
    device = pick_device(cfg.device)
    dtype, why = training_dtype(cfg.dtype, device)
    return cfg, device, dtype, why


def model_check(cfg, device, resolve_dtype, dtype, why):
    """The model built as train.py builds it, one forward and backward pass; with
    resolve_dtype, 'auto' timed on it as train.py times it. Returns the report."""
    import torch

    from data.dataset import ensure_dataset, get_batch, load_meta, load_split
    from model import GPT, GPTConfig
    from support.settings import model_args

    folder = ensure_dataset(cfg.dataset, cfg.data_root)
    meta = load_meta(folder)
    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig(**model_args(cfg, meta["vocab_size"]))).to(device)
    val = load_split(folder, "val", cfg.block_size, meta["vocab_size"], device)
    x, y = get_batch(val, torch.zeros(2, dtype=torch.long), cfg.block_size, device)
    loss = model(x, y)[1]
    loss.backward()
    model.zero_grad(set_to_none=True)
    if resolve_dtype and cfg.dtype == "auto" and device.type == "cpu" and dtype == "bfloat16":
        from support.bf16_verdict import time_cpu_dtypes

        dtype, why = time_cpu_dtypes(cfg, model, val)
    compile_on = cfg.compile
    if compile_on is None:
        compile_on = device.type == "cuda" and cfg.context_parallel == 1
    params = sum(p.numel() for p in model.parameters())
    return dict(
        settings={
            k: v for k, v in vars(cfg).items() if isinstance(v, (str, int, float, bool, type(None)))
        },
        device=device.type,
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        dtype=dtype,
        dtype_why=why,
        compile=compile_on,
        fused=getattr(cfg, "fused", True),
        params=params,
        threads=torch.get_num_threads(),
        vocab_size=meta["vocab_size"],
    )


def main(request):
    argv = request["argv"]
    recipe = None
    if request["recipes"]:
        import torch

        # the default recipe: the baby GPT where a CUDA GPU is found and not declined
        declined = any(w.startswith("--device=") and "cuda" not in w for w in argv)
        recipe = request["recipes"]["cuda" if torch.cuda.is_available() and not declined else "cpu"]
        argv = recipe + argv
    try:
        cfg, device, dtype, why = settings(argv)
    except Exception as e:
        # ConfigError, ValueError, DeviceError: the arm's one line for a bad setting
        if type(e).__name__ in ("ConfigError", "ValueError", "DeviceError", "DataError"):
            print(f"error: {e}", file=sys.stderr)
            return BAD_INPUT
        raise
    if cfg.init_from != "scratch":
        print("error: compare.py trains each arm from scratch: drop --init_from", file=sys.stderr)
        return BAD_INPUT
    try:
        report = model_check(cfg, device, request["resolve_dtype"], dtype, why)
    except Exception as e:
        if type(e).__name__ == "DataError":
            print(f"error: {e}", file=sys.stderr)
            return BAD_INPUT
        raise
    report["recipe"] = recipe
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    try:
        code = main(json.loads(sys.argv[-1]))
    except Exception as e:
        print(f"error: {failed_where(e)}", file=sys.stderr)
        code = FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
