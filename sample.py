"""
Sample text from a trained model, and save what its attention heads looked at.

    python sample.py --prompt "ROMEO:"            # the checkpoint in out-shakespeare-char/
    python sample.py --out_dir=out-mine --num_samples=5 --temperature=0.9 --top_k=50
    python sample.py --prompt FILE:prompt.txt --stream --seed=7
    python sample.py --init_from=path/to/gpt2 --prompt "Hello, I'm a language model,"
    python sample.py --out_dir=out-shakespeare-char-cpu --window=32 --sinks=4 --max_new_tokens=5000

Options are --key=value or --key value; `python sample.py --help` lists them.
The attention maps of the first sample go to <out_dir>/attention/ (open its
index.html in a browser): by default its first 64 tokens, the prompt and the start
of the generation, every row and column named by its token. --attn_span=START:END
maps other tokens (a Python slice of the sample's tokens, prompt included: -64: is
the last 64), --attn_span=all the whole text; --attn_dir DIR writes them elsewhere
and --attn_dir "" turns them off.
"""

import support.before_torch  # bfloat16 tried in a child process, before torch loads

import dataclasses
import os
import sys
import time

import torch

from support import attention_maps, cli, engine
from support.configurator import ConfigError
from support.device import inference_dtype, pick_device
from support.loading import load_model


@dataclasses.dataclass
class Settings:
    out_dir: str = "out-shakespeare-char"  # the folder config/shakespeare.py trains into
    # "" = out_dir's checkpoint; or a checkpoint folder, or a Hugging Face GPT-2 folder
    init_from: str = ""
    prompt: str = "\n"  # text, or FILE:path to read it from a file
    num_samples: int = 3
    max_new_tokens: int = 500
    temperature: float = 0.8  # 0 = greedy; below 1 sharper, above 1 more random
    top_k: int | None = 200  # keep only the k most likely tokens (None: all)
    top_p: float = 1.0  # nucleus sampling: keep the most likely tokens up to this much probability
    seed: int = 1337
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N, mps
    # auto (bfloat16 on a GPU that has it, else float32), float32, bfloat16, float16
    dtype: str = "auto"
    no_cache: bool = False  # recompute the whole context every token: same output, slower
    # decode with the compiled fixed-shape step (compiling takes 10-60 s; no attention maps)
    compile: bool = False
    stream: bool = False  # print tokens as they are generated
    attn_dir: str | None = None  # None = <out_dir>/attention; "" = do not save attention maps
    # the tokens the maps show: START:END of the sample's tokens, prompt included, as a Python
    # slice (-64: the last 64; at most block_size of them), or all: the whole text (the last
    # block_size tokens once it outgrows the context)
    attn_span: str = "0:64"
    # StreamingLLM: keep the last W tokens in the cache (rope models), never slide
    window: int | None = None
    sinks: int = 0  # ... and the first S tokens, the attention sinks (with --window)


class SampleError(Exception):
    """A problem with the user's input; the message is one line saying what to do."""


# -----------------------------------------------------------------------------
# Options


def check_options(cfg):
    """cfg, its values checked (SampleError)."""
    if cfg.max_new_tokens < 1:
        raise SampleError(f"--max_new_tokens must be at least 1, got {cfg.max_new_tokens}")
    if cfg.num_samples < 1:
        raise SampleError(f"--num_samples must be at least 1, got {cfg.num_samples}")
    if cfg.temperature < 0:
        raise SampleError(f"--temperature must be >= 0 (0 is greedy), got {cfg.temperature}")
    if cfg.top_k is not None and cfg.top_k < 1:
        raise SampleError(f"--top_k must be a positive integer or None, got {cfg.top_k}")
    if not 0 < cfg.top_p <= 1:
        raise SampleError(f"--top_p must be in (0, 1], got {cfg.top_p}")
    if cfg.compile and cfg.no_cache:
        raise SampleError("--compile decodes through the KV cache; drop --no_cache or --compile")
    if (cfg.window is not None or cfg.sinks) and (cfg.compile or cfg.no_cache):
        raise SampleError(
            "--window and --sinks shape the eager KV cache; drop --compile and --no_cache"
        )
    parse_span(cfg.attn_span)
    return cfg


def parse_span(text):
    """--attn_span as a slice of the sample's tokens, or None for all (SampleError)."""
    if text == "all":
        return None
    parts = str(text).split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        bounds = [int(p) if p.strip() else None for p in parts]
    except ValueError:
        raise SampleError(
            f"--attn_span must be START:END (e.g. 0:64, or -64: for the last 64) or all, "
            f"got {text!r}"
        ) from None
    return slice(*bounds)


def span_of(cfg, n_tokens, block_size):
    """The (start, end) of the tokens the maps show in a sample of n_tokens, or None for
    the whole text. One forward draws them, so a span longer than the context keeps its
    first block_size tokens (said, unless it is the default's 64 on a shorter context).
    SampleError where the span holds no token."""
    span = parse_span(cfg.attn_span)
    if span is None:
        return None
    start, end, _ = span.indices(n_tokens)
    if end <= start:
        raise SampleError(
            f"--attn_span={cfg.attn_span} holds no token of a sample of {n_tokens} "
            f"(the prompt and --max_new_tokens); give START:END within 0:{n_tokens}"
        )
    if end - start > block_size:
        if cfg.attn_span != Settings.attn_span:
            print(
                f"note: --attn_span={cfg.attn_span} spans {end - start} tokens, more than the "
                f"model's context of {block_size}: the maps show tokens "
                f"{start}..{start + block_size - 1}",
                file=sys.stderr,
            )
        end = start + block_size
    return start, end


# -----------------------------------------------------------------------------
# Model, tokenizer and prompt


def read_prompt(prompt):
    if prompt is None:
        prompt = ""
    if prompt.startswith("FILE:"):
        path = prompt[len("FILE:") :]
        try:
            with open(path, encoding="utf-8") as f:
                prompt = f.read()
        except FileNotFoundError:
            raise SampleError(
                f"prompt file not found: {path}; check the path after FILE:"
            ) from None
        except (OSError, UnicodeDecodeError) as e:
            raise SampleError(
                f"cannot read prompt file {path} ({type(e).__name__}); "
                "it must be a readable UTF-8 text file"
            ) from None
    if not prompt:
        raise SampleError(
            'the prompt is empty; pass some text, e.g. --prompt "ROMEO:" (or --prompt FILE:path)'
        )
    return prompt


def encode_prompt(tok, text, model):
    ids = tok.encode(text)
    if max(ids) >= model.config.vocab_size:
        raise SampleError(
            f"the tokenizer gives token {max(ids)} but the model has only "
            f"{model.config.vocab_size}; the checkpoint's tokenizer does not match it"
        )
    block_size = model.config.block_size
    if len(ids) > model.config.context:  # a linear model with rope takes any length
        print(
            f"note: the prompt has {len(ids)} tokens, more than the model's context of "
            f"{block_size}; keeping the last {block_size}",
            file=sys.stderr,
        )
        ids = ids[-block_size:]
    return ids


# -----------------------------------------------------------------------------
# Generation


def generate_one(model, idx, cfg, generator, attention=False, on_token=None):
    """Generate one continuation of idx (1, T).

    Returns (new token ids (list), steps), where steps is None unless
    attention: then it is the (maps, window_start) of each forward since the
    last one that covered the whole context window (the prompt's prefill, the
    rebuild after a slide, or any step without the cache), which is all
    attention_maps.assemble needs.

    The very last token is never fed through the model while generating, so
    with attention the stream runs one step further: that step's forward
    takes the last token through the KV cache (or rebuilds the window, if it
    slides) and gives its attention row. The token it samples is dropped and
    the generator's state restored, so the samples are the same either way.
    """
    n_new = cfg.max_new_tokens
    # a linear-attention model's state keeps no keys to weigh: its maps come from whole forwards
    linear = attention and model.config.attention == "linear"
    # compiled: the step built at the warm-up in main, and kept, is found again
    stream = engine.stream(
        model,
        idx,
        n_new + int(attention),
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        generator=generator,
        use_cache=not (cfg.no_cache or linear),
        window=cfg.window,
        sinks=cfg.sinks,
        compiled=cfg.compile,
        attention=attention,
    )
    new, steps = [], []
    try:
        for i in range(n_new + int(attention)):
            if i == n_new:
                rng_state = generator.get_state()
            token, maps, window_start = next(stream)
            if attention:
                n_q, n_k = maps[0].shape[-2:]
                if window_start != (steps[-1][1] if steps else None) or n_q == n_k:
                    # the window slid, or this forward covers all of it: earlier rows are stale
                    steps.clear()
                steps.append(([m[0].float().cpu().numpy() for m in maps], window_start))
            if i < n_new:
                new.append(token)
                if on_token is not None:
                    on_token(token.item())
    except KeyboardInterrupt:
        # Ctrl-C: the tokens generated so far are the user's, for main to print
        raise Stopped(token_ids(new)) from None
    if attention:
        generator.set_state(rng_state)
    stream.close()
    return token_ids(new), (steps if attention else None)


def token_ids(new):
    """The ids of the new tokens, each a (1, 1) tensor, as a list."""
    if not new:
        return []
    return torch.cat(new, dim=1)[0].tolist()


class Stopped(Exception):
    """Ctrl-C during a sample; new: the ids of the tokens it had generated."""

    def __init__(self, new):
        super().__init__()
        self.new = new


def make_printer(tok, prompt_ids):
    """A callback that prints each new token as it comes. It decodes the whole
    text and prints what is new, holding back an incomplete UTF-8 character
    (a BPE token can end half-way through one)."""
    ids = list(prompt_ids)
    text = tok.decode(ids)
    print(text, end="", flush=True)
    shown = len(text)

    def on_token(token):
        nonlocal shown
        ids.append(token)
        text = tok.decode(ids)
        if not text.endswith("\ufffd"):
            print(text[shown:], end="", flush=True)
            shown = len(text)

    def finish():
        print(tok.decode(ids)[shown:])

    return on_token, finish


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(cfg):
    cfg = check_options(cfg)
    device = pick_device(cfg.device)
    dtype = inference_dtype(cfg.dtype, device)
    text = read_prompt(cfg.prompt)
    model, tok, folder = load_model(cfg.init_from, cfg.out_dir)
    prompt_ids = encode_prompt(tok, text, model)
    # the sample's tokens the maps show, checked before any is generated
    span = span_of(cfg, len(prompt_ids) + cfg.max_new_tokens, model.config.block_size)
    if (cfg.window is not None or cfg.sinks) and model.config.attention == "linear":
        # the window was ignored, and the summary line named a rolling cache all the same
        raise SampleError(
            "--window and --sinks shape a softmax model's KV cache; this linear-attention "
            "model keeps a fixed-size state instead: drop them"
        )
    if cfg.window is not None or cfg.sinks:
        try:  # a bad window, sinks without one, or learned positions: one line
            model.make_kv_cache(1, window=cfg.window, sinks=cfg.sinks)
        except ValueError as e:
            raise SampleError(f"--window={cfg.window} --sinks={cfg.sinks}: {e}") from None
    if cfg.compile and model.config.sliding_window:
        raise SampleError(
            "--compile decodes a full-attention cache; this model has a sliding window: "
            "drop --compile"
        )
    if cfg.compile and model.config.attention != "softmax":
        raise SampleError(
            "--compile decodes softmax attention only; drop it for this linear-attention model"
        )
    if cfg.compile and device.type not in ("cpu", "cuda"):
        raise SampleError(f"--compile runs on CPU and CUDA, not {device}; drop --compile")
    # a rolling cache (a window: the model's own, with rope or learned positions, or
    # --window's) holds its keys by slot, not position: the maps come from one forward
    # over the last block_size tokens once a sample is done
    rolling = cfg.window is not None or model.config.sliding_window is not None
    model.to(device=device, dtype=dtype).eval()

    attn_dir = cfg.attn_dir
    if attn_dir is None:
        attn_dir = os.path.join(folder, "attention")
    if cfg.compile and attn_dir:
        print(
            "(--compile: the compiled step returns no attention weights, so no maps are saved)",
            file=sys.stderr,
        )
        attn_dir = ""
    if attn_dir and cfg.attn_dir is None:
        try:
            cli.output_folder(attn_dir, "--attn_dir")
        except ConfigError as e:
            # the default place, in a checkpoint's folder that cannot be written (another's,
            # read-only): the samples are what was asked for, the maps a bonus
            print(f"(no attention maps: {e} for them)", file=sys.stderr)
            attn_dir = ""
    elif attn_dir:
        cli.output_folder(attn_dir, "--attn_dir")  # found now, not after the samples
    torch.manual_seed(cfg.seed)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=device)

    if cfg.compile:
        t0 = time.perf_counter()
        # the second token compiles the step
        engine.generate_compiled(model, idx, 2, temperature=0.0)
        sync(device)
        print(f"compiled the decode step in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    elapsed, attention = 0.0, None
    for k in range(cfg.num_samples):
        want_attention = k == 0 and bool(attn_dir)
        on_token, finish = make_printer(tok, prompt_ids) if cfg.stream else (None, None)
        sync(device)
        t0 = time.perf_counter()
        try:
            new, steps = generate_one(
                model, idx, cfg, generator, want_attention and not rolling, on_token
            )
        except Stopped as stopped:
            print_sample(cfg, tok, prompt_ids, stopped.new, finish)
            # the maps of a first sample that was done are kept, as when all are
            if attention is not None:
                save_attention(attn_dir, tok, model, span, *attention)
            raise KeyboardInterrupt(
                f"stopped by Ctrl-C: sample {k + 1} of {cfg.num_samples} has "
                f"{len(stopped.new):,} of {cfg.max_new_tokens:,} new tokens"
            ) from None
        sync(device)
        elapsed += time.perf_counter() - t0
        print_sample(cfg, tok, prompt_ids, new, finish)
        if want_attention:
            attention = (
                steps or final_window_maps(model, prompt_ids + new, device),
                prompt_ids + new,
            )
    n_new = cfg.num_samples * cfg.max_new_tokens
    path = "no cache" if cfg.no_cache else "compiled, kv cache" if cfg.compile else "kv cache"
    if rolling:
        w, s = (
            (cfg.window, cfg.sinks)
            if cfg.window
            else (model.config.sliding_window, model.config.sink_tokens)
        )
        path = f"rolling kv cache of {s} sinks + {w} tokens"
    how = f"{path}, {device}, {str(dtype).removeprefix('torch.')}"
    print(
        f"prompt {len(prompt_ids)} tokens, "
        f"{cfg.num_samples} x {cfg.max_new_tokens} new tokens, "
        f"{n_new / max(elapsed, 1e-9):.1f} tokens/s ({how})"
    )

    if attention is not None:
        save_attention(attn_dir, tok, model, span, *attention)


def print_sample(cfg, tok, prompt_ids, new, finish):
    """A sample's text, or the end of it where it was streamed, then a rule. A sample
    stopped by Ctrl-C is printed so too: what it had generated is not lost."""
    if cfg.stream:
        finish()
    else:
        print(tok.decode(prompt_ids + new))
    print("-" * 40)


@torch.no_grad()
def final_window_maps(model, ids, device):
    start = max(0, len(ids) - model.config.block_size)
    _, maps = model.attention_maps(torch.tensor([ids[start:]], device=device))
    return [([m[0].float().cpu().numpy() for m in maps], start)]


def save_attention(attn_dir, tok, model, span, steps, ids):
    """The maps of the span's tokens (None: of the whole text), and the heads' labels
    measured over the whole text the generation ended on."""
    layers, start = attention_maps.assemble(steps)
    window = ids[start:]
    whole = (layers, tok.token_strings(window), start)
    drawn = whole
    seen_from = None
    if span is not None:
        drawn, seen_from = span_maps(model, tok, ids, *span)
    try:
        with cli.replacing_files(attn_dir) as folder:
            stats = attention_maps.write_all(
                folder,
                drawn[0],
                drawn[1],
                ids[drawn[2] : drawn[2] + len(drawn[1])],
                drawn[2],
                whole,
                seen_from,
            )
    except OSError as e:
        raise cli.Failed(
            f"cannot write attention maps to {attn_dir} ({e.strerror or e}); "
            'pass --attn_dir DIR, or --attn_dir "" to skip them'
        ) from None
    n_layer, n_head, T = len(layers), layers[0].shape[0], len(drawn[1])
    first = drawn[2]
    print(
        f"attention of sample 1 (tokens {first}..{first + T - 1} drawn, "
        f"{n_layer} layers x {n_head} heads; labels over {len(window)} tokens): "
        f"{os.path.join(attn_dir, 'index.html')}"
    )
    print(attention_maps.format_table(stats))


@torch.no_grad()
def span_maps(model, tok, ids, start, end):
    """The maps of tokens start..end - 1, from one forward over them and the tokens before
    them that fit the context. Within the first block_size tokens (the default span) these
    are the rows the generation computed, since a KV cache gives the weights of a full
    forward; later, the rows of a reader of the block_size tokens up to the span's end.
    Returns ((layers, token strings, start), the first position the rows attended to)."""
    seen_from = max(0, end - model.config.block_size)
    device = next(model.parameters()).device
    _, maps = model.attention_maps(torch.tensor([ids[seen_from:end]], device=device))
    cut = start - seen_from
    layers = [m[0, :, cut:, cut:].float().cpu().numpy() for m in maps]
    return (layers, tok.token_strings(ids[start:end]), start), seen_from


# what to try when the GPU runs out of memory
OUT_OF_MEMORY = "try --device=cpu, a smaller --max_new_tokens or --num_samples"


def run(argv):
    """The command: what `python sample.py ...` exits with (cli.py)."""
    return cli.run(main, argv, __doc__, Settings, (SampleError,), OUT_OF_MEMORY)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
