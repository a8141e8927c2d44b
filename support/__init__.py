"""
Everything around model.py that the commands share, one job per module: precision
and hardware, settings and configuration, tokenizers, corpora and their shards,
batches, optimizers, the training loop's helpers (device, processes, resume,
evaluation, logging, signals, the run estimate), checkpoints, loading a model, the
compiled decode step, attention maps and head measurements, HellaSwag, the
explorer's server, and context parallelism with the ring attention it runs on.

model.py is the file to read first; nothing here is needed to understand it.
docs/architecture.md draws how these fit together.
"""
