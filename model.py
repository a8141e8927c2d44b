"""
A GPT-style causal decoder in one file, meant to be read top to bottom.

The ideas appear in the order they are built:
  1. attention      softmax(Q K^T / sqrt(d)) V, written out, returning its weights
  2. causal_mask    which keys each query may see; future scores become -inf
  3. Head           one attention head with its own W_Q, W_K, W_V
  4. KVCache        preallocated keys and values, so decoding feeds one token at a time
  5. MultiHeadAttention  all heads in one projection, plus W_O
  6. MLP, Block     the feed-forward layer and the pre-LayerNorm residual block
  7. GPT            embeddings, blocks, tied LM head, loss, a fixed-shape decode step
                    for compiling, generation, GPT-2 weights

Shapes use B = batch, T = sequence length, C = n_embd, nh = heads, hs = head size.
Only torch and the standard library are imported.
"""

import json
import math
import os
import pickle
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
# 1. Scaled dot-product attention


def attention(q, k, v, mask=None):
    """Explicit attention: softmax(q k^T / sqrt(d)) v.

    q: (..., Tq, d), k: (..., Tk, d), v: (..., Tk, dv)
    mask: bool, broadcastable to (..., Tq, Tk), True where attending is allowed.
    Returns (out (..., Tq, dv), weights (..., Tq, Tk)).
    """
    d = q.size(-1)
    # dividing by sqrt(d) keeps the scores' variance near 1 whatever the head size,
    # so the softmax does not saturate into a one-hot as d grows
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., Tq, Tk)
    if mask is not None:
        # -inf, not a large negative number: exp(-inf) is exactly 0, so a masked
        # key receives exactly zero weight
        scores = scores.masked_fill(~mask, float("-inf"))
    # the softmax runs in float32 so that bf16/fp16 weights still sum to 1
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return weights @ v, weights


# -----------------------------------------------------------------------------
# 2. The causal mask


def causal_mask(t_q, t_k, device=None):
    """Bool (t_q, t_k): True where query i may attend to key j.

    The queries are the last t_q of the t_k positions, so query i sits at
    absolute position t_k - t_q + i and sees keys 0 .. t_k - t_q + i.
    causal_mask(T, T) is the usual lower triangle; causal_mask(1, T) lets the
    newest token (the KV-cache case) see everything before it.
    """
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


# -----------------------------------------------------------------------------
# 3. One attention head


class Head(nn.Module):
    """One causal attention head: the readable unit that MultiHeadAttention batches."""

    def __init__(self, n_embd, head_size, bias=True):
        super().__init__()
        self.query = nn.Linear(n_embd, head_size, bias=bias)  # W_Q
        self.key = nn.Linear(n_embd, head_size, bias=bias)  # W_K
        self.value = nn.Linear(n_embd, head_size, bias=bias)  # W_V

    def forward(self, x):
        T = x.size(1)
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, T, hs) each
        out, weights = attention(q, k, v, causal_mask(T, T, x.device))
        return out, weights  # (B, T, hs), (B, T, T)


# -----------------------------------------------------------------------------
# 4. The KV cache


class KVCache:
    """Keys and values of every layer for the positions seen so far.

    The buffers are allocated once at full length, (B, n_kv_head, block_size, hs)
    per layer, and new positions are written in place: decoding never grows a
    tensor with torch.cat or reallocates.

    The fixed-shape decode step (GPT.decode_step) gives the position as a tensor
    instead (`at`) and attends to the whole buffer, masking what is not written
    yet; that needs zeroed buffers (zero=True), because a masked position still
    multiplies its value by a weight of 0, and 0 * NaN garbage would be NaN.
    """

    def __init__(self, n_layer, batch_size, n_kv_head, block_size, head_size, device=None, dtype=None,
                 zero=False):
        shape = (batch_size, n_kv_head, block_size, head_size)
        # empty by default: positions past pos are never read, and zero-filling
        # would touch every page of the buffer before the first token
        alloc = torch.zeros if zero else torch.empty
        # one tensor per layer, not one for all: a compiled step that writes into
        # a slice of a shared tensor copies the whole tensor on every token
        self.k = [alloc(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [alloc(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.block_size = block_size
        self.pos = 0  # positions filled; the model advances it after a forward

    def update(self, layer, k, v, at=None):
        """Write k, v (B, n_kv_head, T, hs) at the next positions of one layer;
        return that layer's keys and values so far, (B, n_kv_head, pos + T, hs).
        With `at` (a 1-element tensor, T = 1): write there, return the whole buffers."""
        if at is not None:
            self.k[layer][:, :, at] = k
            self.v[layer][:, :, at] = v
            return self.k[layer], self.v[layer]  # (B, n_kv_head, block_size, hs)
        end = self.pos + k.size(2)
        self.k[layer][:, :, self.pos:end] = k
        self.v[layer][:, :, self.pos:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def reset(self):
        self.pos = 0  # stale entries past pos are never read, so no clearing needed

    def written(self, at):
        """Bool (1, block_size), a row of the causal mask: True at positions 0 .. at."""
        return (torch.arange(self.block_size, device=at.device) <= at)[None]

    @property
    def nbytes(self):
        return sum(t.nbytes for t in self.k + self.v)


# -----------------------------------------------------------------------------
# Rotary position embeddings: an option (GPTConfig.rope) for fast training runs.
# Each pair of channels of q and k is rotated by an angle proportional to the
# position, so q . k depends on the positions only through their difference.


def rotary_tables(head_size, length, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2).float() / head_size)
    angles = torch.outer(torch.arange(length).float(), inv_freq)  # (length, hs/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    # x: (B, nh, T, hs); cos, sin: (T, hs/2) for the absolute positions of x
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# -----------------------------------------------------------------------------
# 5. Multi-head attention


class MultiHeadAttention(nn.Module):
    """n_head causal heads computed together, then mixed by W_O.

    One Linear (c_attn) holds every head's W_Q, W_K, W_V side by side; with the
    same weights this equals running n_head Heads, concatenating, applying W_O.
    With n_kv_head < n_head (grouped-query attention) each key/value head is
    shared by n_head / n_kv_head query heads, which shrinks the KV cache.
    """

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        kv_width = self.n_kv_head * self.head_size
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # W_O
        self.qk_norm = config.qk_norm
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, kv_cache=None, layer=0, rotary=None, return_attention=False, at=None):
        B, T, C = x.size()
        hs, nh, nkv = self.head_size, self.n_head, self.n_kv_head
        q, k, v = self.c_attn(x).split([nh * hs, nkv * hs, nkv * hs], dim=2)
        q = q.view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if self.qk_norm:
            # normalising q and k bounds the attention logits, which lets fast
            # training recipes use large learning rates without blow-ups
            q, k = F.rms_norm(q, (hs,)), F.rms_norm(k, (hs,))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if kv_cache is not None:
            k, v = kv_cache.update(layer, k, v, at)  # (B, nkv, Tk, hs), Tk = cached + T
        Tk = k.size(2)

        if return_attention or at is not None:
            # the explicit path: the weights can be returned for inspection, and
            # in the fixed-shape decode step (see KVCache) one query's row is
            # small, and compiled code runs it faster than the fused kernel with a mask
            if nkv != nh:
                k = k.repeat_interleave(nh // nkv, dim=1)  # (B, nh, Tk, hs)
                v = v.repeat_interleave(nh // nkv, dim=1)
            mask = kv_cache.written(at) if at is not None else causal_mask(T, Tk, x.device)
            y, weights = attention(q, k, v, mask)
        else:
            # the fused kernel (flash / memory-efficient on GPU): same result, and
            # it never materialises the (T, Tk) weights
            if T == Tk:
                mask, is_causal = None, True
            elif T == 1:
                mask, is_causal = None, False  # the newest token sees every key
            else:
                # SDPA's is_causal aligns the queries to the first keys, not the
                # last, so a chunk appended to a cache needs the explicit mask
                mask, is_causal = causal_mask(T, Tk, x.device), False
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal,
                dropout_p=self.dropout if self.training else 0.0, enable_gqa=nkv != nh)
            weights = None
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y)), weights


# -----------------------------------------------------------------------------
# 6. The feed-forward layer and the transformer block


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.activation = config.activation
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        if self.activation == "relu2":
            x = F.relu(x)
            x = x * x  # ReLU squared; x * x has a cheaper backward than square() on CPU
        else:
            x = F.gelu(x, approximate="tanh")  # GPT-2's own GELU approximation
        return self.dropout(self.c_proj(x))


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = MultiHeadAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None, layer=0, rotary=None, return_attention=False, at=None):
        a, weights = self.attn(self.ln_1(x), kv_cache, layer, rotary, return_attention, at)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, weights


# -----------------------------------------------------------------------------
# 7. The GPT model


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64, for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm, as in GPT-2
    n_kv_head: Optional[int] = None  # None: n_head (plain multi-head attention)
    # options for fast training runs; the defaults are GPT-2's own architecture
    rope: bool = False  # rotary embeddings instead of learned positions
    qk_norm: bool = False  # RMS-normalise queries and keys per head
    activation: str = "gelu"  # "gelu" (tanh approximation) or "relu2"

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "n_kv_head"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head})")
        if self.rope and (self.n_embd // self.n_head) % 2:
            raise ValueError("rope needs an even head size (n_embd / n_head)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.activation not in ("gelu", "relu2"):
            raise ValueError(f"activation must be 'gelu' or 'relu2', got {self.activation!r}")


# Peak dense bf16 tensor throughput, FLOP/s (NVIDIA data sheets, half the
# "with sparsity" figure), used by estimate_mfu. Matched in order against
# torch.cuda.get_device_name(), so the variants come before the plain names;
# the H100 SXM calls itself "H100 80GB HBM3".
PEAK_FLOPS = {"H100 NVL": 835e12, "H100 PCIe": 756e12, "H100": 989e12,
              "H200 NVL": 835e12, "H200": 989e12, "A100": 312e12}


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self._decoders = {}  # compiled decode steps, by batch size (compiled_decoder)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),  # token embedding
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        if not config.rope:
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)  # positions
        else:
            cos, sin = rotary_tables(config.n_embd // config.n_head, config.block_size)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: reading a token in and writing it out share one matrix,
        # which saves parameters and helps small models
        self.lm_head.weight = self.transformer.wte.weight

        self.apply(self._init_weights)
        # GPT-2: each block adds two residual projections to the stream, so their
        # init is scaled down to keep the stream's variance from growing with depth
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding=False):
        """Parameter count; the tied LM head is counted once. With non_embedding,
        the position embedding is left out (the token one is the LM head too)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def make_kv_cache(self, batch_size, dtype=None, zero=False):
        c = self.config
        p = self.transformer.wte.weight
        return KVCache(c.n_layer, batch_size, c.n_kv_head, c.block_size, c.n_embd // c.n_head,
                       device=p.device, dtype=dtype or p.dtype, zero=zero)

    def forward(self, idx, targets=None, kv_cache=None, return_attention=False, last_only=False):
        """idx (B, T) token ids -> (logits (B, T, vocab), loss or None).

        kv_cache: attend over the cached positions plus idx, append idx's keys
        and values, and advance the cache. return_attention adds a third item,
        one (B, n_head, T, Tk) weight tensor per layer. last_only computes the
        logits of the last position alone (what generation needs).
        """
        B, T = idx.size()
        start = kv_cache.pos if kv_cache is not None else 0
        if kv_cache is not None and start + T > kv_cache.block_size:
            raise ValueError(
                f"KV cache overflow: {start} positions cached + {T} new > block_size "
                f"{kv_cache.block_size}; reset the cache or slide the window")
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")

        x = self.transformer.wte(idx)  # (B, T, C)
        rotary = None
        if self.config.rope:
            rotary = (self.rotary_cos[start:start + T], self.rotary_sin[start:start + T])
        else:
            pos = torch.arange(start, start + T, device=idx.device)
            x = x + self.transformer.wpe(pos)  # (T, C) broadcast over B
        x = self.transformer.drop(x)
        maps = []
        for layer, block in enumerate(self.transformer.h):
            x, weights = block(x, kv_cache, layer, rotary, return_attention)
            maps.append(weights)
        if kv_cache is not None:
            kv_cache.pos += T
        x = self.transformer.ln_f(x)

        if targets is not None:
            logits = self.lm_head(x)  # (B, T, vocab)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1),
                                   ignore_index=-1)
        else:
            logits = self.lm_head(x[:, -1:] if last_only else x)
            loss = None
        if return_attention:
            return logits, loss, maps
        return logits, loss

    def decode_step(self, idx, at, kv_cache):
        """Logits (B, vocab) for one new token per sequence, idx (B, 1), at
        position `at` (a 1-element long tensor), through a zeroed cache.

        forward(idx, kv_cache=...) does the same work, but its shapes grow with
        the cache. Here they never change: the whole cache is attended to and
        the positions past `at` are masked. So torch.compile builds the step
        once, and on CUDA it can be recorded as a CUDA graph and replayed for
        every token (generate(..., compile=True)). Inference only: no dropout.
        """
        x = self.transformer.wte(idx)  # (B, 1, C)
        rotary = None
        if self.config.rope:
            rotary = (self.rotary_cos[at], self.rotary_sin[at])  # (1, hs/2) each
        else:
            x = x + self.transformer.wpe(at)
        for layer, block in enumerate(self.transformer.h):
            x, _ = block(x, kv_cache, layer, rotary, at=at)
        return self.lm_head(self.transformer.ln_f(x))[:, -1]  # (B, vocab)

    # -------------------------------------------------------------------------
    # Generation

    def context_start(self, length, start):
        """The sliding-window rule shared by cached and uncached generation.

        Given a sequence of `length` tokens whose window begins at `start`,
        return where the window begins for predicting the next token. Learned
        positions stop at block_size, so once the window would overflow it
        slides: the oldest quarter is dropped and the cache is rebuilt from the
        remaining three quarters in one forward. The rebuild happens once every
        block_size / 4 tokens instead of on every token.
        """
        bs = self.config.block_size
        if length - start <= bs:
            return start
        keep = max(1, bs - bs // 4)
        return length - keep

    def compiled_decoder(self, batch_size, cuda_graphs=None):
        """(decode_step compiled with torch.compile, its zeroed KVCache), built on
        first use for this batch size and kept, so later calls reuse both.

        CUDA: mode "reduce-overhead" records the step as a CUDA graph, replayed
        for every token; the cache buffers are marked static so the graph writes
        to them in place. CPU: max-autotune with frozen weights, which lets
        inductor generate its own matrix-vector kernels (docs/benchmarks.md).
        Frozen weights are constants of the compiled code, so the step is rebuilt
        if any parameter changes afterwards (e.g. more training).
        cuda_graphs: None takes the CUDA branch exactly when the weights are on
        CUDA; True takes it on any device (on CPU inductor skips the recording,
        which lets tests check the branch without a GPU).
        """
        p = self.transformer.wte.weight
        if p.device.type not in ("cpu", "cuda"):
            raise ValueError(f"compile=True is built for CPU and CUDA, not {p.device.type}")
        cuda_graphs = p.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        key = (batch_size, p.device, p.dtype, cuda_graphs)
        # only the CPU branch freezes the weights, so only there does a changed one matter
        version = tuple(q._version for q in self.parameters()) if not cuda_graphs else None
        built = self._decoders.get(key)
        if built is None or built[2] != version:
            cache = self.make_kv_cache(batch_size, zero=True)
            if cuda_graphs:
                for t in cache.k + cache.v:
                    torch._dynamo.mark_static_address(t)
                step = torch.compile(self.decode_step, mode="reduce-overhead", fullgraph=True)
            else:
                compiled = torch.compile(self.decode_step, mode="max-autotune-no-cudagraphs", fullgraph=True)

                def step(*args):
                    # inductor reads its config when it compiles, at the first call;
                    # the other two keep its autotuning reports off the terminal
                    with torch._inductor.config.patch(freezing=True, autotune_num_choices_displayed=0,
                                                      max_autotune_report_choices_stats=False):
                        return compiled(*args)
            built = self._decoders[key] = (step, cache, version)
        return built[0], built[1]

    @torch.no_grad()
    def generate_stream(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                        use_cache=True, generator=None, return_attention=False, compile=False):
        """Yield (next_token (B, 1), attention, window_start) for each new token.

        attention is None unless return_attention: then it is the per-layer list
        of weights of the forward that produced this token's logits, over the
        window idx[:, window_start:]. With the cache: the prefill's (B, nh, T, T)
        maps, then one (B, nh, 1, Tk) row per decoded token.
        compile: decode through compiled_decoder (the prompt is still prefilled
        eagerly); the first call pays for compiling.
        """
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if idx.size(1) < 1:
            raise ValueError("generation needs at least one prompt token")
        if compile and (return_attention or not use_cache):
            raise ValueError("compile=True decodes through the KV cache and returns no attention maps")
        bs = self.config.block_size
        # a prompt longer than the window keeps its last block_size tokens
        start = max(0, idx.size(1) - bs)
        step, cache = None, None
        if compile:
            step, cache = self.compiled_decoder(idx.size(0))
        elif use_cache:
            cache = self.make_kv_cache(idx.size(0))
        fresh = True  # the cache holds nothing for the current window yet
        for _ in range(max_new_tokens):
            new_start = self.context_start(idx.size(1), start)
            if new_start != start:
                start, fresh = new_start, True
            if cache is None:
                out = self(idx[:, start:], return_attention=return_attention, last_only=True)
            elif fresh:
                cache.reset()
                out = self(idx[:, start:], kv_cache=cache, return_attention=return_attention,
                           last_only=True)
                fresh = False
            elif step is not None:
                if idx.is_cuda:
                    torch.compiler.cudagraph_mark_step_begin()  # the last step's logits are used up
                at = torch.tensor([cache.pos], device=idx.device)
                # a fresh (B, 1) tensor: a view into idx would change strides every step
                last = idx[:, -1:].clone(memory_format=torch.contiguous_format)
                out = (step(last, at, cache)[:, None], None)  # (logits, loss), as forward gives
                cache.pos += 1
            else:
                out = self(idx[:, -1:], kv_cache=cache, return_attention=return_attention)
            logits = out[0][:, -1, :]
            idx_next = sample_next(logits, temperature, top_k, top_p, generator)
            idx = torch.cat((idx, idx_next), dim=1)
            yield idx_next, (out[2] if return_attention else None), start

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                 use_cache=True, generator=None, compile=False):
        """Return idx (B, T) with max_new_tokens sampled tokens appended.

        The prompt is prefilled in one forward, then one token per step goes
        through the KV cache. temperature=0 is greedy. use_cache=False
        recomputes the whole window every step, following the same sliding
        rule, so greedy decoding gives identical tokens either way.
        compile=True decodes with the compiled fixed-shape step (compiled_decoder).
        """
        steps = self.generate_stream(idx, max_new_tokens, temperature, top_k, top_p,
                                     use_cache, generator, compile=compile)
        new = [token for token, _, _ in steps]
        return torch.cat([idx] + new, dim=1)

    # -------------------------------------------------------------------------
    # Training helpers

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW; weight decay on matrices only (not on biases, LayerNorm gains)."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        # the fused kernel updates every parameter in one pass (CUDA and CPU)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu"))

    def flops_per_token(self):
        """Training FLOPs per token: 6 per parameter plus the attention scores."""
        c = self.config
        return 6 * self.num_params(non_embedding=True) + 12 * c.n_layer * c.n_embd * c.block_size

    def estimate_mfu(self, tokens_per_iter, dt):
        """Model FLOPs utilisation against the running GPU's bf16 peak (PEAK_FLOPS);
        None where the peak is unknown (CPU, other GPUs)."""
        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
        peak = next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)
        if peak is None or dt <= 0:
            return None
        return self.flops_per_token() * tokens_per_iter / dt / peak

    # -------------------------------------------------------------------------
    # GPT-2 weights in Hugging Face format

    @classmethod
    def from_pretrained(cls, path_or_name, **overrides):
        """Load GPT-2 from a local Hugging Face folder (config.json plus
        model.safetensors or pytorch_model.bin), or by name ('gpt2',
        'gpt2-medium', ...) through huggingface_hub when there is a network.
        overrides: GPTConfig fields to change, e.g. dropout or a smaller block_size."""
        folder = _pretrained_folder(path_or_name)
        try:
            with open(os.path.join(folder, "config.json")) as f:
                hf = json.load(f)
            hf = {key: int(hf[key]) for key in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd")} | {
                "activation_function": hf.get("activation_function", "gelu_new")}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{folder}/config.json is missing or not a GPT-2 config ({type(e).__name__}: {e})") from None
        if hf["activation_function"] not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported activation {hf['activation_function']!r} in {folder}")
        args = dict(block_size=hf["n_positions"], vocab_size=hf["vocab_size"], n_layer=hf["n_layer"],
                    n_head=hf["n_head"], n_embd=hf["n_embd"], bias=True, dropout=0.0)
        block_size = overrides.pop("block_size", args["block_size"])
        if block_size > args["block_size"]:
            raise ValueError(f"block_size {block_size} is larger than the pretrained model's "
                             f"{args['block_size']}")
        args.update(overrides, block_size=block_size)
        model = cls(GPTConfig(**args))

        sd = {}
        for key, tensor in _read_state_dict(folder).items():
            key = key.removeprefix("transformer.")
            if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
                continue  # causal-mask buffers, and the LM head tied to wte
            # Hugging Face's GPT-2 stores these as Conv1D, (in, out): transpose to Linear's (out, in)
            if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                tensor = tensor.t()
            sd["transformer." + key] = tensor
        sd["transformer.wpe.weight"] = sd["transformer.wpe.weight"][:block_size]
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
        model.load_state_dict(sd, strict=True)
        return model


def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Pick the next token (B, 1) from the last position's logits (B, vocab)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # nucleus sampling: keep the smallest set of most likely tokens whose
        # probability reaches top_p (the most likely token is always kept)
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


def _pretrained_folder(path_or_name):
    if os.path.isdir(path_or_name):
        return path_or_name
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"{path_or_name!r} is not a folder, and downloading it needs "
                         "huggingface_hub (pip install huggingface_hub)") from None
    try:
        return snapshot_download(path_or_name, allow_patterns=["config.json", "*.safetensors"])
    except Exception as e:
        raise ValueError(f"could not download {path_or_name!r} ({type(e).__name__}); offline, "
                         "pass a local folder with config.json and model.safetensors") from None


_SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _read_state_dict(folder):
    """Tensors from model.safetensors or pytorch_model.bin; a damaged or
    unsafe file is a one-line ValueError naming it."""
    path = os.path.join(folder, "model.safetensors")
    if os.path.exists(path):
        try:
            return _read_safetensors(path)
        except (ValueError, KeyError, TypeError, RuntimeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is truncated or not a safetensors file ({type(e).__name__})") from None
    path = os.path.join(folder, "pytorch_model.bin")
    if os.path.exists(path):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise ValueError(f"refused to load {path}: it holds objects that could run code when "
                             "unpickled; use model.safetensors or a file you trust") from None
        except (RuntimeError, EOFError, OSError) as e:
            raise ValueError(f"{path} is truncated or not a PyTorch file ({type(e).__name__})") from None
        return {k: v.float() for k, v in state.items()}
    raise ValueError(f"{folder} has neither model.safetensors nor pytorch_model.bin")


def _read_safetensors(path):
    """The format is simple enough to read directly: an 8-byte little-endian
    header length, a JSON header of names, dtypes, shapes and offsets, raw data."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    tensors = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"unsupported dtype {info['dtype']} for {key}")
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(body):
            raise ValueError(f"{key} lies past the end of the file")
        if begin == end:  # frombuffer refuses an empty buffer
            tensors[key] = torch.zeros(info["shape"])
            continue
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=_SAFETENSORS_DTYPES[info["dtype"]])
        tensors[key] = flat.reshape(info["shape"]).float()
    return tensors
