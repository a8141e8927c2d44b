"""
model.py's GPT attention redone in the open by hooks, for the experiments that need its
weights, its scores' gradient, or a different scale.

The model's own attention runs in PyTorch's fused kernel, which never materialises the
weights. ExplicitAttention hooks one layer through its public module names (c_attn, whose
output holds every head's q, k and v side by side; c_proj, which mixes the heads) and
recomputes softmax(scale q k^T) v under the causal mask in between, turning q and k first
when the model uses rotary positions. With the model's scale, 1/sqrt(head size), the result
is the model's own (tests/test_seq2seq.py checks the logits); with another scale it is the
same model with that one factor changed.
"""

import math

import torch


def rotate(x, base=10000.0):
    """Rotary positions (Su et al. 2021) on x (B, nh, T, hs): channel k of the first half
    and channel k of the second half form a pair, turned at position p by the angle
    p * base^(-2k / hs), as model.py does it."""
    B, nh, T, hs = x.shape
    exponents = torch.arange(0, hs, 2, device=x.device).float() / hs  # (hs/2,)
    angles = torch.arange(T, device=x.device).float()[:, None] / base**exponents  # (T, hs/2)
    cos = angles.cos()
    sin = angles.sin()
    x1, x2 = x.chunk(2, dim=-1)  # (B, nh, T, hs/2) each
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)  # (B, nh, T, hs)


class ExplicitAttention:
    """Hooks that redo one GPT layer's attention in the open with a chosen scale: a forward
    hook keeps c_attn's output (every head's q, k, v), and a pre-hook on c_proj replaces
    its input with softmax(scale q k^T) v under the causal mask. With scale 1/sqrt(hs) it
    is the model's own attention (a test checks the logits); the scores s are kept with
    their gradient. Needs the layout of a GPT without QK-norm and with n_kv_head = n_head,
    and a whole sequence from position 0 (no KV cache)."""

    def __init__(self, attn, n_head, rope=False, scale=None):
        self.n_head = n_head
        self.rope = rope
        self.scale = scale  # None: the model's own, 1 / sqrt(head size)
        self.qkv = None
        self.q = None
        self.k = None
        self.scores = None
        self.weights = None
        self.handles = [
            attn.c_attn.register_forward_hook(self.keep),
            attn.c_proj.register_forward_pre_hook(self.attend),
        ]

    def keep(self, module, args, output):
        self.qkv = output  # (B, T, 3 C)

    def attend(self, module, args):
        B, T, C3 = self.qkv.shape
        C = C3 // 3
        hs = C // self.n_head
        q, k, v = self.qkv.split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        if self.rope:
            q = rotate(q)
            k = rotate(k)
        scale = self.scale
        if scale is None:
            scale = 1.0 / math.sqrt(hs)
        s = (q @ k.transpose(-2, -1)) * scale  # (B, nh, T, T)
        if s.requires_grad:
            s.retain_grad()
        future = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)  # (T, T)
        weights = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)  # (B, nh, T, T)
        self.q = q
        self.k = k
        self.scores = s
        self.weights = weights
        y = weights @ v  # (B, nh, T, hs)
        return (y.transpose(1, 2).reshape(B, T, C),)

    def remove(self):
        for handle in self.handles:
            handle.remove()


def explicit_attention(model, scale=None):
    """An ExplicitAttention on every layer of a GPT, in order."""
    c = model.config
    return [ExplicitAttention(block.attn, c.n_head, c.rope, scale) for block in model.transformer.h]
