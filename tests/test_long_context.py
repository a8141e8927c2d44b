"""Sliding-window attention, attention sinks and the rolling KV cache, against
independent oracles: masks written out by hand, the explicit attention path,
token-by-token locality, and whole-sequence re-scoring of what the cache generated."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig, attention, causal_mask, windowed_attention
from support import engine
from support.engine import compiled_decoder, generate_compiled

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(seed=0, **kw):
    args = dict(
        block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32, dropout=0.0, rope=True
    )
    args.update(kw)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**args)).eval()
    with torch.no_grad():  # larger weights than GPT-2's init: decisive logits, no argmax near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def test_mask_rows_window_3_sinks_1_by_hand():
    # query i sees j in (i - 3, i] (3 keys counting itself) and the sink j = 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 0, 1, 1, 1, 0],
            [1, 0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(causal_mask(6, 6, window=3, sinks=1), expected)
    assert torch.equal(causal_mask(2, 6, window=3, sinks=1), expected[4:])  # the last queries
    no_sink = torch.tensor([[0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(1, 6, window=3), no_sink)
    assert causal_mask(6, 6, window=3).sum(-1).tolist() == [1, 2, 3, 3, 3, 3]  # exactly W keys
    assert torch.equal(
        causal_mask(5, 7), torch.ones(5, 7, dtype=torch.bool).tril(2)
    )  # default unchanged


def test_explicit_path_weights_are_zero_outside_the_band():
    model = tiny(sliding_window=3, sink_tokens=1)
    idx = torch.randint(0, 37, (1, 10))
    _, maps = model.attention_maps(idx)
    band = causal_mask(10, 10, window=3, sinks=1)
    for w in maps:
        assert torch.all(w[..., ~band] == 0)
        assert torch.all(w[..., band] > 0)
        assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-6)


@pytest.mark.parametrize("rope", [False, True])
def test_locality_one_windowed_layer(rope):
    W, T = 4, 14
    model = tiny(n_layer=1, rope=rope, sliding_window=W)
    idx = torch.randint(0, 36, (1, T))
    base = model(idx)[0]
    for p in (W + 2, T - 1):
        far, near = idx.clone(), idx.clone()
        far[0, p - W] = (far[0, p - W] + 1) % 37  # just outside the window of query p
        near[0, p - W + 1] = (near[0, p - W + 1] + 1) % 37  # its oldest visible key
        assert torch.equal(model(far)[0][0, p], base[0, p])
        assert not torch.allclose(model(near)[0][0, p], base[0, p], atol=1e-4)
    sinks = tiny(n_layer=1, rope=rope, sliding_window=W, sink_tokens=1)
    changed = idx.clone()
    changed[0, 0] = (changed[0, 0] + 1) % 37
    diff = (sinks(changed)[0] - sinks(idx)[0]).abs().amax(-1)[0]  # (T,)
    assert torch.all(diff > 1e-4), diff  # the sink reaches every later position


@pytest.mark.parametrize(
    "W,S,T,n_kv", [(8, 0, 45, 4), (8, 3, 45, 2), (200, 0, 301, 4), (200, 4, 333, 1), (5, 2, 3, 4)]
)
def test_blocked_path_equals_explicit(W, S, T, n_kv):
    torch.manual_seed(0)
    q = torch.randn(2, 4, T, 16, requires_grad=True)
    k, v = (torch.randn(2, n_kv, T, 16, requires_grad=True) for _ in range(2))
    out = windowed_attention(q, k, v, W, S)
    rep = 4 // n_kv
    ref, _ = attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), causal_mask(T, T, W, S)
    )
    assert (out - ref).abs().max() < 1e-5
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert (a - b).abs().max() < 1e-5


@pytest.mark.parametrize("S", [0, 3])
def test_blocked_path_runs_in_the_fused_kernel(S):
    # 5-D inputs, keys with strided rows or a 3-D mask send SDPA to its explicit math
    # backend, about 2x slower at T = 8192 (docs/benchmarks.md): the fused one must take it
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 16, requires_grad=True) for _ in range(3))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # raises if the fused kernel cannot take the call
        out = windowed_attention(q, k, v, 40, S, block=16)
        out.sum().backward()
    ref, _ = attention(q, k, v, causal_mask(300, 300, 40, S))
    assert (out - ref).abs().max() < 1e-5


# windowed_attention's forward and backward, eager and compiled, in bfloat16 through the
# math attention path (train.py's on a CPU, for block_size <= 128); for each number of sink
# tokens given, prints the largest difference of each output over its largest value. One
# process for all of them: the second compile reuses the first's kernels (29.6 s against
# 35.3 s for two processes, on two cores of a Zen 4 EPYC)
COMPILED_WINDOW = """
import sys
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from model import windowed_attention

torch.manual_seed(0)
q, k, v, w = (torch.randn(32, 4, 64, 32) for _ in range(4))  # (B, nh, T, hs)


def outputs(attend, sinks):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", torch.bfloat16), sdpa_kernel(SDPBackend.MATH):
        y = attend(*leaves, 16, sinks)
    (y.float() * w).sum().backward()
    return [y.detach().float()] + [t.grad for t in leaves]


for sinks in map(int, sys.argv[1:]):
    eager = outputs(windowed_attention, sinks)
    compiled = outputs(torch.compile(windowed_attention), sinks)
    print(sinks, max(((a - b).abs().max() / a.abs().max()).item() for a, b in zip(eager, compiled)))
"""


def test_windowed_attention_compiled_in_bfloat16():
    """--compile=True with a window, without and with sink tokens, trained in bfloat16 on
    a CPU: compiled, windowed attention gives eager's output and gradients. Built with
    Tensor.unfold, its compiled backward corrupted the heap in PyTorch 2.13 (the process
    aborted; train.py died at its first step). In a process of its own, which such a
    fault may kill."""
    proc = subprocess.run(
        [sys.executable, "-c", COMPILED_WINDOW, "0", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    differences = dict(line.split() for line in proc.stdout.splitlines())
    assert sorted(differences) == ["0", "2"], proc.stdout
    # bfloat16 rounds the compiled kernels' sums in another order
    assert all(float(d) < 2e-2 for d in differences.values()), proc.stdout


def test_model_fused_path_equals_explicit_path():
    model = tiny(sliding_window=5, sink_tokens=2, block_size=64)
    idx = torch.randint(0, 37, (2, 63))
    fused = model(idx)[0]
    explicit = model.attention_maps(idx)[0]
    assert (fused - explicit).abs().max() < 1e-4


def rolling_decode(model, prompt, steps, **cache_options):
    """Greedy decoding one token at a time through a cache; returns the tokens and
    the log-probability of each chosen token."""
    cache = model.make_kv_cache(1, **cache_options)
    with torch.no_grad():
        logits = model(prompt, kv_cache=cache)[0][:, -1]
        tokens, logp = [], []
        for _ in range(steps):
            tok = logits.argmax(-1, keepdim=True)
            tokens.append(tok)
            logp.append(logits.log_softmax(-1).gather(-1, tok))
            logits = model(tok, kv_cache=cache)[0][:, -1]
    return torch.cat(tokens, 1), torch.cat(logp, 1), cache


def test_rolling_cache_oracle_rescored_by_one_forward():
    """Mistral's test: 20 x block_size greedy tokens through the rolling cache, then
    the whole sequence scored in one forward agrees token by token."""
    model = tiny(sliding_window=6, sink_tokens=2)
    prompt = torch.randint(0, 37, (1, 11))  # a first chunk longer than the window
    steps = 20 * model.config.block_size
    tokens, logp, cache = rolling_decode(model, prompt, steps)
    assert cache.slot_pos.numel() == 8
    seq = torch.cat([prompt, tokens], 1)
    with torch.no_grad():
        full = model(seq)[0][0, prompt.size(1) - 1 : -1].log_softmax(
            -1
        )  # predicts each generated token
    assert torch.equal(full.argmax(-1), tokens[0])
    assert (full.gather(-1, tokens[0][:, None])[:, 0] - logp[0]).abs().max() < 1e-4
    # generate uses the same cache and never slides
    assert torch.equal(model.generate(prompt, steps, temperature=0), seq)


def test_rolling_cache_chunk_after_tokens_equals_full_forward():
    model = tiny(sliding_window=5, sink_tokens=1)
    idx = torch.randint(0, 37, (1, 40))
    cache = model.make_kv_cache(1)
    with torch.no_grad():
        parts = [
            model(idx[:, a:b], kv_cache=cache)[0]
            for a, b in ((0, 3), (3, 4), (4, 17), (17, 18), (18, 40))
        ]
        full = model(idx)[0]
    assert (torch.cat(parts, 1) - full).abs().max() < 1e-4


def test_cache_bytes_constant_and_the_window_fraction():
    model = tiny(sliding_window=6, sink_tokens=2)
    dense = tiny()
    assert model.make_kv_cache(1).nbytes * 16 == dense.make_kv_cache(1).nbytes * (6 + 2)
    cache = model.make_kv_cache(1)
    before = cache.nbytes
    with torch.no_grad():
        for t in torch.randint(0, 37, (100,)):
            model(t.view(1, 1), kv_cache=cache)
    assert cache.pos == 100 and cache.nbytes == before


def test_streaming_cache_slot_mapping_across_a_wrap():
    """Position p >= S at slot S + (p - S) mod W: written out by hand for S = 2, W = 4."""
    model = tiny(n_layer=1)
    cache = model.make_kv_cache(1, window=4, sinks=2)
    held = []
    with torch.no_grad():
        for t in torch.randint(0, 37, (11,)):
            model(t.view(1, 1), kv_cache=cache)
            held.append(cache.slot_pos.tolist())
    assert held[3] == [0, 1, 2, 3, -1, -1]
    assert held[5] == [0, 1, 2, 3, 4, 5]
    assert held[6] == [0, 1, 6, 3, 4, 5]  # the wrap: 6 replaces 2, the oldest of the window
    assert held[9] == [0, 1, 6, 7, 8, 9]
    assert held[10] == [0, 1, 10, 7, 8, 9]


def test_streaming_cache_rotates_keys_at_their_place_in_the_cache():
    """One layer: its keys depend on the token alone, so decoding through a
    StreamingLLM cache must give what a fresh forward gives on the sinks followed by
    the window, at positions 0 .. S + W - 1 (rotated keys would keep the old ones)."""
    S, W = 2, 5
    model = tiny(n_layer=1)
    idx = torch.randint(0, 37, (1, 3 * model.config.block_size))
    cache = model.make_kv_cache(1, window=W, sinks=S)
    with torch.no_grad():
        for p in range(idx.size(1)):
            got = model(idx[:, p : p + 1], kv_cache=cache)[0][0, -1]
            kept = (
                idx[:, : p + 1]
                if p < S + W
                else torch.cat([idx[:, :S], idx[:, p - W + 1 : p + 1]], 1)
            )
            assert (got - model(kept)[0][0, -1]).abs().max() < 1e-4, p
    # past block_size with no slide: generate runs through the same cache
    out = engine.generate(model, idx[:, :3], 40, temperature=0, window=W, sinks=S)
    assert out.shape == (1, 43)


@pytest.mark.parametrize(
    "kw, expected",
    [
        (dict(sliding_window=0), "sliding_window must be a whole number >= 1 (or None), got 0"),
        (dict(sliding_window=-3), "sliding_window must be a whole number >= 1 (or None), got -3"),
        (dict(sliding_window=2.5), "sliding_window must be a whole number >= 1 (or None), got 2.5"),
        (dict(sliding_window=4, sink_tokens=-1), "sink_tokens must be a whole number >= 0, got -1"),
        (dict(sink_tokens=4), "sink_tokens=4 needs a sliding_window: give one too, or leave the"),
    ],
)
def test_bad_window_settings_fail_in_one_line(kw, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        GPTConfig(**kw)


def test_bad_cache_window_fails_in_one_line():
    learned = tiny(rope=False)
    with pytest.raises(ValueError, match="rope"):
        learned.make_kv_cache(1, window=4, sinks=2)
    with pytest.raises(ValueError, match="block_size"):
        tiny().make_kv_cache(1, window=16, sinks=4)
    with pytest.raises(ValueError, match="sliding_window"):
        tiny().make_kv_cache(1, window=0)
    with pytest.raises(ValueError, match="sink_tokens=2 needs a sliding_window"):
        tiny().make_kv_cache(1, sinks=2)
    with pytest.raises(ValueError, match="window"):
        generate_compiled(tiny(sliding_window=4), torch.zeros(1, 1, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="full attention"):
        compiled_decoder(tiny(sliding_window=4), 1)


# ---------------------------------------------------------------------------
# sample.py and train.py


def save_tiny_checkpoint(folder, **kw):
    import dataclasses

    from data.tokenizer import build_tokenizer
    from support.checkpoint import checkpoint_path, save_checkpoint

    tok = build_tokenizer("char", "abcdefghijklmnopqrstuvwxyz ,.\n")
    model = tiny(vocab_size=tok.vocab_size, **kw)
    save_checkpoint(
        {
            "model": model.state_dict(),
            "model_args": dataclasses.asdict(model.config),
            "iter_num": 0,
            "best_val_loss": 0.0,
            "config": {},
            "tokenizer": tok.describe(),
            "dataset": "tiny",
        },
        checkpoint_path(str(folder)),
    )
    return model, tok


def one_line(code, err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_sample_streams_past_block_size_with_window_and_sinks(tmp_path, capsys):
    import sample

    model, tok = save_tiny_checkpoint(tmp_path / "full")
    argv = [
        f"--out_dir={tmp_path / 'full'}",
        "--prompt=abc",
        "--max_new_tokens=50",
        "--num_samples=1",
        "--temperature=0",
        "--attn_dir=",
        "--window=6",
        "--sinks=2",
    ]
    assert sample.run(argv) == 0
    out = capsys.readouterr().out
    assert "rolling kv cache of 2 sinks + 6 tokens" in out
    expected = engine.generate(
        model, torch.tensor([tok.encode("abc")]), 50, temperature=0, window=6, sinks=2
    )
    assert tok.decode(expected[0].tolist()) in out
    # a model trained with a window reads it from its checkpoint, and maps come from one forward
    save_tiny_checkpoint(tmp_path / "windowed", sliding_window=5, sink_tokens=1)
    assert (
        sample.run(
            [
                f"--out_dir={tmp_path / 'windowed'}",
                "--prompt=abc",
                "--max_new_tokens=40",
                "--num_samples=1",
                f"--attn_dir={tmp_path / 'maps'}",
            ]
        )
        == 0
    )
    assert "rolling kv cache of 1 sinks + 5 tokens" in capsys.readouterr().out
    assert (tmp_path / "maps" / "index.html").exists()


@pytest.mark.parametrize("rope", [True, False])
def test_sample_maps_of_a_windowed_model_past_its_window(tmp_path, capsys, rope):
    """A model trained with a window decodes through a rolling cache, whose rows are by
    slot: the maps sample.py saves are one forward's over the last block_size tokens,
    with learned positions as with rope (a traceback after the samples, before)."""
    import sample

    model, tok = save_tiny_checkpoint(tmp_path / "m", sliding_window=4, rope=rope)
    argv = [
        f"--out_dir={tmp_path / 'm'}",
        "--prompt=abc",
        "--max_new_tokens=30",
        "--num_samples=1",
        "--temperature=0",
        f"--attn_dir={tmp_path / 'maps'}",
        "--attn_span=all",  # the end of the text, past the window
    ]
    assert sample.run(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "rolling kv cache of 0 sinks + 4 tokens" in out
    ids = engine.generate(model, torch.tensor([tok.encode("abc")]), 30, temperature=0)[0]
    assert tok.decode(ids.tolist()) in out
    # the oracle: the model's own maps over the last block_size tokens, each row zero
    # outside the window of 4
    with torch.no_grad():
        _, maps = model.attention_maps(ids[-16:][None])
    saved = np.load(tmp_path / "maps" / "attention.npz")
    assert saved["window_start"] == len(ids) - 16
    assert saved["token_ids"].tolist() == ids[-16:].tolist()
    saved = saved["layer_0"]
    assert saved.shape == (4, 16, 16)
    np.testing.assert_allclose(saved, maps[0][0].numpy(), atol=1e-6)
    assert np.all(np.triu(saved, 1) == 0) and np.all(np.tril(saved, -4) == 0)
    # by default, the start: the prompt and the first tokens, one forward over them
    assert sample.run(argv[:-1]) == 0, capsys.readouterr().err
    first = np.load(tmp_path / "maps" / "attention.npz")
    assert first["window_start"] == 0 and first["token_ids"].tolist() == ids[:16].tolist()
    with torch.no_grad():
        _, maps = model.attention_maps(ids[:16][None])
    np.testing.assert_allclose(first["layer_0"], maps[0][0].numpy(), atol=1e-6)


@pytest.mark.parametrize(
    "extra,expected",
    [
        (["--window=0"], "--window=0 --sinks=0: sliding_window must be a whole number >= 1"),
        (["--sinks=4"], "--sinks=4: sink_tokens=4 needs a sliding_window"),
        (["--window=4", "--sinks=-1"], "sink_tokens must be a whole number >= 0"),
        (["--window=4", "--compile"], "drop --compile"),
        (["--window=4", "--learned"], "rope"),
    ],
)
def test_sample_bad_window_options_fail_in_one_line(tmp_path, capsys, extra, expected):
    import sample

    learned = "--learned" in extra
    save_tiny_checkpoint(tmp_path, rope=not learned)
    argv = [f"--out_dir={tmp_path}", "--prompt=abc", "--max_new_tokens=5", "--attn_dir="]
    code = sample.run(argv + [a for a in extra if a != "--learned"])
    assert expected in one_line(code, capsys.readouterr().err)


@pytest.mark.parametrize("model", ["windowed", "linear"])
def test_sample_compile_refused_in_one_line(tmp_path, capsys, model):
    """--compile on a model its decode step cannot take, with the default maps folder:
    the refusal alone (before, a linear model's came after a note that no maps would be
    saved, two lines for one mistake)."""
    import sample

    kind = {"windowed": dict(sliding_window=4), "linear": dict(attention="linear")}[model]
    save_tiny_checkpoint(tmp_path, **kind)
    code = sample.run([f"--out_dir={tmp_path}", "--prompt=abc", "--compile"])
    line = one_line(code, capsys.readouterr().err)
    assert line.startswith("error: --compile decodes") and "drop" in line, line
    assert not (tmp_path / "attention").exists()


def test_train_flags_reach_the_checkpoint(tmp_path, data_root):
    import train
    from support.loading import load_checkpoint

    out = tmp_path / "out"
    train.main(
        [
            "--dataset=shakespeare_char",
            f"--data_root={data_root}",
            f"--out_dir={out}",
            "--max_iters=2",
            "--eval_interval=2",
            "--eval_iters=1",
            "--batch_size=2",
            "--block_size=64",
            "--n_layer=1",
            "--n_embd=32",
            "--n_head=2",
            "--rope=True",
            "--sliding_window=8",
            "--sink_tokens=2",
            "--compile=False",
            "--device=cpu",
            "--dtype=float32",
            "--gradient_accumulation_steps=1",
            "--log_interval=1",
            "--warmup_iters=1",
        ]
    )
    args = load_checkpoint(str(out))["model_args"]
    assert args["sliding_window"] == 8 and args["sink_tokens"] == 2


def test_train_bad_window_is_one_line(tmp_path, data_root, capsys):
    import train

    with pytest.raises(SystemExit):
        train.main(
            [
                "--dataset=shakespeare_char",
                f"--data_root={data_root}",
                f"--out_dir={tmp_path}",
                "--sink_tokens=4",
                "--device=cpu",
                "--compile=False",
            ]
        )
    err = capsys.readouterr().err
    assert "Traceback" not in err and "sink_tokens=4 needs a sliding_window" in err
