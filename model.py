"""
A GPT-style causal decoder in one file, meant to be read top to bottom.

Part I is the plain GPT the lectures build, complete and runnable on its own:
   1. attention           softmax(Q K^T / sqrt(d)) V, written out, returning its weights
   2. causal_mask         which keys each query may see (a window and sinks included)
   3. Head                one attention head with its own W_Q, W_K, W_V
   4. KVCache             preallocated keys and values, so decoding feeds one token at a time
   5. rotary embeddings   q and k turned by an angle that grows with their position
   6. MultiHeadAttention  all heads in one projection, the attention kind picked in attend, W_O
                          (after Dropout: nn.Dropout with its mask drawn fast on the CPU)
   7. MLP, Block          the feed-forward layer and the pre-LayerNorm residual block
   8. GPTConfig           the sizes and options, checked once
   9. sample_next         the next token from the logits: temperature, top-k, top-p
  10. GPT                 embeddings, blocks, tied LM head, loss, the cache picked in make_kv_cache
  11. generation          the cached sampling loop (support/engine.py: streaming, compiled, windows)
  12. for the tools       attention_maps, the fixed-shape decode_step, split_context (a seam)
  13. GPT-2 weights       Hugging Face's GPT-2 files mapped onto this model

Part II holds the lectures' answers to attention's O(T^2), each plugged into Part I at one
named place, MultiHeadAttention.attend or GPT.make_kv_cache:
  14. sliding window      windowed_attention in time linear in T, and Mistral's RollingKVCache
  15. attention sinks     StreamingLLM's StreamingKVCache: the first tokens and a window
  16. linear attention    linear_attention, O(T) with a fixed-size state, and its LinearState

Shapes use B = batch, T = sequence length, C = n_embd, nh = heads, nkv = key/value heads,
hs = head size. Only torch and the standard library are imported at the top; loading GPT-2
imports its file reader (support/loading.py, safetensors) inside from_pretrained.
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
from torch.nn import functional as F

# ==========================================================================================
# Part I: the plain GPT
# ==========================================================================================


# 1. Scaled dot-product attention ----------
def attention(q, k, v, mask=None, dropout_p=0.0):
    """Attention written out, so that its weights can be looked at: softmax(q k^T / sqrt(d)) v
    for q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv) and a bool mask broadcastable to
    (..., Tq, Tk), True where attending is allowed. Returns (out (..., Tq, dv), weights).

    Its twin, MultiHeadAttention.fused (F.scaled_dot_product_attention), trains by default.
    With fused=False (train.py --fused=False) every forward, any cache, window or sinks
    included, runs this function and causal_mask() as written: edit them and train."""
    d = q.size(-1)
    # dividing by sqrt(d) keeps the scores' variance near 1 whatever the head size,
    # so the softmax does not saturate into a one-hot as d grows
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., Tq, Tk)
    if mask is not None:
        # -inf, not a large negative number: exp(-inf) is exactly 0, so a masked
        # key receives exactly zero weight
        scores = scores.masked_fill(~mask, float("-inf"))
    # the softmax runs in float32 so that bf16/fp16 weights still sum to 1
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (..., Tq, Tk)
    # dropout on the weights while training, as the fused kernel's dropout_p does
    out = F.dropout(weights, dropout_p) @ v  # (..., Tq, dv)
    return out, weights


# 2. The causal mask ----------
def visible(i, j, window=None, sinks=0):
    """The masking rule, for broadcastable positions i of queries and j of keys: a query
    sees the keys at or before it; with a window W only the last W of them (itself
    included), except the first `sinks` positions, which stay visible to all."""
    causal = j <= i
    if window is None:
        return causal
    in_window = j > i - window
    sink = j < sinks
    return causal & (in_window | sink)


def causal_mask(t_q, t_k, window=None, sinks=0, device=None):
    """Bool (t_q, t_k), True where query i may attend to key j. The queries are the last
    t_q of the t_k positions: causal_mask(T, T) is the lower triangle, causal_mask(1, T)
    lets the newest token (the KV-cache case) see all keys. A window W keeps exactly W
    keys counting the query itself (FlashAttention's window_size=(W, 0) sees W + 1)."""
    i = torch.arange(t_k - t_q, t_k, device=device)[:, None]  # (t_q, 1) the queries' positions
    j = torch.arange(t_k, device=device)  # (t_k,) the keys' positions
    return visible(i, j, window, sinks)  # (t_q, t_k)


# 3. One attention head ----------
class Head(nn.Module):
    """One causal attention head, the unit the lectures draw: MultiHeadAttention computes
    n_head of these at once, and the tests check that it does exactly that."""

    def __init__(self, n_embd, head_size, bias=True):
        super().__init__()
        self.query = nn.Linear(n_embd, head_size, bias=bias)  # W_Q
        self.key = nn.Linear(n_embd, head_size, bias=bias)  # W_K
        self.value = nn.Linear(n_embd, head_size, bias=bias)  # W_V

    def forward(self, x):
        T = x.size(1)
        q = self.query(x)  # (B, T, hs)
        k = self.key(x)  # (B, T, hs)
        v = self.value(x)  # (B, T, hs)
        out, weights = attention(q, k, v, causal_mask(T, T, device=x.device))
        return out, weights  # (B, T, hs), (B, T, T)


# 4. The KV cache ----------
class KVCache:
    """Keys and values of every layer for the positions seen so far, so that each new token
    computes only its own and attends to the stored ones.

    Allocated once at full length, (B, nkv, length, hs) per layer, and written in place:
    decoding never grows a tensor with torch.cat. `pos` counts the filled positions; `at` is
    the same count on the device, for the fixed-shape decode step (GPT.decode_step)."""

    # whether the cache turns its keys by rotary itself, when they are read (section 15's does)
    rotates_keys = False
    # the newest position's token embedding, (B, 1, C), for token shift (GPT.make_kv_cache)
    last_embedding = None

    def __init__(
        self, n_layer, batch_size, n_kv_head, length, head_size, device=None, dtype=None, zero=False
    ):
        shape = (batch_size, n_kv_head, length, head_size)
        # empty by default: positions past pos are never read. The decode step reads the
        # whole buffer with the unwritten part masked, which needs zeros: 0 * NaN is NaN
        alloc = torch.empty
        if zero:
            alloc = torch.zeros
        # one tensor per layer: a compiled step writing into a slice of a shared one copies it all
        self.k = [alloc(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [alloc(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        # the newest position's keys and values before KV shifting (MultiHeadAttention.shift)
        last = (batch_size, 2 * n_kv_head, 1, head_size)
        self.last = [torch.zeros(last, device=device, dtype=dtype) for _ in range(n_layer)]
        self.block_size = length
        self.pos = 0
        # advanced in place: a fresh tensor per token would be a host-to-device copy
        self.at = torch.zeros(1, dtype=torch.long, device=device)

    def fits(self, T):
        """Whether T more positions fit."""
        return self.pos + T <= self.block_size

    def positions(self, T):
        """The positions (T,) of the next T tokens, for their position embeddings."""
        return torch.arange(self.pos, self.pos + T, device=self.at.device)

    def update(self, layer, k, v, at=None):
        """Write one layer's new keys and values k, v (B, nkv, T, hs) at the next positions.
        Returns what the T queries see: the keys and values so far (B, nkv, pos + T, hs) and
        their mask (None: the plain causal one). With `at` (the decode step), see update_at."""
        if at is not None:
            return self.update_at(layer, k, v, at)
        T = k.size(2)
        end = self.pos + T
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        keys = self.k[layer][:, :, :end]  # (B, nkv, end, hs)
        values = self.v[layer][:, :, :end]  # (B, nkv, end, hs)
        # a single query sees every key, and T new queries over T keys are the plain causal
        # case; a chunk after cached positions needs its queries aligned to the last keys
        mask = None
        if 1 < T < end:
            mask = causal_mask(T, end, device=k.device)  # (T, end)
        return keys, values, mask

    def update_at(self, layer, k, v, at):
        """The fixed-shape version for one token (T = 1) at position `at` (a 1-element
        tensor): written there, then the whole buffer returned, with the positions past
        `at` masked, so that every step has the same shapes and compiles once."""
        self.k[layer][:, :, at] = k
        self.v[layer][:, :, at] = v
        written = torch.arange(self.block_size, device=at.device) <= at  # True at 0 .. at
        return self.k[layer], self.v[layer], written[None]  # (1, block_size) mask

    def advance(self, n):
        """Count n more positions, once every layer has written them."""
        self.pos += n
        self.at += n

    def reset(self):
        """Start again at position 0; stale entries past pos are never read."""
        self.pos = 0
        self.at.zero_()
        for last in self.last:
            last.zero_()
        if self.last_embedding is not None:
            self.last_embedding.zero_()

    @property
    def nbytes(self):
        return sum(t.nbytes for t in self.k + self.v)


# 5. Rotary position embeddings (GPTConfig.rope) ----------
def rotary_tables(head_size, pos, base=10000.0):
    """cos and sin (T, hs/2) of each channel pair's angle at positions pos (T,). They are
    computed for any positions, so no table of learned positions caps the length."""
    # pair k turns by base^(-2k / hs) per position: fast pairs resolve near tokens, slow ones far
    exponents = torch.arange(0, head_size, 2, device=pos.device).float() / head_size
    inv_freq = 1.0 / base**exponents  # (hs/2,)
    angles = torch.outer(pos.float(), inv_freq)  # (T, hs/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """x (B, nh, T, hs) with each channel pair (x1, x2) turned by its angle at x's position:
    a query and a key turned this way have a dot product that depends only on the distance
    between their positions."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, nh, T, hs/2) each
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, nh, T, hs)


# 6. Multi-head attention, its QK-norm, and the dropout it and the MLP apply ----------
class Dropout(nn.Dropout):
    """nn.Dropout with its mask drawn from random bits on the CPU, where torch's bernoulli_
    draws one number per element on one thread unless the CPU is Intel's (then MKL): on an
    AMD EPYC, 6 of dropout's 10 ms on a (32, 256, 128) tensor. p is rounded to 1/65536."""

    def forward(self, x):
        if not self.training or self.p == 0 or x.device.type != "cpu":
            return super().forward(x)
        # one 64-bit random word makes the masks of four elements, 16 bits each
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
        bits = words.view(torch.int16)[: x.numel()].view(x.shape)  # uniform in [-2^15, 2^15)
        dropped = round(self.p * 65536)  # values of the 65536 that drop an element
        keep = bits >= dropped - 32768
        return x * keep.to(x.dtype).mul_(65536 / (65536 - dropped))


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm with its gain in its input's dtype, as autocast casts a Linear's weight:
    bfloat16 queries against a float32 gain make torch.rms_norm warn and leave its fused path."""

    def forward(self, x):
        gain = self.weight
        if gain is not None:
            gain = gain.to(x.dtype)
        return F.rms_norm(x, self.normalized_shape, gain, self.eps)


class MultiHeadAttention(nn.Module):
    """n_head causal heads computed together, then mixed by W_O. One Linear (c_attn) holds
    every head's W_Q, W_K, W_V side by side: the same as n_head Heads, concatenated, then W_O.
    With n_kv_head < n_head (grouped-query attention) each key/value head serves n_head /
    n_kv_head query heads, which shrinks the KV cache."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        kv_width = self.n_kv_head * self.head_size
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # W_O
        self.qk_norm = config.qk_norm
        # queries and keys of RMS 1 cap a logit at sqrt(head_size), 5.7 for 32; qk_gain
        # learns a gain per dimension after the norm (OLMo 2, Qwen3) to lift that cap
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_size, elementwise_affine=config.qk_gain)
            self.k_norm = RMSNorm(self.head_size, elementwise_affine=config.qk_gain)
        # KV shifting (Xu et al. 2024, arXiv 2411.19574): per key/value head, the key is
        # a1 k_i + a2 k_{i-1}, the value b1 v_i + b2 v_{i-1}, from (1, 0), the plain model
        # (Olsson et al. 2022's smeared keys: keys alone, a1 + a2 = 1). 1-D: AdamW's, not Muon's
        self.kv_shift = config.kv_shift
        if config.kv_shift:
            self.shift_now = nn.Parameter(torch.ones(2 * self.n_kv_head))  # a1 ..., b1 ...
            self.shift_prev = nn.Parameter(torch.zeros(2 * self.n_kv_head))  # a2 ..., b2 ...
        self.attention = config.attention
        self.window = config.sliding_window
        self.sinks = config.sink_tokens
        self.attn_dropout = config.dropout if config.attn_dropout is None else config.attn_dropout
        self.resid_dropout = Dropout(config.dropout)
        # False: attention() itself on every path (section 1), slower: the same function,
        # equal in float32 to rounding, while in bfloat16 they round apart and runs drift
        self.use_fused = config.fused
        # the fused kernel: a seam, GPT.split_context puts ring attention here
        self.sdpa = F.scaled_dot_product_attention
        # a list while GPT.attention_maps records: each forward appends its weights
        self.maps = None

    def forward(self, x, kv_cache=None, layer=0, rotary=None, at=None, mask=None):
        """x (B, T, C) -> y (B, T, C). kv_cache: the cache this layer (number `layer`) reads
        and writes; rotary: the (cos, sin) tables at the tokens' positions; at: the decode
        step's position (GPT.decode_step); mask: without a cache, which keys each query may
        see, bool broadcastable to (B, nh, T, T), in place of the causal mask (None). All
        True is BERT's bidirectional self-attention: the same module, a different mask."""
        B, T, C = x.size()
        hs = self.head_size
        # project: every head's query, key and value in one matmul
        q, k, v = self.c_attn(x).split([C, self.n_kv_head * hs, self.n_kv_head * hs], dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)  # (B, nkv, T, hs)
        # shift: each key and value mixed with the previous position's
        if self.kv_shift:
            k, v = self.shift(k, v, kv_cache, layer)
        # normalise: bounded attention logits let fast recipes use large learning rates
        if self.qk_norm:
            q = self.q_norm(q)
            k = self.k_norm(k)
        # rotate: a cache that turns its keys itself when they are read (StreamingLLM's,
        # section 15) stores them unturned
        if rotary is not None:
            cos, sin = rotary
            q = apply_rotary(q, cos, sin)
            if kv_cache is None or not kv_cache.rotates_keys:
                k = apply_rotary(k, cos, sin)
        # cache: the new keys and values join the stored ones; the queries see all of them
        if kv_cache is not None:
            k, v, mask = kv_cache.update(layer, k, v, at)
        y = self.attend(q, k, v, mask, kv_cache, layer, at)  # (B, nh, T, hs)
        # merge the heads: side by side again
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        # W_O
        return self.resid_dropout(self.c_proj(y))

    def shift(self, k, v, kv_cache, layer):
        """k and v (B, nkv, T, hs) mixed with those one position earlier: before the first,
        the cache's newest (zeros at 0); the cache keeps this call's newest for the next."""
        kv = torch.cat([k, v], dim=1)  # (B, 2 nkv, T, hs)
        before = torch.zeros_like(kv[:, :, :1])  # (B, 2 nkv, 1, hs)
        if kv_cache is not None:
            before = kv_cache.last[layer].clone().to(kv.dtype)
            kv_cache.last[layer].copy_(kv[:, :, -1:])
        previous = torch.cat([before, kv[:, :, :-1]], dim=2)  # (B, 2 nkv, T, hs)
        now = self.shift_now.to(kv.dtype)[:, None, None]  # (2 nkv, 1, 1)
        prev = self.shift_prev.to(kv.dtype)[:, None, None]  # (2 nkv, 1, 1)
        kv = now * kv + prev * previous
        return kv.split(self.n_kv_head, dim=1)  # (B, nkv, T, hs) each

    def attend(self, q, k, v, mask, kv_cache, layer, at):
        """The one place that picks which attention computes y (B, nh, T, hs), for
        q (B, nh, T, hs) and k, v (B, nkv, Tk, hs).

        Part II's kinds are named here and defined below it: Python looks a name up when
        the line runs, so a plain model never needs them (and runs with Part II cut off)."""
        if self.attention == "linear":
            return linear_attend(q, k, v, kv_cache, layer, self.maps)
        # attention() as written when asked, and for the weights; in the decode step one
        # query's row is small, and compiled it beats the fused kernel with a mask
        if not self.use_fused or self.maps is not None or at is not None:
            return self.explicit(q, k, v, mask)
        # a window over the whole sequence, with no (T, T) mask: time linear in T
        if self.window is not None and mask is None and q.size(2) == k.size(2):
            return windowed_attention(q, k, v, self.window, self.sinks, self.dropout_p)
        return self.fused(q, k, v, mask)

    @property
    def dropout_p(self):
        """The attention dropout: while training only, as nn.Dropout does."""
        if self.training:
            return self.attn_dropout
        return 0.0

    def explicit(self, q, k, v, mask):
        """attention() itself; its weights (B, nh, T, Tk) are kept when they are recorded."""
        T = q.size(2)
        Tk = k.size(2)
        k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)  # (B, nh, Tk, hs)
        v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)  # (B, nh, Tk, hs)
        if mask is None:
            mask = causal_mask(T, Tk, self.window, self.sinks, q.device)  # (T, Tk)
        y, weights = attention(q, k, v, mask, self.dropout_p)
        if self.maps is not None:
            self.maps.append(weights)
        return y

    def fused(self, q, k, v, mask):
        """The same result in PyTorch's fused kernel (or the ring, under context parallelism),
        never materialising the (T, Tk) weights."""
        # is_causal aligns the queries to the first keys, so a chunk appended to a cache
        # (T < Tk) comes with its mask instead
        is_causal = mask is None and q.size(2) == k.size(2)
        grouped = self.n_kv_head != self.n_head
        return self.sdpa(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=is_causal,
            dropout_p=self.dropout_p,
            enable_gqa=grouped,
        )


# 7. The feed-forward layer and the transformer block ----------
class MLP(nn.Module):
    """The position-wise feed-forward layer: each token alone, widened 4x, then back."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.activation = config.activation
        self.dropout = Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)  # (B, T, 4 C)
        if self.activation == "relu2":
            x = F.relu(x)
            # ReLU squared; x * x has a cheaper backward than square() on CPU
            x = x * x
        else:
            x = F.gelu(x, approximate="tanh")  # GPT-2's own GELU approximation
        return self.dropout(self.c_proj(x))  # (B, T, C)


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = MultiHeadAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None, layer=0, rotary=None, at=None, mask=None):
        x = x + self.attn(self.ln_1(x), kv_cache, layer, rotary, at, mask)
        x = x + self.mlp(self.ln_2(x))
        return x


# 8. The configuration ----------
@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64, for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    attn_dropout: float | None = None  # on the attention weights; None: dropout's (nanoGPT)
    bias: bool = True  # biases in Linear and LayerNorm, as in GPT-2
    n_kv_head: int | None = None  # None: n_head (plain multi-head attention)
    # options for fast training runs; the defaults are GPT-2's own architecture
    rope: bool = False  # rotary embeddings instead of learned positions
    qk_norm: bool = False  # RMS-normalise queries and keys per head
    qk_gain: bool = False  # and a learned gain per dimension after that norm
    kv_shift: bool = False  # each key and value mixed with the previous one's (KV shifting)
    token_shift: bool = False  # each token's embedding plus a gain times the previous one's
    activation: str = "gelu"  # "gelu" (tanh approximation) or "relu2"
    attention: str = "softmax"  # or "linear": linear_attention, O(T) and a fixed-size state
    sliding_window: int | None = None  # each query sees its last W positions (itself included)
    sink_tokens: int = 0  # and the first S positions, whatever the window (needs sliding_window)
    # softmax attention in F.scaled_dot_product_attention's fused kernel; False: in attention()
    # and causal_mask() as written in section 1 and 2, so that an edit there trains
    fused: bool = True

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
            raise ValueError(
                f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head})"
            )
        if self.rope and (self.n_embd // self.n_head) % 2:
            raise ValueError("rope needs an even head size (n_embd / n_head)")
        if self.qk_gain and not self.qk_norm:
            raise ValueError("qk_gain is the gain after QK-norm: set qk_norm=True too")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for name, kinds in (
            ("activation", ("gelu", "relu2")),
            ("attention", ("softmax", "linear")),
        ):
            value = getattr(self, name)
            if value not in kinds:
                raise ValueError(f"{name} must be {' or '.join(map(repr, kinds))}, got {value!r}")
        self.check_window()
        # the longest sequence: rope with a window, or linear attention, has no end
        self.context = self.block_size
        if self.rope and (self.attention == "linear" or self.sliding_window):
            self.context = math.inf

    def check_window(self):
        w = self.sliding_window
        s = self.sink_tokens
        if w is not None and (type(w) is not int or w < 1):
            raise ValueError(f"sliding_window must be a whole number >= 1 (or None), got {w!r}")
        if type(s) is not int or s < 0:
            raise ValueError(f"sink_tokens must be a whole number >= 0, got {s!r}")
        if s and w is None:
            # the sinks are what a query sees besides its window: no window, nothing to add to
            raise ValueError(
                f"sink_tokens={s} needs a sliding_window: give one too, or leave the sinks out"
            )


# 9. Sampling the next token ----------
def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None, redraw=("mps",)):
    """Pick the next token (B, 1) from the last position's logits (B, vocab). On the device
    types in redraw, whose multinomial can return a token of probability 0 (MPS: pytorch
    #192577), such a draw is drawn again."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float()
    # the best logit at 0 (softmax is the same) and a temperature float32 can hold: near 0
    # the others go to -inf and the best stays (greedy), where logits / 1e-300 gave nan
    temperature = max(temperature, torch.finfo(torch.float32).tiny)
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # nucleus: keep the fewest most likely tokens whose probability reaches top_p
        probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # (B, vocab), most likely first
        # the most likely token stays whatever top_p: one below float32's least is 0 here
        drop[:, 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, vocab)
    idx = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
    while probs.device.type in redraw and (probs.gather(-1, idx) == 0).any():
        idx = torch.multinomial(probs, num_samples=1, generator=generator)
    return idx


# 10. The GPT model ----------
class GPT(nn.Module):
    """GPT-2's decoder: token (and position) embeddings, n_layer Blocks, a final LayerNorm
    and an LM head that shares its matrix with the token embedding."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),  # token embedding
                drop=Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        # rope computes its angles at the positions, for any length: no position table
        if not config.rope:
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: reading a token in and writing it out share one matrix
        self.lm_head.weight = self.transformer.wte.weight
        # token shift (RWKV's time shift, here a learned gain per channel; modded-nanogpt's
        # smear gate computes its gain from the token): x_t + g * x_{t-1}, the token embeddings
        # before the position's is added, g from 0, the plain model. 1-D: AdamW's, not Muon's
        if config.token_shift:
            self.shift_gain = nn.Parameter(torch.zeros(config.n_embd))
        # a seam: None, or what split_context plugs in to split each sequence over processes
        self.context_parallel = None

        self.apply(self._init_weights)
        # GPT-2: each block adds two residual projections to the stream, so their
        # init is scaled down to keep the stream's variance from growing with depth
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=False):
        """Parameters, the tied LM head counted once; non_embedding: less the position embedding."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def make_kv_cache(self, batch_size, dtype=None, zero=False, window=None, sinks=0):
        """The cache to decode through, on the model's device: a plain KVCache of block_size
        positions (zero: zeroed, for the decode step), or the one place where Part II's
        caches plug in: a LinearState for linear attention, a rolling buffer for a window
        (the model's own, or StreamingLLM's `window` and `sinks`: window_cache)."""
        c = self.config
        device = self.transformer.wte.weight.device
        if dtype is None:
            dtype = self.transformer.wte.weight.dtype
        hs = c.n_embd // c.n_head
        if c.attention == "linear":
            cache = LinearState(
                c.n_layer, batch_size, c.n_head, c.n_kv_head, hs, c.context, device, dtype
            )
        elif window is not None or sinks or c.sliding_window is not None:
            cache = window_cache(c, batch_size, window, sinks, device, dtype)
        else:
            cache = KVCache(
                c.n_layer, batch_size, c.n_kv_head, c.block_size, hs, device, dtype, zero
            )
        if c.token_shift:
            # what token shift reads before a call's first token: the newest embedding
            cache.last_embedding = torch.zeros(batch_size, 1, c.n_embd, device=device, dtype=dtype)
        return cache

    def check_whole(self):
        """Attention maps and a KV cache need each sequence whole, in one process."""
        if self.context_parallel is not None:
            raise ValueError(
                "a model split by context parallelism returns no attention maps and keeps "
                "no KV cache; load the checkpoint in one process for that"
            )

    def positions(self, idx, kv_cache=None):
        """The positions (T,) of idx's T tokens: 0 .. T - 1, after the cached ones, or with
        context parallelism their places in the whole sequence."""
        T = idx.size(1)
        if T > self.config.context:
            raise ValueError(
                f"sequence of length {T} is longer than block_size {self.config.block_size}"
            )
        if kv_cache is not None:
            self.check_whole()
            if not kv_cache.fits(T):
                raise ValueError(
                    f"KV cache overflow: {kv_cache.pos} positions cached + {T} new > "
                    f"block_size {kv_cache.block_size}; reset the cache or slide the window"
                )
            return kv_cache.positions(T)
        if self.context_parallel is not None:
            return self.context_parallel.positions(T, idx.device)
        return torch.arange(T, device=idx.device)

    def embed(self, idx, pos, kv_cache=None):
        """Token embeddings (B, T, C) of idx at positions pos (T,), token-shifted with the
        cache's newest before the first: plus the learned position embeddings, or with rope,
        returned with the rotary tables at pos."""
        x = self.transformer.wte(idx)  # (B, T, C)
        if self.config.token_shift:
            x = self.token_shift(x, kv_cache)
        if self.config.rope:
            rotary = rotary_tables(self.config.n_embd // self.config.n_head, pos)  # (T, hs/2) each
            return x, rotary
        x = x + self.transformer.wpe(pos)  # (T, C) broadcast over B
        return x, None

    def token_shift(self, x, kv_cache=None):
        """x (B, T, C) plus shift_gain times the embedding one position earlier: before the
        first, the cache's newest (zeros at 0); the cache keeps this call's newest."""
        before = torch.zeros_like(x[:, :1])  # (B, 1, C)
        if kv_cache is not None:
            before = kv_cache.last_embedding.clone().to(x.dtype)
            kv_cache.last_embedding.copy_(x[:, -1:])
        previous = torch.cat([before, x[:, :-1]], dim=1)  # (B, T, C)
        return x + self.shift_gain.to(x.dtype) * previous

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """idx (B, T) token ids -> (logits (B, T, vocab), loss or None). kv_cache (a KVCache,
        or a LinearState): attend over its positions plus idx, add idx's to it, advance it.
        last_only: the last position's logits alone (what generation needs)."""
        x, rotary = self.embed(idx, self.positions(idx, kv_cache), kv_cache)
        x = self.transformer.drop(x)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, kv_cache, layer, rotary)
        if kv_cache is not None:
            kv_cache.advance(idx.size(1))
        x = self.transformer.ln_f(x)

        if targets is not None:
            logits = self.lm_head(x)  # (B, T, vocab)
            # the loss in float32 whatever the weights, for an accurate log-softmax
            flat_logits = logits.view(-1, logits.size(-1)).float()  # (B T, vocab)
            loss = F.cross_entropy(flat_logits, targets.reshape(-1), ignore_index=-1)
            return logits, loss
        if last_only:
            x = x[:, -1:]
        return self.lm_head(x), None  # (B, T or 1, vocab), no loss

    # 11. Generation ----------
    def context_start(self, length, start):
        """Where the window of a `length`-token sequence begins for the next token, given
        that it began at `start`. Positions stop at block_size (rope with a window or linear
        attention: no end), so a full window slides: the oldest quarter is dropped, the cache
        rebuilt from the rest once every block_size / 4."""
        bs = self.config.context
        if length - start <= bs:
            return start
        return length - max(1, bs - bs // 4)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        """idx (B, T) with max_new_tokens sampled tokens appended; temperature=0 is greedy.
        The prompt's last block_size tokens fill the KV cache in one forward, then each new
        token alone goes through. support/engine.py has the same loop with every option:
        streaming, top-p, no cache, the compiled step, StreamingLLM's window."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        cache = self.make_kv_cache(idx.size(0))
        start = max(0, idx.size(1) - self.config.context)
        tokens = idx[:, start:]
        for _ in range(max_new_tokens):
            logits, _ = self(tokens, kv_cache=cache, last_only=True)  # (B, 1, vocab)
            tokens = sample_next(logits[:, -1], temperature, top_k, generator=generator)
            idx = torch.cat((idx, tokens), dim=1)
            new_start = self.context_start(idx.size(1), start)
            if new_start != start:
                # the window slides: the cache is rebuilt from what is left of it
                start = new_start
                cache.reset()
                tokens = idx[:, start:]
        return idx

    # 12. For the tools: looking inside, the compiled step, context parallelism ----------
    def attention_maps(self, idx, kv_cache=None):
        """forward(idx, kv_cache=kv_cache) with every layer's attention written out, for
        looking at: (logits (B, T, vocab), one (B, n_head, T, Tk) weight tensor per layer)."""
        self.check_whole()
        maps = []
        for block in self.transformer.h:
            block.attn.maps = maps
        try:
            logits, _ = self(idx, kv_cache=kv_cache)
        finally:
            for block in self.transformer.h:
                block.attn.maps = None
        return logits, maps

    def decode_step(self, idx, at, kv_cache):
        """Logits (B, vocab) of one new token per sequence, idx (B, 1), at position `at` (a
        1-element long tensor), through a zeroed cache read whole with the positions past `at`
        masked: fixed shapes, so that support/engine.py compiles it once (a CUDA graph on
        CUDA). The caller advances the cache."""
        x, rotary = self.embed(idx, at, kv_cache)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, kv_cache, layer, rotary, at)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)[:, -1]  # (B, vocab)

    def split_context(self, context_parallel):
        """The seam for context parallelism (support/context_parallel.py): each process holds
        part of every sequence. context_parallel.positions(T, device) gives its T tokens'
        places in the whole sequence, and its sdpa (F.scaled_dot_product_attention's
        signature) attends over the whole sequence in every layer."""
        if not self.config.fused:
            raise ValueError(
                "context parallelism attends through the fused kernel's ring; use fused=True"
            )
        self.context_parallel = context_parallel
        for block in self.transformer.h:
            block.attn.sdpa = context_parallel.sdpa
        return self

    # 13. GPT-2 weights in Hugging Face format ----------
    @classmethod
    def from_pretrained(cls, path_or_name, **overrides):
        """GPT-2 from a Hugging Face folder, or by name ('gpt2', 'gpt2-medium', ...) through
        huggingface_hub. overrides: GPTConfig fields to change, e.g. dropout or a smaller
        block_size. A bad file, or attention='linear', is a one-line ValueError."""
        if overrides.get("attention", "softmax") != "softmax":
            raise ValueError(
                "GPT-2's weights need softmax attention; train a linear model from scratch"
            )
        # safetensors, or a weights_only torch.load
        from support.loading import read_gpt2_files

        hf, state = read_gpt2_files(path_or_name)
        if hf["activation_function"] not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(
                f"unsupported activation {hf['activation_function']!r} in {path_or_name}"
            )
        block_size = overrides.pop("block_size", hf["n_positions"])
        if block_size > hf["n_positions"]:
            raise ValueError(
                f"block_size {block_size} is larger than the pretrained model's {hf['n_positions']}"
            )
        # GPTConfig's defaults are GPT-2's
        sizes = {key: hf[key] for key in ("vocab_size", "n_layer", "n_head", "n_embd")}
        model = cls(GPTConfig(**(sizes | overrides), block_size=block_size))

        sd = {}
        for key, tensor in state.items():
            key = key.removeprefix("transformer.")
            # causal-mask buffers, and the LM head tied to wte
            if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
                continue
            # Hugging Face's GPT-2 stores these as Conv1D, (in, out):
            # transpose to Linear's (out, in)
            if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                tensor = tensor.t()
            sd["transformer." + key] = tensor.float()
        sd["transformer.wpe.weight"] = sd["transformer.wpe.weight"][:block_size]
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
        model.load_state_dict(sd, strict=True)
        return model


# ==========================================================================================
# Part II: the lectures' answers to O(T^2), each plugged into Part I at one named place
# ==========================================================================================


# 14. Sliding-window attention (GPTConfig.sliding_window) ----------
def windowed_attention(q, k, v, window, sinks=0, dropout_p=0.0, block=128):
    """causal_mask(T, T, window, sinks) applied in time linear in T, with no (T, T) mask.
    The queries go in blocks of c; a block sees its own keys and those of the n blocks
    before it, through a (c, (n + 1) c) mask, plus one column per sink."""
    B, nh, T, hs = q.shape
    # grouped-query heads: each key/value head serves nh / nkv query heads
    k = k.repeat_interleave(nh // k.size(1), dim=1)  # (B, nh, T, hs)
    v = v.repeat_interleave(nh // v.size(1), dim=1)  # (B, nh, T, hs)
    c = min(window, block, T)  # queries per block
    # integer ceilings, which stay integers when torch.compile traces the sizes
    n = (window - 1 + c - 1) // c  # the blocks a query reaches back: ceil((W - 1) / c)
    nb = (T + c - 1) // c  # the query blocks: ceil(T / c)
    q_blocks = F.pad(q, (0, 0, 0, nb * c - T)).view(B, nh, nb, c, hs)
    # block b's keys are those of blocks b - n .. b, zeros before the start: n + 1 shifted
    # slices side by side. (Tensor.unfold gives the same windows, but PyTorch 2.13's
    # torch.compile of its backward, in bfloat16 on a CPU, corrupts the heap.)
    k_padded = F.pad(k, (0, 0, n * c, nb * c - T))
    v_padded = F.pad(v, (0, 0, n * c, nb * c - T))
    k_shifted = [k_padded[:, :, s * c : (s + nb) * c].view(B, nh, nb, c, hs) for s in range(n + 1)]
    v_shifted = [v_padded[:, :, s * c : (s + nb) * c].view(B, nh, nb, c, hs) for s in range(n + 1)]
    k_blocks = torch.cat(k_shifted, dim=3)  # (B, nh, nb, (n + 1) c, hs)
    v_blocks = torch.cat(v_shifted, dim=3)  # (B, nh, nb, (n + 1) c, hs)
    i = torch.arange(nb * c, device=q.device).view(nb, c, 1)  # the queries' positions
    j = i[:, :1] - n * c + torch.arange((n + 1) * c, device=q.device)  # (nb, 1, (n + 1) c) keys'
    mask = visible(i, j, window) & (j >= 0)  # (nb, c, (n + 1) c)
    if sinks:
        # each sink once, in columns of its own, visible where the window does not cover it
        k_sinks = k[:, :, None, :sinks].expand(B, nh, nb, -1, hs)  # (B, nh, nb, S, hs)
        v_sinks = v[:, :, None, :sinks].expand(B, nh, nb, -1, hs)  # (B, nh, nb, S, hs)
        k_blocks = torch.cat([k_sinks, k_blocks], dim=3)
        v_blocks = torch.cat([v_sinks, v_blocks], dim=3)
        sink_mask = torch.arange(min(sinks, T), device=q.device) <= i - window  # (nb, c, S)
        mask = torch.cat([sink_mask, mask], dim=-1)
    # the fused kernel takes 4-D inputs with unit-stride rows and a 4-D mask; given anything
    # else, PyTorch falls back to explicit math, about 2x slower
    q_blocks = q_blocks.reshape(B * nh, nb, c, hs)
    k_blocks = k_blocks.reshape(B * nh, nb, -1, hs)  # (B nh, nb, keys per block, hs)
    v_blocks = v_blocks.reshape(B * nh, nb, -1, hs)
    y = F.scaled_dot_product_attention(
        q_blocks, k_blocks, v_blocks, attn_mask=mask[None], dropout_p=dropout_p
    )  # (B nh, nb, c, hs)
    return y.view(B, nh, nb * c, hs)[:, :, :T]  # (B, nh, T, hs)


class RollingKVCache(KVCache):
    """Mistral's rolling buffer, for a window of W (and S sinks): S + W slots whatever the
    length. Position p is kept in slot p while p < S, else in slot S + (p - S) mod W, where
    it replaces position p - W, which has just left every later query's window."""

    def __init__(
        self, n_layer, batch_size, n_kv_head, head_size, window, sinks=0, device=None, dtype=None
    ):
        # zeroed: a chunk reads every slot, the empty ones masked (0 * NaN is NaN)
        super().__init__(
            n_layer, batch_size, n_kv_head, sinks + window, head_size, device, dtype, zero=True
        )
        self.window = window
        self.sinks = sinks
        # the position each slot holds; -1 while it is empty
        self.slot_pos = torch.full((sinks + window,), -1, device=device)

    def fits(self, T):
        return True

    def slot(self, p):
        """The slot of position p (an int)."""
        if p < self.sinks:
            return p
        return self.sinks + (p - self.sinks) % self.window

    def update(self, layer, k, v, at=None):
        keys, values, mask, _ = self.roll(layer, k, v)
        return keys, values, mask

    def roll(self, layer, k, v):
        """update's keys, values and mask, and the position of each key."""
        if k.size(2) == 1:
            return self.roll_one(layer, k, v)
        return self.roll_chunk(layer, k, v)

    def roll_one(self, layer, k, v):
        """One new token: written first, then the filled slots are read in place, with no
        mask, since the key it replaced was the only one out of its window."""
        slot = self.slot(self.pos)
        self.k[layer][:, :, slot] = k[:, :, 0]
        self.v[layer][:, :, slot] = v[:, :, 0]
        self.slot_pos[slot] = self.pos
        # the slots fill in order
        filled = min(self.pos + 1, self.block_size)
        keys = self.k[layer][:, :, :filled]  # (B, nkv, filled, hs)
        values = self.v[layer][:, :, :filled]  # (B, nkv, filled, hs)
        return keys, values, None, self.slot_pos[:filled]

    def roll_chunk(self, layer, k, v):
        """Several new tokens: the slots are read before the chunk is written, because a chunk
        longer than W overwrites its own first keys."""
        T = k.size(2)
        new_pos = torch.arange(self.pos, self.pos + T, device=k.device)  # (T,)
        if self.pos == 0:
            # nothing cached yet: the chunk attends to itself, windowed
            self.write_chunk(layer, k, v, new_pos)
            return k, v, None, new_pos
        keys = torch.cat([self.k[layer], k], dim=2)  # (B, nkv, S + W + T, hs)
        values = torch.cat([self.v[layer], v], dim=2)  # (B, nkv, S + W + T, hs)
        key_pos = torch.cat([self.slot_pos, new_pos])  # (S + W + T,)
        mask = visible(new_pos[:, None], key_pos, self.window, self.sinks) & (key_pos >= 0)
        self.write_chunk(layer, k, v, new_pos)
        return keys, values, mask, key_pos

    def write_chunk(self, layer, k, v, new_pos):
        """Keep what stays of a chunk: the sinks among it and its last W tokens."""
        keep = (new_pos < self.sinks) | (new_pos > new_pos[-1] - self.window)
        kept_pos = new_pos[keep]
        # slot() for each kept position
        wrapped = self.sinks + (kept_pos - self.sinks) % self.window
        slots = torch.where(kept_pos < self.sinks, kept_pos, wrapped)
        self.k[layer][:, :, slots] = k[:, :, keep]
        self.v[layer][:, :, slots] = v[:, :, keep]
        # after the last layer only: every layer reads the positions the slots held before
        if layer == len(self.k) - 1:
            self.slot_pos[slots] = kept_pos

    def reset(self):
        super().reset()
        self.slot_pos.fill_(-1)


# 15. Attention sinks: StreamingLLM ----------
class StreamingKVCache(RollingKVCache):
    """StreamingLLM (Xiao et al. 2023): a model trained without a window generates past
    block_size through a rolling buffer of S sinks and a window of W. Positions count within
    the cache, never past S + W - 1, the longest the model was trained on. So the keys are
    stored unrotated, and rotated at their place in the cache each time they are read."""

    rotates_keys = True

    def lag(self, T):
        """How far the text has run past the cache, with T new tokens."""
        return max(0, self.pos + T - self.block_size)

    def positions(self, T):
        start = self.pos - self.lag(T)
        return torch.arange(start, start + T, device=self.at.device)

    def update(self, layer, k, v, at=None):
        keys, values, mask, key_pos = self.roll(layer, k, v)
        # a sink keeps its position, the window's keys move down by the lag (older keys
        # come out negative, and are masked)
        in_cache = torch.where(key_pos < self.sinks, key_pos, key_pos - self.lag(k.size(2)))
        cos, sin = rotary_tables(k.size(-1), in_cache)
        keys = apply_rotary(keys, cos, sin)
        return keys, values, mask


def window_cache(config, batch_size, window=None, sinks=0, device=None, dtype=None):
    """The rolling cache GPT.make_kv_cache picks: Mistral's for a model trained with a
    window (its own, or `window` and `sinks`), else StreamingLLM's for a rope model."""
    kind = RollingKVCache
    if window is None and not sinks:
        window = config.sliding_window
        sinks = config.sink_tokens
    else:
        # checked as the config's own window and sinks are
        replace(config, sliding_window=window, sink_tokens=sinks)
        if not config.rope or sinks + window > config.block_size:
            raise ValueError(
                f"a cache window needs rope, and window + sinks <= block_size ({config.block_size})"
            )
        if config.sliding_window is None:
            kind = StreamingKVCache
    hs = config.n_embd // config.n_head
    return kind(config.n_layer, batch_size, config.n_kv_head, hs, window, sinks, device, dtype)


# 16. Linear attention (GPTConfig.attention = "linear") ----------
def linear_attention(q, k, v, state=None, return_attention=False, chunk=64):
    """Linear attention (Katharopoulos et al. 2020): exp(q . k) becomes phi(q) . phi(k),
    with phi = elu + 1 > 0, so the sum over the keys runs through a fixed-size state:
    y_i = phi(q_i) S_i / phi(q_i) . z_i, S_i = sum_{j<=i} phi(k_j) v_j^T, z_i = sum_{j<=i} phi(k_j).

    Causal, for q, k (B, nh, T, hs) and v (B, nh, T, hv) after the positions already summed
    in state [S, z] (updated in place). In chunks: the masked quadratic form within a
    chunk, the state between chunks, so O(T). Returns (y (B, nh, T, hv), weights or None)."""
    q = F.elu(q) + 1
    k = F.elu(k) + 1
    if state is None:
        S = q.new_zeros(*q.shape[:-2], q.size(-1), v.size(-1))  # (B, nh, hs, hv)
        z = q.new_zeros(q[..., 0, :].shape)  # (B, nh, hs)
    else:
        S, z = state
    # the weights are those of one chunk: the whole sequence (short, when they are looked at)
    if return_attention:
        chunk = q.size(2)
    ys = []
    for qc, kc, vc in zip(q.split(chunk, 2), k.split(chunk, 2), v.split(chunk, 2)):
        # phi(q_i) . phi(k_j) within the chunk, j <= i
        w = (qc @ kc.transpose(-2, -1)).tril()  # (B, nh, c, c)
        den = qc @ z[..., None] + w.sum(-1, keepdim=True)  # (B, nh, c, 1)
        ys.append((qc @ S + w @ vc) / den)  # (B, nh, c, hv)
        # the chunk joins the state
        S = S + kc.transpose(-2, -1) @ vc
        z = z + kc.sum(2)
    if state is not None:
        state[0].copy_(S)
        state[1].copy_(z)
    y = torch.cat(ys, dim=2)  # (B, nh, T, hv)
    weights = None
    if return_attention:
        weights = w / den  # (B, nh, T, T)
    return y, weights


def linear_attend(q, k, v, kv_cache=None, layer=0, maps=None):
    """MultiHeadAttention.attend's linear kind: linear_attention over the heads, through
    this layer's running state when there is a cache; the weights kept when recorded."""
    group = q.size(1) // k.size(1)
    k = k.repeat_interleave(group, dim=1)  # (B, nh, T, hs)
    v = v.repeat_interleave(group, dim=1)  # (B, nh, T, hs)
    state = None
    if kv_cache is not None:
        state = kv_cache.state[layer]
    y, weights = linear_attention(q, k, v, state, maps is not None)
    if maps is not None:
        maps.append(weights)
    return y


class LinearState:
    """A linear-attention model's cache: per layer the running sums [S (B, nh, hs, hs),
    z (B, nh, hs)], a fixed size however long the text. It has KVCache's interface, so
    generation treats both alike."""

    rotates_keys = False
    last_embedding = None  # as KVCache's, for token shift

    def __init__(
        self, n_layer, batch_size, n_head, n_kv_head, head_size, block_size, device, dtype
    ):
        S = torch.zeros(batch_size, n_head, head_size, head_size, device=device, dtype=dtype)
        z = torch.zeros(batch_size, n_head, head_size, device=device, dtype=dtype)
        self.state = [[S.clone(), z.clone()] for _ in range(n_layer)]
        # as KVCache.last, for KV shifting
        last = (batch_size, 2 * n_kv_head, 1, head_size)
        self.last = [torch.zeros(last, device=device, dtype=dtype) for _ in range(n_layer)]
        self.block_size = block_size
        self.pos = 0

    def fits(self, T):
        return self.pos + T <= self.block_size

    def positions(self, T):
        return torch.arange(self.pos, self.pos + T, device=self.state[0][0].device)

    def update(self, layer, k, v, at=None):
        """The keys and values pass through: linear_attention adds them to the state."""
        return k, v, None

    def advance(self, n):
        self.pos += n

    def reset(self):
        self.pos = 0
        for S, z in self.state:
            S.zero_()
            z.zero_()
        for last in self.last:
            last.zero_()
        if self.last_embedding is not None:
            self.last_embedding.zero_()

    @property
    def nbytes(self):
        return sum(S.nbytes + z.nbytes for S, z in self.state)
