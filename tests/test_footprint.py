"""What a plain run reads (experiments/trace_plain_run.py): the project's files and code
lines that `python train.py config/shakespeare_cpu.py` executes, traced in a real run, and
no module of a feature that is off among them."""

import ast
import os

import pytest

from experiments import trace_plain_run
from experiments.trace_plain_run import footprint
from support import hardware

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILES = 15
# On a CPU whose flags rule native bfloat16 out (AVX2 alone: 'auto' is float32 from the
# flags) the ceiling is the goal a plain run is held to, 1,100 code lines, and the five
# lines every run spends on the KV-shifting seam (model.py: its field, its two checks and
# its method's def; a named optional seam, as the recipe work asks): 1,104 measured (an
# AVX2-only /proc/cpuinfo bind-mounted over a Xeon's; 1,095 with oneDNN capped at AVX2,
# which rules it out before the flags are read); and the six on token shift's (its field,
# its two checks, its method's def, the two caches' empty slot for the newest embedding):
# 1,110 measured on a first-generation AMD EPYC (AVX2 and FMA alone). Where they
# promise it, the verdict is read from its cache and the model's timing in both precisions
# too: 1,173 on an AMD EPYC with avx512_bf16 (1,210 on an Intel Xeon with AMX, the verdict
# cached), 1,204 where the timing is taken in the run
# (it picked bfloat16; a pick of float32 runs Muon's float32 path, 16 lines more); that
# ceiling, with token shift's six, is about 3% above the most. Both then take the eight
# lines of the sequence-length warmup every run passes through (its check, its cut's def
# and test, the batch reshaped in next_batch): 1,114 measured with oneDNN capped at AVX2
# on a Zen 4 AMD EPYC. And the seven of late dropout's seam (its field, its check's `if` and
# def, its schedule's def, the run's slot, the step's `if`, its setter's def): 1,125 measured
# there, 7 more than the same trace of the commit before it. And the three that moving the
# stop signals out of train.py into support/stop_signals.py costs (the new module's docstring
# and imports, less the two imports train.py no longer needs): 1,128 measured there. And the
# two `if`s of lr_cooldown's seam (its check, the schedule's choice of line or cosine): 1,130.
MAX_CODE_LINES = {"flags rule bfloat16 out": 1_131, "flags promise bfloat16": 1_281}
# what a plain CPU run, its features off, must not load, with what turns each on
FEATURE_MODULES = {
    "support/hellaswag.py": "--hellaswag",
    "support/timeline.py": "--snapshots or --log_heads",
    "support/attention_maps.py": "--log_heads (through timeline.py)",
    "support/head_measures.py": "--log_heads (through timeline.py)",
    "support/composition.py": "heads.py and the explorer",
    "support/ring_attention.py": "--context_parallel",
    "support/context_parallel.py": "--context_parallel",
    "data/induction.py": "--dataset=induction, not yet prepared",
    "support/mfu.py": "a CUDA GPU",
    "support/run_estimate.py": "--device=auto where no GPU is found",
    "support/distributed.py": "torchrun, or --compile",
    "support/cpu_probe.py": "flags that promise bfloat16 and no verdict cached yet",
    "support/resume.py": "--init_from=resume",
    "support/loading.py": "--init_from=resume, or GPT-2's weights",
    "data/tokenizer.py": "a dataset whose tokenizer must be built to be checked",
}


def test_a_plain_run_reads_few_files_and_no_feature_that_is_off(data_root, monkeypatch):
    counts = footprint([f"--data_root={data_root}"])
    # the trace is of this machine as it is (no simulated class), and so is its ceiling
    monkeypatch.delenv(hardware.SIMULATE, raising=False)
    cpu = "flags rule bfloat16 out" if hardware.bf16_ruled_out() else "flags promise bfloat16"
    loaded = sorted(set(counts) & set(FEATURE_MODULES))
    assert not loaded, [f"{path} (on with {FEATURE_MODULES[path]})" for path in loaded]
    assert len(counts) <= MAX_FILES, counts
    assert sum(counts.values()) <= MAX_CODE_LINES[cpu], (cpu, counts)
    # the run itself and the model are read; the trace sees code, not comments
    assert counts["train.py"] > 100 and counts["model.py"] > 100, counts
    assert counts["config/shakespeare_cpu.py"] > 0, counts


def test_where_the_flags_rule_bfloat16_out_the_verdict_is_not_read(data_root, monkeypatch):
    """On a CPU with AVX2 alone (here: oneDNN capped at AVX2, which rules bfloat16 out as
    such a CPU's flags do) a plain run reads support/hardware.py and nothing behind it:
    no cached verdict, no probe, no model timed in both precisions."""
    monkeypatch.delenv(hardware.SIMULATE, raising=False)
    monkeypatch.setenv(hardware.ISA, "AVX2")
    counts = footprint([f"--data_root={data_root}"])
    assert "support/hardware.py" in counts, counts
    verdict = {"check_bf16", "faster_cpu_dtype", "time_cpu_dtypes", "new_verdict"}
    for path in counts:
        with open(os.path.join(REPO, path)) as f:
            tree = ast.parse(f.read())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert not defined & verdict, (path, defined & verdict)
    assert sum(counts.values()) <= MAX_CODE_LINES["flags rule bfloat16 out"], counts


def test_train_imports_each_feature_in_setup_alone():
    """The one place: train.py imports a feature's module inside setup(), under the `if`
    of its setting, and nowhere else."""
    with open(os.path.join(REPO, "train.py")) as f:
        tree = ast.parse(f.read())
    features = {path.removesuffix(".py").replace("/", ".") for path in FEATURE_MODULES}
    setup = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "setup")
    inside = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        names = [alias.name for alias in node.names]
        if isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{name}" for name in names] + [node.module]
        found = features.intersection(names)
        if not found:
            continue
        in_setup = setup.lineno <= node.lineno <= setup.end_lineno
        assert in_setup and node.col_offset > 4, (node.lineno, found)
        inside |= found
    # the features train.py turns on itself (the others load through these, or elsewhere)
    turned_on = {
        "hellaswag",
        "timeline",
        "context_parallel",
        "mfu",
        "run_estimate",
        "distributed",
        "resume",
        "loading",
    }
    assert inside == {f"support.{name}" for name in turned_on}, inside


def test_a_bad_option_to_the_trace_is_train_pys_own_line(capsys):
    """The trace passes its options to train.py: a bad one is train.py's line and
    exit code, as the command itself would give them."""
    with pytest.raises(SystemExit) as stop:
        trace_plain_run.run(["--max_iter=4"])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: unknown config key 'max_iter'; did you mean 'max_iters'?\n"
