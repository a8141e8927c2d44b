"""
Everything around model.py that the commands share: precision and hardware,
checkpoints, configuration, tokenizers, batches, optimizers, loading a model,
the attention maps and head measurements, and context parallelism with the ring
attention it runs on.

model.py is the file to read first; nothing here is needed to understand it.
"""
