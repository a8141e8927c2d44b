"""
How fast is model.py, against Hugging Face's GPT-2 (and nanoGPT) on the same
machine in the same run? One benchmark per module, each runnable alone as
`python -m bench.NAME`; `python -m bench` runs the default set (bench/__main__.py).

  train_step    one optimizer step, ours against Hugging Face GPT-2 with the same weights
  generate      greedy decoding with the KV cache against HF generate and the no-cache path
  attention     explicit attention against F.scaled_dot_product_attention
  decode        CUDA only: GPT-2 124M decoding as a fraction of the memory-bandwidth limit
  recipes       the CPU recipes against nanoGPT's, trained to the end or for --minutes
  holdout       not a benchmark: a split cut from train to choose a recipe's settings on
  long_context  sliding-window attention and the rolling KV cache against dense
  smoke_gpu     the first run on a GPU: every CUDA path, one line per step
  gpu           the GPU figures in one run of under eight minutes; --out_dir=docs: docs/gpu.md
  common        what they share: timing, Hugging Face conversion, tables, the command line

Nothing is imported here: `python -m bench.NAME` loads this package first, and
torch must load after support.before_torch, which each benchmark imports first.
"""
