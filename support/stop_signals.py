"""
Stop signals: SIGINT and SIGTERM ask a training run to stop and save, rather than
die with its work since the last checkpoint. train.py enters StopSignals around its
loop; its evaluations and steps ask stop_requested, and raise Stopped where they stand.
"""

import signal
import threading

import torch
import torch.distributed as dist


class Stopped(Exception):
    """A stop signal arrived during an evaluation or between micro-steps."""


class StopSignals:
    """SIGINT and SIGTERM ask training to stop: after the current step, or inside
    an evaluation or between micro-steps (Stopped); a second signal stops at once."""

    def __init__(self):
        self.name = None  # the first signal's name, once one has arrived
        self.saved = {}  # the handlers this one replaced, put back on exit

    @property
    def cause(self):
        """What stopped the run: under torchrun the signal may have reached another
        process only (the processes agree on stopping, not on which signal)."""
        return self.name or "a signal to another process"

    def handle(self, signum, frame):
        self.name = signal.Signals(signum).name
        signal.signal(signum, self.saved[signum] or signal.SIG_DFL)

    def __enter__(self):
        # signals reach the main thread only
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler or signal.SIG_DFL)


def stop_requested(signals, world, device, agree=False):
    """Whether SIGINT or SIGTERM has arrived (signals is None outside training).
    With agree, whether it has in any process: a collective, so every process
    must ask at the same point."""
    asked = signals is not None and signals.name is not None
    if agree and world > 1:
        t = torch.tensor([float(asked)], device=device)
        dist.all_reduce(t)
        return t.item() > 0
    return asked
