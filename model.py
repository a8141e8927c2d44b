"""
A GPT-style causal decoder in one file, meant to be read top to bottom.

The ideas appear in the order they are built:
  1. attention      softmax(Q K^T / sqrt(d)) V, written out, returning its weights; linear_attention
  2. causal_mask    which keys each query may see; future scores become -inf
  3. Head           one attention head with its own W_Q, W_K, W_V
  4. KVCache        preallocated keys and values, so decoding feeds one token at a time; LinearState
  5. MultiHeadAttention  all heads in one projection, plus W_O
  6. MLP, Block     the feed-forward layer and the pre-LayerNorm residual block
  7. GPT            embeddings, blocks, tied LM head, loss, a fixed-shape decode step
  8. generation     the cached sampling loop, and the same loop with a compiled step
  9. GPT-2 weights  Hugging Face's GPT-2 files mapped onto this model

Shapes use B = batch, T = sequence length, C = n_embd, nh = heads, hs = head size.
Only torch and the standard library are imported at the top; loading GPT-2
imports its file reader (checkpoint.py, safetensors) inside from_pretrained.
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
from torch.nn import functional as F


# 1. Scaled dot-product attention ----------
def attention(q, k, v, mask=None):
    """Explicit attention: softmax(q k^T / sqrt(d)) v, for q (..., Tq, d),
    k (..., Tk, d), v (..., Tk, dv) and a bool mask broadcastable to (..., Tq, Tk),
    True where attending is allowed. Returns (out (..., Tq, dv), weights (..., Tq, Tk))."""
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


def linear_attention(q, k, v, state=None, return_attention=False, chunk=64):
    """Linear attention (Katharopoulos et al. 2020), GPTConfig.attention = "linear": exp(q.k)
    becomes phi(q).phi(k), phi = elu + 1 > 0, and the sum over keys runs through a fixed-size state:
    y_i = phi(q_i) S_i / phi(q_i).z_i, S_i = sum_{j<=i} phi(k_j) v_j^T, z_i = sum_{j<=i} phi(k_j).
    Causal, for q, k (B, nh, T, hs), v (B, nh, T, hv) after the positions in state [S, z] (updated
    in place). Chunked: the masked quadratic form within a chunk, the state between, so O(T)."""
    q, k = F.elu(q) + 1, F.elu(k) + 1
    S, z = state or (
        q.new_zeros(*q.shape[:-2], q.size(-1), v.size(-1)),
        q.new_zeros(q[..., 0, :].shape),
    )
    ys, chunk = (
        [],
        q.size(2) if return_attention else chunk,
    )  # the weights: of one chunk, at short T
    for qc, kc, vc in zip(q.split(chunk, 2), k.split(chunk, 2), v.split(chunk, 2)):
        w = (
            qc @ kc.transpose(-2, -1)
        ).tril()  # (B, nh, c, c): phi(q_i) . phi(k_j) within the chunk, j <= i
        den = qc @ z[..., None] + w.sum(-1, keepdim=True)  # (B, nh, c, 1)
        ys.append((qc @ S + w @ vc) / den)
        S, z = S + kc.transpose(-2, -1) @ vc, z + kc.sum(2)  # the chunk joins the state
    if state:
        state[0].copy_(S), state[1].copy_(z)
    return torch.cat(ys, dim=2), (
        w / den if return_attention else None
    )  # (B, nh, T, hv), (B, nh, T, T)


# 2. The causal mask ----------
def causal_mask(t_q, t_k, window=None, sinks=0, device=None):
    """Bool (t_q, t_k): True where query i may attend to key j. The queries are
    the last t_q of the t_k positions: causal_mask(T, T) is the lower triangle,
    causal_mask(1, T) lets the newest token (the KV-cache case) see all keys.
    A window W keeps i - W < j: exactly W keys counting itself (FlashAttention's
    window_size=(W, 0) sees W + 1); the first `sinks` positions stay visible to all."""
    i = torch.arange(t_k - t_q, t_k, device=device)[:, None]  # the queries' positions
    return visible(i, torch.arange(t_k, device=device), window, sinks)


def visible(i, j, window=None, sinks=0):  # the same, for positions i of queries and j of keys
    return (j <= i) if window is None else (j <= i) & ((j > i - window) | (j < sinks))


# 3. One attention head ----------
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
        out, weights = attention(q, k, v, causal_mask(T, T, device=x.device))
        return out, weights  # (B, T, hs), (B, T, T)


# 4. The KV cache ----------
class KVCache:
    """Keys and values of every layer for the positions seen so far.

    Allocated once at full length, (B, n_kv_head, block_size, hs) per layer, written
    in place: decoding never grows a tensor with torch.cat. `pos` counts the filled
    positions, `at` the same on the device for the fixed-shape decode step
    (GPT.decode_step), which reads the whole buffer with the unwritten part masked:
    it needs zeroed buffers (zero=True), a masked value meets its weight 0, 0 * NaN is NaN.

    A window W, S sinks: a rolling buffer (Mistral) of S + W slots, position p at slot p if
    p < S, else S + (p - S) mod W. stream (StreamingLLM): keys kept unrotated, rotated when read."""

    def __init__(
        self,
        n_layer,
        batch_size,
        n_kv_head,
        block_size,
        head_size,
        device=None,
        dtype=None,
        zero=False,
        window=None,
        sinks=0,
        stream=False,
    ):
        block_size = block_size if window is None else sinks + window
        shape = (batch_size, n_kv_head, block_size, head_size)
        # empty by default: positions past pos are never read. One tensor per layer:
        # a compiled step writing into a slice of a shared one copies all of it
        alloc = torch.zeros if zero or window else torch.empty
        self.k = [alloc(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [alloc(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.block_size = block_size
        self.pos = 0
        # advanced in place: a fresh tensor per token would be a host-to-device copy
        self.at = torch.zeros(1, dtype=torch.long, device=device)
        self.window, self.sinks, self.stream, self.lag = window, sinks, stream, 0
        self.slot_pos = torch.full(
            (block_size,), -1, device=device
        )  # rolling: each slot's position

    def update(self, layer, k, v, at=None):
        """Write k, v (B, n_kv_head, T, hs) of one layer at the next positions; return its keys
        and values so far (B, n_kv_head, pos + T, hs) and which the T queries see (None: causal,
        T == pos + T). With `at` (1-element tensor, T = 1) write there, return the whole buffers."""
        if self.window is not None:
            return self.roll(layer, k, v)
        if at is not None:
            self.k[layer][:, :, at] = k
            self.v[layer][:, :, at] = v
            written = (torch.arange(self.block_size, device=at.device) <= at)[
                None
            ]  # True at 0 .. at
            return (
                self.k[layer],
                self.v[layer],
                written,
            )  # (B, n_kv_head, block_size, hs), (1, block_size)
        T, end = k.size(2), self.pos + k.size(2)
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        mask = causal_mask(T, end, device=k.device) if 1 < T < end else None
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end], mask

    def roll(self, layer, k, v):
        S, W, T, p = self.sinks, self.window, k.size(2), self.pos
        if T == 1:  # p replaces p - W, just out of its window: write, then read in place, no mask:
            s, n = (p if p < S else S + (p - S) % W), min(p + 1, S + W)  # the slots fill in order
            self.k[layer][:, :, s], self.v[layer][:, :, s], self.slot_pos[s] = (
                k[:, :, 0],
                v[:, :, 0],
                p,
            )
            keys, values, kpos, mask = (
                self.k[layer][:, :, :n],
                self.v[layer][:, :, :n],
                self.slot_pos[:n],
                None,
            )
        else:  # a chunk is read before it is written: if longer than W, it overwrites its first keys
            new = torch.arange(p, p + T, device=k.device)
            keys, values, kpos, mask = k, v, new, None
            if p:  # the slots' keys, then the new ones
                keys, values = torch.cat([self.k[layer], k], 2), torch.cat([self.v[layer], v], 2)
                kpos = torch.cat([self.slot_pos, new])
                mask = visible(new[:, None], kpos, W, S) & (kpos >= 0)
            keep = (new < S) | (new > new[-1] - W)  # what stays of the chunk
            slot = torch.where(new < S, new, S + (new - S) % W)[keep]
            self.k[layer][:, :, slot], self.v[layer][:, :, slot] = k[:, :, keep], v[:, :, keep]
            if layer == len(self.k) - 1:
                self.slot_pos[slot] = new[keep]
        if self.stream:  # at their place in the cache (out of the window: masked)
            keys = apply_rotary(
                keys, *rotary_tables(k.size(-1), torch.where(kpos < S, kpos, kpos - self.lag))
            )
        return keys, values, mask

    def positions(self, T):  # of T new tokens; StreamingLLM: in the cache (one at a time once full)
        self.lag = max(0, self.pos + T - self.block_size) if self.stream else 0
        return torch.arange(self.pos - self.lag, self.pos + T - self.lag, device=self.at.device)

    def advance(self, n):
        self.pos += n
        self.at += n

    def reset(self):  # stale entries past pos are never read: no clearing needed
        self.pos = 0
        self.at.zero_()
        self.slot_pos.fill_(-1)

    @property
    def nbytes(self):
        return sum(t.nbytes for t in self.k + self.v)


class LinearState:
    """A linear model's KVCache, with its interface: per layer [S (B, nh, hs, hs), z (B, nh, hs)]."""

    def __init__(self, config, B, device=None, dtype=None):
        S = torch.zeros(
            B, config.n_head, *[config.n_embd // config.n_head] * 2, device=device, dtype=dtype
        )
        self.state = [[S.clone(), S[..., 0].clone()] for _ in range(config.n_layer)]
        self.block_size, self.pos, self.nbytes = (
            config.context,
            0,
            sum(t.nbytes for s in self.state for t in s),
        )
        self.window, self.stream = None, False  # as a full KVCache's

    def positions(self, T):
        return torch.arange(self.pos, self.pos + T, device=self.state[0][0].device)

    def advance(self, n):
        self.pos += n

    def reset(self):
        self.pos = 0
        [t.zero_() for s in self.state for t in s]


# Rotary position embeddings, an option (GPTConfig.rope) ----------
# Each pair of channels of q and k turns by an angle proportional to the position: q . k sees only their distance.
def rotary_tables(head_size, pos, base=10000.0):  # computed at any positions pos (T,)
    inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, device=pos.device).float() / head_size)
    angles = torch.outer(pos.float(), inv_freq)  # (T, hs/2)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    # x: (B, nh, T, hs); cos, sin: (T, hs/2) for the absolute positions of x
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def windowed_attention(q, k, v, window, sinks=0, dropout_p=0.0, block=128):
    """causal_mask(T, T, window, sinks) in time linear in T: blocks of c queries, a (c, S + (n + 1) c) mask."""
    B, nh, T, hs = q.shape
    k, v = (x.repeat_interleave(nh // x.size(1), dim=1) for x in (k, v))  # grouped-query heads
    c = min(window, block, T)
    n, nb = -(-(window - 1) // c), -(-T // c)  # blocks reached back, query blocks
    qb = F.pad(q, (0, 0, 0, nb * c - T)).view(B, nh, nb, c, hs)
    kb, vb = (
        F.pad(x, (0, 0, n * c, nb * c - T)).unfold(2, (n + 1) * c, c).transpose(-1, -2)
        for x in (k, v)
    )  # (B, nh, nb, (n + 1) c, hs), overlapping views
    i = torch.arange(nb * c, device=q.device).view(nb, c, 1)  # query positions
    j = (
        i[:, :1] - n * c + torch.arange((n + 1) * c, device=q.device)
    )  # key positions (nb, 1, (n + 1) c)
    mask = visible(i, j, window) & (j >= 0)  # (nb, c, (n + 1) c)
    if sinks:  # each sink once, where the window does not cover it
        kb, vb = (
            torch.cat([x[:, :, None, :sinks].expand(B, nh, nb, -1, hs), xb], 3)
            for x, xb in ((k, kb), (v, vb))
        )
        mask = torch.cat([torch.arange(min(sinks, T), device=q.device) <= i - window, mask], -1)
    # the fused kernel takes 4-D inputs with unit-stride rows and a 4-D mask, else explicit math
    qb, kb, vb = (x.reshape(B * nh, nb, -1, hs) for x in (qb, kb, vb))  # (B nh, nb, c or keys, hs)
    y = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask[None], dropout_p=dropout_p)
    return y.view(B, nh, nb * c, hs)[:, :, :T]


# 5. Multi-head attention ----------
class MultiHeadAttention(nn.Module):
    """n_head causal heads computed together, then mixed by W_O. One Linear (c_attn) holds
    every head's W_Q, W_K, W_V side by side: the same as n_head Heads, concatenated, then W_O.
    With n_kv_head < n_head (grouped-query attention) each key/value head serves n_head /
    n_kv_head query heads, which shrinks the KV cache."""

    def __init__(self, config):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_size = config.n_embd // config.n_head
        kv_width = self.n_kv_head * self.head_size
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # W_O
        self.qk_norm, self.attention = config.qk_norm, config.attention
        self.window, self.sinks = config.sliding_window, config.sink_tokens
        self.dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.sdpa = F.scaled_dot_product_attention  # context_parallel.py swaps in ring attention

    def forward(self, x, kv_cache=None, layer=0, rotary=None, return_attention=False, at=None):
        B, T, C = x.size()
        hs, nh, nkv = self.head_size, self.n_head, self.n_kv_head
        q, k, v = self.c_attn(x).split([nh * hs, nkv * hs, nkv * hs], dim=2)
        q, k, v = (t.view(B, T, -1, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh or nkv, T, hs)
        if self.qk_norm:  # bounded attention logits let fast recipes use large learning rates
            q, k = F.rms_norm(q, (hs,)), F.rms_norm(k, (hs,))
        if rotary is not None:  # a StreamingLLM cache rotates its keys itself
            q, k = (
                apply_rotary(q, *rotary),
                k if getattr(kv_cache, "stream", 0) else apply_rotary(k, *rotary),
            )
        if self.attention == "linear":  # a running state in place of the keys (LinearState)
            k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
            y, weights = linear_attention(
                q, k, v, kv_cache.state[layer] if kv_cache else None, return_attention
            )
            return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, C))), weights
        k, v, mask = kv_cache.update(layer, k, v, at) if kv_cache is not None else (k, v, None)
        Tk = k.size(2)

        if return_attention or at is not None:
            # the explicit path returns the weights; in the decode step one query's
            # row is small, and compiled it beats the fused kernel with a mask
            k, v = (t.repeat_interleave(nh // nkv, dim=1) for t in (k, v))  # (B, nh, Tk, hs)
            mask = causal_mask(T, Tk, self.window, self.sinks, x.device) if mask is None else mask
            y, weights = attention(q, k, v, mask)
        elif (
            mask is None and self.window is not None and T == Tk
        ):  # no (T, T) mask: time linear in T
            y, weights = (
                windowed_attention(q, k, v, self.window, self.sinks, self.dropout * self.training),
                None,
            )
        else:
            # the fused kernel: same result, never materialising the (T, Tk) weights. Its is_causal
            # aligns queries to the first keys, so a chunk appended to a cache needs the mask
            y, weights = (
                self.sdpa(
                    q,
                    k,
                    v,
                    attn_mask=mask,
                    is_causal=mask is None and T == Tk,
                    dropout_p=self.dropout if self.training else 0.0,
                    enable_gqa=nkv != nh,
                ),
                None,
            )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y)), weights


# 6. The feed-forward layer and the transformer block ----------
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


# 7. The GPT model ----------
@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64, for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm, as in GPT-2
    n_kv_head: int | None = None  # None: n_head (plain multi-head attention)
    # options for fast training runs; the defaults are GPT-2's own architecture
    rope: bool = False  # rotary embeddings instead of learned positions
    qk_norm: bool = False  # RMS-normalise queries and keys per head
    activation: str = "gelu"  # "gelu" (tanh approximation) or "relu2"
    attention: str = "softmax"  # or "linear": linear_attention, O(T) and a fixed-size state
    sliding_window: int | None = None  # each query sees its last W positions (itself included)
    sink_tokens: int = 0  # and the first S positions, whatever the window (needs sliding_window)

    def __post_init__(self):
        self.n_kv_head = self.n_head if self.n_kv_head is None else self.n_kv_head
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
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for name, kinds in (
            ("activation", ("gelu", "relu2")),
            ("attention", ("softmax", "linear")),
        ):
            if getattr(self, name) not in kinds:
                raise ValueError(
                    f"{name} must be {' or '.join(map(repr, kinds))}, got {getattr(self, name)!r}"
                )
        w, s = self.sliding_window, self.sink_tokens
        if (
            (w is not None and (type(w) is not int or w < 1))
            or type(s) is not int
            or s < 0
            or (s and w is None)
        ):
            raise ValueError(
                f"need sliding_window None or >= 1, sink_tokens >= 0 and a window for sinks: {w} {s}"
            )
        # the longest sequence: rope with a window or linear attention has no end
        self.context = (
            math.inf if self.rope and (self.attention == "linear" or w) else self.block_size
        )


# Dense bf16 peaks in FLOP/s (vendors' data sheets) for estimate_mfu, matched in order
# against the device name: variants before the bare name (H100 SXM is "H100 80GB HBM3").
PEAK_FLOPS = {
    "H200 NVL": 835e12,
    "H200": 989e12,
    "GH200": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
}


# Sampling the next token, for generation (section 8) ----------
def sample_next(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    """Pick the next token (B, 1) from the last position's logits (B, vocab)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        # nucleus: keep the fewest most likely tokens whose probability reaches top_p
        probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        drop = probs.cumsum(dim=-1) - probs >= top_p  # (B, vocab), most likely first
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1, generator=generator)


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self._decoders = {}  # compiled decode steps, by batch size (compiled_decoder)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),  # token embedding
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        if not config.rope:  # rope computes its angles at the positions, for any length
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)  # positions
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: reading a token in and writing it out share one matrix
        self.lm_head.weight = self.transformer.wte.weight

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
        c, p = self.config, self.transformer.wte.weight
        if c.attention == "linear":
            return LinearState(c, batch_size, p.device, dtype or p.dtype)
        if window is not None or sinks:
            c = replace(c, sliding_window=window, sink_tokens=sinks)  # checks them
            if not c.rope or sinks + window > c.block_size:
                raise ValueError(
                    f"a cache window needs rope, and window + sinks <= block_size ({c.block_size})"
                )
        stream = window is not None and self.config.sliding_window is None
        return KVCache(
            c.n_layer,
            batch_size,
            c.n_kv_head,
            c.block_size,
            c.n_embd // c.n_head,
            p.device,
            dtype or p.dtype,
            zero,
            c.sliding_window,
            c.sink_tokens,
            stream,
        )

    def embed(self, idx, pos):
        """Token embeddings (B, T, C) of idx at positions pos (T,): plus the learned
        position embeddings, or with rope, returned with the rotary tables at pos."""
        x = self.transformer.wte(idx)
        if self.config.rope:
            return x, rotary_tables(self.config.n_embd // self.config.n_head, pos)  # (T, hs/2) each
        return x + self.transformer.wpe(pos), None  # (T, C) broadcast over B

    def forward(self, idx, targets=None, kv_cache=None, return_attention=False, last_only=False):
        """idx (B, T) token ids -> (logits (B, T, vocab), loss or None). kv_cache (a KVCache,
        or a LinearState): attend over its positions plus idx, add idx's to it, advance it.
        return_attention adds a third item, one (B, n_head, T, Tk) weight tensor per layer.
        last_only: the last position's logits alone (what generation needs)."""
        B, T = idx.size()
        start = kv_cache.pos if kv_cache is not None else 0
        if kv_cache is not None and kv_cache.window is None and start + T > kv_cache.block_size:
            raise ValueError(
                f"KV cache overflow: {start} positions cached + {T} new > block_size "
                f"{kv_cache.block_size}; reset the cache or slide the window"
            )
        if T > self.config.context:
            raise ValueError(
                f"sequence of length {T} is longer than block_size {self.config.block_size}"
            )

        x, rotary = self.embed(
            idx, kv_cache.positions(T) if kv_cache else torch.arange(T, device=idx.device)
        )
        x = self.transformer.drop(x)
        maps = []
        for layer, block in enumerate(self.transformer.h):
            x, weights = block(x, kv_cache, layer, rotary, return_attention)
            maps.append(weights)
        if kv_cache is not None:
            kv_cache.advance(T)
        x = self.transformer.ln_f(x)

        if targets is not None:
            logits = self.lm_head(x)  # (B, T, vocab)
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1
            )
        else:
            logits, loss = self.lm_head(x[:, -1:] if last_only else x), None
        return (logits, loss, maps) if return_attention else (logits, loss)

    def decode_step(self, idx, at, kv_cache):
        """Logits (B, vocab) of one new token per sequence, idx (B, 1), at position `at` (a
        1-element long tensor), through a zeroed cache, read whole with the positions past `at`
        masked: fixed shapes, compiled once (a CUDA graph on CUDA). The caller advances the cache."""
        x, rotary = self.embed(idx, at)
        for layer, block in enumerate(self.transformer.h):
            x, _ = block(x, kv_cache, layer, rotary, at=at)
        return self.lm_head(self.transformer.ln_f(x))[:, -1]  # (B, vocab)

    # 8. Generation ----------
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
    def generate_stream(
        self,
        idx,
        max_new_tokens,
        temperature=1.0,
        top_k=None,
        top_p=None,
        use_cache=True,
        generator=None,
        return_attention=False,
        compile=False,
        window=None,
        sinks=0,
    ):
        """Yield (next_token (B, 1), attention, window_start) for each new token.

        The window (the prompt, or what is left after a slide) goes through the model
        in one forward that fills the cache; then only the newest token does.
        use_cache=False runs the whole window every time; compile=True runs the newest
        token through the compiled step (compiled_decoder); window, sinks: StreamingLLM's
        cache (make_kv_cache). attention (with return_attention): the per-layer weights
        of the forward that gave this token, over idx[:, window_start:]: (B, nh, T, T)
        maps, then one (B, nh, 1, Tk) row per step (a rolling cache's: by slot)."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if idx.size(1) < 1:
            raise ValueError("generation needs at least one prompt token")
        if compile and (
            return_attention
            or not use_cache
            or window
            or self.config.sliding_window
            or self.config.attention != "softmax"
        ):
            raise ValueError(
                "compile=True decodes softmax attention through the full KV cache, "
                "without attention maps or a window"
            )
        if compile:
            step, cache = self.compiled_decoder(idx.size(0))
        else:
            cache = (
                self.make_kv_cache(idx.size(0), window=window, sinks=sinks) if use_cache else None
            )

            def step(token):  # the newest tokens (B, 1) attend to the cache
                return self(token, kv_cache=cache, return_attention=return_attention)

        # a prompt keeps its last block_size tokens (StreamingLLM: S + W; a rolling rope cache: all)
        rolls = self.config.rope and cache is not None and cache.window is not None
        keep = (cache.block_size if cache.stream else idx.size(1)) if rolls else self.config.context
        start, fresh = max(0, idx.size(1) - keep), True
        for _ in range(max_new_tokens):
            new_start = start if rolls else self.context_start(idx.size(1), start)
            if cache is None or fresh or new_start != start:
                # the whole window in one forward: the prompt, after a slide, or without a cache
                start, fresh = new_start, False
                if cache is not None:
                    cache.reset()
                out = self(
                    idx[:, start:],
                    kv_cache=cache,
                    return_attention=return_attention,
                    last_only=True,
                )
            else:
                out = step(idx[:, -1:])
            idx_next = sample_next(out[0][:, -1, :], temperature, top_k, top_p, generator)
            idx = torch.cat((idx, idx_next), dim=1)
            yield idx_next, (out[2] if return_attention else None), start

    @torch.no_grad()
    def generate(
        self,
        idx,
        max_new_tokens,
        temperature=1.0,
        top_k=None,
        top_p=None,
        use_cache=True,
        generator=None,
        compile=False,
        window=None,
        sinks=0,
    ):
        """idx (B, T) with max_new_tokens sampled tokens appended; temperature=0 is greedy. use_cache=False
        (the whole window every step, same slide) and compile=True (float32) give the same greedy tokens."""
        steps = self.generate_stream(
            idx,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            use_cache,
            generator,
            compile=compile,
            window=window,
            sinks=sinks,
        )
        return torch.cat([idx] + [token for token, _, _ in steps], dim=1)

    def compiled_decoder(self, batch_size, cuda_graphs=None):
        """(step, cache): decode_step compiled, with its zeroed KVCache, built once per batch size
        and kept; step(token (B, 1)) returns what forward would and advances the cache. cuda_graphs
        (default: on CUDA) records it as a CUDA graph writing the static cache in place; else max-autotune
        with frozen weights (changing one rebuilds the step) writes its own matrix-vector kernels."""
        p = self.transformer.wte.weight
        if (
            p.device.type not in ("cpu", "cuda") or self.config.sliding_window
        ):  # a window decodes eagerly
            what = "a sliding window" if self.config.sliding_window else p.device.type
            raise ValueError(f"compile=True decodes full attention on CPU or CUDA, not {what}")
        cuda_graphs = p.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        key = (batch_size, p.device, p.dtype, cuda_graphs)
        version = None if cuda_graphs else tuple(q._version for q in self.parameters())
        if key in self._decoders and self._decoders[key][2] == version:
            return self._decoders[key][:2]
        cache = self.make_kv_cache(batch_size, zero=True)
        if cuda_graphs:
            for t in cache.k + cache.v + [cache.at]:
                torch._dynamo.mark_static_address(t)
            compiled = torch.compile(self.decode_step, mode="reduce-overhead", fullgraph=True)
        else:
            compiled = torch.compile(
                self.decode_step, mode="max-autotune-no-cudagraphs", fullgraph=True
            )
            # read by inductor when it compiles, at the first call; quiet autotuning
            frozen = dict(
                freezing=True,
                autotune_num_choices_displayed=0,
                max_autotune_report_choices_stats=False,
            )

        def step(token):
            # a fresh (B, 1) tensor: a view into idx would change strides every step
            token = token.clone(memory_format=torch.contiguous_format)
            if cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the last step's logits are used up
                logits = compiled(token, cache.at, cache)
            else:
                with torch._inductor.config.patch(frozen):
                    logits = compiled(token, cache.at, cache)
            cache.advance(1)
            return logits[:, None], None  # (logits (B, 1, vocab), no loss), as forward gives

        self._decoders[key] = (step, cache, version)
        return step, cache

    # Training helpers ----------
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW, decaying matrices only (not biases, LayerNorm gains); the fused
        kernel updates every parameter in one pass (CUDA and CPU)."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(
            groups, lr=learning_rate, betas=betas, fused=device_type in ("cuda", "cpu")
        )

    def flops_per_token(self):
        """Training FLOPs per token: 6 per parameter plus the attention scores."""
        c = self.config
        return 6 * self.num_params(non_embedding=True) + 12 * c.n_layer * c.n_embd * c.block_size

    def estimate_mfu(self, tokens_per_iter, dt):
        """Model FLOPs utilisation against the current GPU's bf16 peak (PEAK_FLOPS), or None."""
        if not torch.cuda.is_available() or dt <= 0:
            return None
        name = torch.cuda.get_device_name()
        peak = next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)
        return None if peak is None else self.flops_per_token() * tokens_per_iter / dt / peak

    # 9. GPT-2 weights in Hugging Face format ----------
    @classmethod
    def from_pretrained(cls, path_or_name, **overrides):
        """GPT-2 from a Hugging Face folder, or by name ('gpt2', 'gpt2-medium', ...) through
        huggingface_hub. overrides: GPTConfig fields to change, e.g. dropout or a smaller
        block_size. A bad file, or attention='linear', is a one-line ValueError."""
        if overrides.get("attention", "softmax") != "softmax":
            raise ValueError(
                "GPT-2's weights need softmax attention; train a linear model from scratch"
            )
        from support.checkpoint import read_gpt2_files  # safetensors, or a weights_only torch.load

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
        sizes = {key: hf[key] for key in ("vocab_size", "n_layer", "n_head", "n_embd")}
        model = cls(
            GPTConfig(**(sizes | overrides), block_size=block_size)
        )  # GPTConfig's defaults are GPT-2's

        sd = {}
        for key, tensor in state.items():
            key = key.removeprefix("transformer.")
            if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":
                continue  # causal-mask buffers, and the LM head tied to wte
            # Hugging Face's GPT-2 stores these as Conv1D, (in, out): transpose to Linear's (out, in)
            if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                tensor = tensor.t()
            sd["transformer." + key] = tensor.float()
        sd["transformer.wpe.weight"] = sd["transformer.wpe.weight"][:block_size]
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
        model.load_state_dict(sd, strict=True)
        return model
