"""
Everything around model.py that the commands share, one job per module: precision
and hardware, settings and the command line, checkpoints and resuming, loading a
model, optimizers, the training run's helpers (device, processes, logging, the run
estimate), the compiled decode step, attention maps and head measurements,
HellaSwag, the explorer's server, and context parallelism with the ring attention
it runs on. train.py holds its own loop, evaluation and stop signals.

model.py is the file to read first; nothing here is needed to understand it.
docs/architecture.md draws how these fit together.
"""
