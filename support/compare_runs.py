"""
The training runs of a comparison (compare.py), each a real `python train.py` in its arm's
folder, one at a time, and kept: a finished run's results are saved in a folder of the cache
named by a key made of the arm's code hash, its settings, its seed and its threads, so that the
same comparison asked again, or with more pairs, trains only the runs it has not seen. While a
run trains, the CPU time that other processes take is measured (Linux's /proc), so that a run
on a busy machine says so.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

INTERRUPTED = 130  # train.py's exit code for Ctrl-C before its training began
RECORD = "record.json"  # a finished run's results, in its folder
OUTPUT = "train.out"  # its train.py's stdout and stderr
# other processes using more than this many cores make a run "busy": with as many threads as
# cores, 0.27 to 0.4 of a core taken by others made the CPU recipe's step 1.6-1.7x slower on
# 2 cores (docs/benchmarks.md), and an idle machine's others take about 0.01
BUSY_CORES = 0.1


class RunFailed(Exception):
    """A train.py run that did not finish: its last error line, exit code and output file."""

    def __init__(self, line, returncode, output):
        super().__init__(line)
        self.line = line
        self.returncode = returncode
        self.output = output


def run_key(code, argv, seed, threads):
    """The key of a run: what makes its result what it is."""
    text = json.dumps({"code": code, "argv": argv, "seed": seed, "threads": threads})
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def run_folder(cache, key):
    return os.path.join(cache, "runs", key)


def kept(cache, key):
    """The record of a finished run with this key, or None."""
    try:
        with open(os.path.join(run_folder(cache, key), RECORD)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


# -----------------------------------------------------------------------------
# What else the machine is doing


def cpu_ticks():
    """The machine's busy clock ticks in all (Linux's /proc/stat), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait
    values = [int(v) for v in fields[1:9]]
    return sum(values) - values[3] - values[4]


def stat_fields(pid):
    """The fields of /proc/<pid>/stat after the process's name (proc(5)'s field 3 on), or
    None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_ticks(pid):
    """The clock ticks process pid has used (its threads and waited-for children), or 0."""
    fields = stat_fields(pid)
    if fields is None:
        return 0
    # utime stime cutime cstime: fields 14-17 of proc(5), 12-15 after the name
    return sum(int(v) for v in fields[11:15])


def parent(pid):
    """The pid of process pid's parent, or None where /proc cannot tell."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    # state ppid ...: field 4 of proc(5), 1 after the name
    return int(fields[1])


def descends(pid, ancestors):
    """Whether process pid is one of ancestors (pids) or runs under one of them."""
    seen = set()
    while pid and pid not in seen:
        if pid in ancestors:
            return True
        seen.add(pid)
        pid = parent(pid)
    return False


def other_trainers(own):
    """The command lines of train.py processes running that are neither in own (pids),
    nor this process, nor under one of them: a process a run forks carries the run's
    command line until it execs, and is the run, not another."""
    found = []
    mine = set(own) | {os.getpid()}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        trains = any(os.path.basename(word) == "train.py" for word in words)
        if trains and not descends(pid, mine):
            found.append(" ".join(w for w in words if w))
    return found


class Watch:
    """The CPU other processes take while a run trains, in cores, and any other train.py."""

    def __init__(self, pid):
        self.pid = pid
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.start = (
            time.perf_counter(),
            cpu_ticks(),
            process_ticks(pid),
            process_ticks(os.getpid()),
        )
        self.others = set()

    def look(self):
        self.others.update(other_trainers({self.pid}))

    def result(self):
        wall, machine, watched, own = self.start
        seconds = time.perf_counter() - wall
        now = cpu_ticks()
        cores = None
        if machine is not None and now is not None and seconds > 0:
            # process_ticks counts a child's threads; once it is gone and waited for, its
            # ticks are this process's (cutime)
            mine = max(process_ticks(self.pid) - watched, process_ticks(os.getpid()) - own)
            cores = max(0.0, (now - machine - mine) / self.hz / seconds)
        return dict(
            other_cores=None if cores is None else round(cores, 2),
            other_trainers=sorted(self.others),
            load_average=round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        )


def busy(record):
    """Whether a run's record says other work shared the machine while it trained."""
    cores = record["machine"]["other_cores"]
    return bool(record["machine"]["other_trainers"]) or (cores is not None and cores > BUSY_CORES)


# -----------------------------------------------------------------------------
# One run


def last_error_line(path):
    """What a failed train.py said last: its 'error: ...' line, or a traceback's last line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "it wrote no output"
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error: "):
            return line.removeprefix("error: ")
    if lines:
        return lines[-1]
    return "it wrote no output"


def train(folder, argv, cache, key, threads):
    """Run `python train.py *argv` in folder into the run's folder of the cache; the record of
    the finished run, or RunFailed. Ctrl-C stops the run (train.py saves, then it is removed:
    a run is kept finished or not at all) and is raised again."""
    out = run_folder(cache, key)
    shutil.rmtree(out, ignore_errors=True)  # an earlier attempt that did not finish
    os.makedirs(out)
    output = os.path.join(out, OUTPUT)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    started = time.time()
    with open(output, "w") as sink:
        child = subprocess.Popen(
            [sys.executable, "train.py", *argv, f"--out_dir={out}"],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        watch = Watch(child.pid)
        try:
            while child.poll() is None:
                watch.look()
                try:
                    child.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:
            stop(child)
            shutil.rmtree(out, ignore_errors=True)
            raise
    machine = watch.result()
    if child.returncode == INTERRUPTED:
        # Ctrl-C reached train.py before its training began (this process ignores it when
        # started in the background): the comparison stops with it
        shutil.rmtree(out, ignore_errors=True)
        raise KeyboardInterrupt
    if child.returncode != 0:
        raise RunFailed(last_error_line(output), child.returncode, output)
    try:
        record = read_results(out)
    except (OSError, ValueError, KeyError) as e:
        said = last_error_line(output)
        if said.startswith("stopped by SIG"):
            # a signal reached train.py alone (this process ignores SIGINT when started in
            # the background): it saved and stopped, and the comparison stops with it
            shutil.rmtree(out, ignore_errors=True)
            raise KeyboardInterrupt from None
        raise RunFailed(f"{said} (and its log has no whole-val loss: {e})", 1, output) from None
    record.update(key=key, argv=argv, wall_s=round(time.time() - started, 1), machine=machine)
    with open(os.path.join(out, RECORD + ".tmp"), "w") as f:
        json.dump(record, f, indent=1)
    os.replace(os.path.join(out, RECORD + ".tmp"), os.path.join(out, RECORD))
    return record


def stop(child):
    """The child stopped as Ctrl-C stops train.py: SIGINT (it may have had one already from
    the terminal), a wait, then SIGKILL."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
    try:
        child.wait(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    except KeyboardInterrupt:
        child.kill()
        child.wait()


def read_results(out):
    """A finished run's results from its log.jsonl and checkpoint: the whole-val loss, the
    evaluations' curve, the step time, and the data generator's end state (the hash of its
    bytes: two runs that drew the same batches end with the same state). The checkpoint is
    then removed: the cache keeps results, not models."""
    import torch

    evaluations = []
    steps = []
    with open(os.path.join(out, "log.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "val_loss" in record:
                evaluations.append(record)
            elif "tok_per_s" in record:
                steps.append(record)
    if not evaluations or "val_loss_full" not in evaluations[-1]:
        raise ValueError("the run ended before its final evaluation")
    final = evaluations[-1]
    tokens_per_iter = final["tokens"] / final["iter"]
    # each log step's seconds per iter since the one before; the median leaves out the
    # first steps' allocations and a moment of other work
    per_iter = sorted(tokens_per_iter / s["tok_per_s"] for s in steps)
    median = None
    if per_iter:
        median = per_iter[len(per_iter) // 2]
    path = os.path.join(out, "ckpt.pt")
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    state = ckpt["data"]["generator"]
    generator = hashlib.sha256(state.numpy().tobytes()).hexdigest()[:16]
    os.remove(path)
    return dict(
        val_loss=final["val_loss_full"],
        iters=final["iter"],
        seconds=final["elapsed_s"],
        ms_per_iter=None if median is None else round(1000 * median, 2),
        curve=[[e["iter"], e["val_loss"]] for e in evaluations],
        data_generator=generator,
    )
