"""
A training run as the explorer follows it while train.py writes it.

train.py appends one JSON line per evaluation to out_dir/log.jsonl and, with
--snapshots=True, writes out_dir/snapshots/iter_NNNNNN.pt (support/timeline.py).
The page asks every half second whether anything changed; RunLog answers that
from the files' sizes, times and names (a stat and a listdir, no parsing), and
reads the log again only when it did.

Reading a file another process is appending to: the last line may be cut
short by the write in progress, so only lines that end in a newline are read.
A snapshot is listed only once it is whole: save_checkpoint writes a
temporary file and renames it, and timeline.list_snapshots lists only the
final names. A new run in the same folder starts a new log, so the log can
shrink; the version changes and the page redraws from scratch.

open_model opens a run for explore.py: at ckpt.pt, or, before train.py has
saved one, at the newest snapshot.
"""

import math
import os
import threading

from support import head_measures, timeline
from support.checkpoint import checkpoint_path
from support.loading import load_model
from support.run_log import is_evaluation, read_log

# the fields of an evaluation's log line the timeline draws; the rest stay in the log
FIELDS = ("iter", "train_loss", "val_loss", "icl_score")


def finite(value):
    """A float the page can draw, or None (JSON has no NaN)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value):
        return None
    return float(value)


def evaluation(record):
    """What the timeline draws of one log line: the losses, the in-context learning
    score and each head's induction score and label, when the line has them."""
    out = {"iter": record["iter"]}
    for key in FIELDS[1:]:
        if key in record:
            out[key] = finite(record[key])
    heads = record.get("heads")
    if isinstance(heads, dict) and "induction" in heads and "label" in heads:
        out["induction"] = [[finite(v) for v in row] for row in heads["induction"]]
        out["label"] = heads["label"]
    return out


def label_changes(evaluations):
    """Every change of a head's label between two evaluations that logged the heads,
    at the later one: [{"iter", "layer", "head", "from", "to"}], in the log's order."""
    changes = []
    before = None
    for e in evaluations:
        if "label" not in e:
            continue
        if before is not None and len(before["label"]) == len(e["label"]):
            for layer, (old_row, new_row) in enumerate(zip(before["label"], e["label"])):
                for head, (old, new) in enumerate(zip(old_row, new_row)):
                    if old != new:
                        changes.append(
                            {
                                "iter": e["iter"],
                                "layer": layer,
                                "head": head,
                                "from": old,
                                "to": new,
                            }
                        )
        before = e
    return changes


class RunLog:
    """A training run's folder as the page follows it: the version that says whether
    anything changed, and the evaluations, read again only when the log changed."""

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.log = None if run_dir is None else os.path.join(run_dir, "log.jsonl")
        self.lock = threading.Lock()
        self.read_at = None  # the log's (size, mtime) when it was last read
        self.evaluations = []
        self.changes = []
        self.skipped = 0

    def log_stamp(self):
        try:
            stat = os.stat(self.log)
        except (FileNotFoundError, TypeError):
            return None
        return (stat.st_size, stat.st_mtime_ns)

    def version(self, steps):
        """A string that changes whenever the log or the list of snapshots does."""
        stamp = self.log_stamp()
        log_part = "none" if stamp is None else f"{stamp[0]}.{stamp[1]}"
        return f"{log_part}:{','.join(map(str, steps))}"

    def read(self):
        """(evaluations, label changes, lines skipped), the log read again if it changed."""
        with self.lock:
            stamp = self.log_stamp()
            if stamp != self.read_at:
                records, self.skipped = ([], 0) if stamp is None else read_log(self.run_dir)
                # the evaluations; the training steps' lines between them are not drawn
                self.evaluations = [evaluation(r) for r in records if is_evaluation(r)]
                self.changes = label_changes(self.evaluations)
                self.read_at = stamp
            return self.evaluations, self.changes, self.skipped

    def answer(self, steps, since):
        """GET /api/timeline?since=VERSION's answer, given /api/steps's: the run's
        evaluations as its log holds them (the losses, the in-context learning score and
        each head's induction score and label, where logged), every change of a head's
        label, and the steps; only {"version", "changed": false} while nothing changed
        since VERSION."""
        version = self.version(steps["steps"])
        if since == version:
            return {"version": version, "changed": False}
        evaluations, changes, skipped = self.read()
        return {
            "version": version,
            "changed": True,
            "run": self.run_dir is not None,
            **steps,
            "evaluations": evaluations,
            "label_changes": changes,
            "skipped_lines": skipped,
            "induction_threshold": head_measures.INDUCTION,
        }

    def steps(self):
        """The iters of the run's snapshots, oldest first."""
        if self.run_dir is None:
            return []
        return list(timeline.list_snapshots(self.run_dir))


def open_model(init_from, out_dir):
    """load_model(init_from, out_dir), the model's iter and where it came from. A run
    that has no ckpt.pt yet (train.py saves the first at its second evaluation) but
    snapshots opens at its newest snapshot, so the explorer can start as the
    training does."""
    snapshots = timeline.list_snapshots(out_dir)
    if not init_from and snapshots and not os.path.exists(checkpoint_path(out_dir)):
        newest = max(snapshots)
        model, tok, _ = load_model(snapshots[newest], out_dir)
        return model, tok, out_dir, newest, "snapshot"
    model, tok, folder = load_model(init_from, out_dir)
    return model, tok, folder, timeline.checkpoint_step(folder), "ckpt.pt"
