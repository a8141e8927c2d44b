"""Running the command lines many times, fast, for the reliability tests.

A process that imports torch and the project once, then forks one child per
command and runs the script in it as __main__, with its argv, working folder
and output files: the command line exactly as `python train.py ...` runs it,
without paying the interpreter's start-up each time. A request is one JSON
line {"jobs": [...], "workers": n}; each job may give a delay after which the
child is SIGKILLed, and "slow" to make checkpoint writes slow (four chunks
with pauses between them, so that kills land inside the writes).
"""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FORKER = r"""
import io, json, os, runpy, signal, sys, time, traceback
sys.path.insert(0, os.getcwd())
import torch
import torch._dynamo  # torch.optim imports it on first use: seconds, better spent once here
import sample, train  # noqa: F401  (imported once, for every child)
from support import attention_maps  # noqa: F401
import data.dataset  # noqa: F401

real_save, slow = torch.save, [False]


def save(obj, f, *args, **kwargs):
    if not slow[0]:
        return real_save(obj, f, *args, **kwargs)
    buf = io.BytesIO()
    real_save(obj, buf, *args, **kwargs)
    data = buf.getvalue()
    step = len(data) // 4 + 1
    for i in range(0, len(data), step):
        f.write(data[i:i + step])
        f.flush()
        time.sleep(0.015)


torch.save = save


def child(job):
    code = 1
    try:
        os.chdir(job["cwd"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND), 1)
        os.dup2(os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND), 2)
        slow[0] = job["slow"]
        sys.argv = [job["script"], *job["argv"]]
        sys.path[0] = os.path.dirname(os.path.abspath(job["script"]))  # as `python script` sets it
        runpy.run_path(job["script"], run_name="__main__")
        code = 0
    except SystemExit as e:  # what the interpreter does with it
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(jobs, workers):
    results, running, queue = [None] * len(jobs), {}, list(range(len(jobs)))
    while queue or running:
        while queue and len(running) < workers:
            i = queue.pop(0)
            pid = os.fork()
            if pid == 0:
                child(jobs[i])
            delay = jobs[i]["delay"]
            running[pid] = (i, None if delay is None else time.monotonic() + delay)
        for pid, (i, deadline) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            killed = not done and deadline is not None and time.monotonic() >= deadline
            if killed:
                os.kill(pid, signal.SIGKILL)  # not reaped yet, so the pid is still this child's
                done, status = os.waitpid(pid, 0)
            if done:
                del running[pid]
                results[i] = {"killed": killed, "code": os.waitstatus_to_exitcode(status)}
        time.sleep(0.002)
    return results


for line in sys.stdin:
    request = json.loads(line)
    print(json.dumps(run(request["jobs"], request["workers"])), flush=True)
"""


class Forker:
    def __init__(self, folder, env):
        """The forking process, started from the repo root with env; its script and
        the children's output go into folder."""
        self.folder, self.count = folder, 0
        script = os.path.join(folder, "forker.py")
        with open(script, "w") as f:
            f.write(FORKER)
        self.proc = subprocess.Popen(
            [sys.executable, script],
            cwd=REPO,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def run(self, jobs, workers=1):
        """jobs: [(script, argv)] or [(script, argv, options)]; options: cwd, delay, slow, log
        (one file for stdout and stderr, appended to). Returns CompletedProcess-likes
        with .killed added."""
        requests, outputs = [], []
        for script, argv, *options in jobs:
            options = options[0] if options else {}
            self.count += 1
            out = options.get("log") or os.path.join(self.folder, f"{self.count}.out")
            err = options.get("log") or os.path.join(self.folder, f"{self.count}.err")
            requests.append(
                {
                    "script": os.path.join(REPO, script),
                    "argv": [str(a) for a in argv],
                    "cwd": str(options.get("cwd", REPO)),
                    "delay": options.get("delay"),
                    "slow": options.get("slow", False),
                    "stdout": out,
                    "stderr": err,
                }
            )
            outputs.append((out, err))
        self.proc.stdin.write(json.dumps({"jobs": requests, "workers": workers}) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        assert reply, "the forker died"
        results = []
        for request, (out, err), result in zip(requests, outputs, json.loads(reply)):
            proc = subprocess.CompletedProcess(
                request["argv"], result["code"], read(out), read(err)
            )
            proc.killed = result["killed"]
            results.append(proc)
        return results

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def read(path):
    """A child's output file as text; empty if it never wrote one."""
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()
