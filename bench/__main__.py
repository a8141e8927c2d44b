"""
How fast is model.py, against Hugging Face's GPT-2 on the same machine in the same run?

    python -m bench [--device=cpu|cuda] [--quick] [--compile] [--threads=N] [--out=bench.json]

Each section is printed as a markdown table and written to --out as JSON:
  1. train      one optimizer step (forward, backward, AdamW) for three model sizes,
                ours against transformers' GPT2LMHeadModel with the same weights
  2. generate   greedy decoding to the full context on the baby model: ours with the
                KV cache (eager, and compiled unless --quick), ours recomputing the
                window, and Hugging Face's generate
  3. attention  model.attention (explicit, materialises the (T, T) weights) against
                F.scaled_dot_product_attention as the context grows
  4. decode     CUDA only: GPT-2 124M, batch 1, the compiled decode step (CUDA graphs)
                as a fraction of the memory-bandwidth limit
  --recipes     instead of those: config/shakespeare_cpu.py against nanoGPT's CPU
                settings (config/shakespeare_cpu_classic.py), each trained to the end
                by train.py, on this CPU as it is and capped at AVX2 (no AVX-512, no
                native bfloat16, like most laptops): whole-val loss and wall time
  --long_context  instead of those: sliding-window attention (W = 256, float32) against
                dense causal attention, the attention alone and a whole attention layer,
                fwd + bwd, T = 1024 .. 16384; then the rolling KV cache: its bytes, its
                tokens/s early and late in a 20 x block_size generation, and against a
                dense model that slides and recomputes past block_size
                (--long_context_part=attention or =cache: that half alone)

Each also runs alone: python -m bench.train_step, bench.generate, bench.attention,
bench.decode, bench.recipes, bench.long_context.

Timings alternate between the contenders in the same process (rotating which goes
first) and report medians, so a busy machine slows all of them alike.
transformers is a test-only dependency (requirements-dev.txt).
"""

import os
import sys

# run by its path too, not only with -m: the repository's modules come first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses

from bench import attention, common, decode, generate, long_context, recipes, train_step


@dataclasses.dataclass
class Settings(train_step.Settings):
    # instead: train the CPU recipe against nanoGPT's CPU settings, on this CPU and capped at AVX2
    recipes: bool = False
    # with --recipes: a nanoGPT checkout (its data prepared) whose own train.py runs beside ours
    nanogpt: str = ""
    # instead: sliding-window attention and the rolling KV cache against dense
    long_context: bool = False
    long_context_part: str = "all"  # with --long_context: all, attention or cache


def sections(args):
    """The default set, or --recipes or --long_context instead of it. An option of
    one of those given without it would be ignored while the default set ran for
    minutes: it is refused at once."""
    if args.recipes and args.long_context:
        raise common.ConfigError(
            "--recipes and --long_context each replace the default set: give one"
        )
    if args.nanogpt and not args.recipes:
        raise common.ConfigError("--nanogpt goes with --recipes: add --recipes")
    if args.long_context_part != "all" and not args.long_context:
        raise common.ConfigError("--long_context_part goes with --long_context: add --long_context")
    if args.recipes:
        return [recipes.section]
    if args.long_context:
        return [long_context.section]
    return [train_step.section, generate.section, attention.section, decode.section]


if __name__ == "__main__":
    sys.exit(common.main("bench", __doc__, Settings, sections, sys.argv[1:]))
