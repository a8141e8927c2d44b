"""experiments/heads_over_runs.py: runs set side by side by each layer's ranks of cost,
on reports whose answer is worked out by hand."""

import json
import subprocess
import sys

from experiments import heads_over_runs


def head(layer, h, label, nats, prev=0.1):
    return {
        "layer": layer,
        "head": h,
        "label": label,
        "ablation_nats": nats,
        "score_std": 1.0 + nats,
        "entropy_ratio": 0.5,
        "scores": {"diagonal": 0.6, "delimiter": 0.1},
        "previous_weight": prev,
    }


def write_run(folder, heads, loss, layer_nats):
    (folder / "heads").mkdir(parents=True)
    report = {"heads": heads, "baseline_loss": loss, "layer_ablation_nats": layer_nats}
    (folder / "heads" / "heads.json").write_text(json.dumps(report))
    (folder / "log.jsonl").write_text('{"iter": 10}\n{"iter": 20}\n')


def test_heads_are_matched_by_their_rank_in_the_layer(tmp_path):
    # run a: layer 0's previous-token head is head 1; run b: head 0 (the same head, renamed)
    write_run(
        tmp_path / "a",
        [head(0, 0, "band", 0.1), head(0, 1, "previous", 0.3, prev=0.8)],
        1.47,
        [0.5],
    )
    write_run(
        tmp_path / "b",
        [head(0, 0, "previous", 0.2, prev=0.7), head(0, 1, "band", 0.05)],
        1.49,
        [0.7],
    )
    text = heads_over_runs.table(
        [str(tmp_path / "a"), str(tmp_path / "b")],
        heads_over_runs.read_reports([str(tmp_path / "a"), str(tmp_path / "b")]),
    )
    rows = [line for line in text.splitlines() if line.startswith("| 0 |")]
    # rank 1: each run's previous-token head, +0.2 to +0.3 nats, previous weight 0.7 to 0.8
    assert rows[0].startswith("| 0 | 1 | previous (2) | +0.200 to +0.300 | 1.20 to 1.30 | 0.50 |")
    assert rows[0].endswith("| 0.70 to 0.80 |")
    assert rows[1].startswith("| 0 | 2 | band (2) | +0.050 to +0.100 |")
    assert "val loss of record 1.4700 to 1.4900; iters 20, 20 (a, b)" in text
    assert "layer 0 +0.50 to +0.70 nats" in text


def test_a_missing_report_is_one_line(tmp_path):
    write_run(tmp_path / "a", [head(0, 0, "band", 0.1)], 1.5, [0.1])
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.heads_over_runs", str(tmp_path / "a"), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=heads_over_runs.os.path.dirname(
            heads_over_runs.os.path.dirname(heads_over_runs.__file__)
        ),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'heads' / 'heads.json'} does not exist; "
        f"run python heads.py --out_dir={tmp_path}"
    ]
