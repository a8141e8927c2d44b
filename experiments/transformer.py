"""
The Transformer of Vaswani et al. (2017), the encoder-decoder the lectures build towards,
made of model.py's own parts, with its three attentions:

    encoder self-attention   every source word attends to every source word, before and
                             after it: model.py's Block with the padding mask in place of
                             the causal one (the attention BERT keeps)
    decoder self-attention   every target position attends to the ones before it:
                             model.py's MultiHeadAttention with its causal mask (GPT's)
    cross-attention          the decoder attends to the encoder: queries from the target,
                             keys and values from the source, through model.py's attention()

In the order of the file:
   1. sinusoid           the paper's position encoding, added to the token embeddings
   2. CrossAttention     the decoder's queries against the encoder's keys and values
   3. DecoderBlock       causal self-attention, cross-attention, MLP, each with a residual
   4. Transformer        encoder, decoder, teacher-forced forward, greedy decoding, the maps

Shapes use B = batch, S = source length, T = target length, C = n_embd, nh = heads,
hs = head size, V = target vocabulary.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from experiments.seq2seq import BOS
from model import MLP, Block, GPTConfig, MultiHeadAttention, attention


# 1. Positions ----------
def sinusoid(T, C, device=None):
    """The position encoding (T, C) of Vaswani et al. (2017), section 3.5: channels 2k and
    2k + 1 hold the sine and the cosine of pos / 10000^(2k / C). Moving o positions turns
    each channel pair by a fixed angle, so one linear map relates every position to the one
    o after it; and nothing is learned per position, so the last positions, which the
    longest sentences alone reach, are as ready as the first."""
    pos = torch.arange(T, device=device).float()[:, None]  # (T, 1)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, C, 2, device=device).float() / C)  # (C/2,)
    angles = pos * inv_freq  # (T, C/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # (T, C)


# 2. Cross-attention ----------
class CrossAttention(nn.Module):
    """n_head heads whose queries come from the decoder's states and whose keys and values
    come from the encoder's: the formula of self-attention, model.py's attention(), with Q
    taken from one sequence and K, V from another. Bahdanau's decoder does the same with
    one head and an additive score (experiments/seq2seq.py)."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # W_Q
        self.c_kv = nn.Linear(config.n_embd, 2 * config.n_embd, bias=config.bias)  # W_K, W_V
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)  # W_O
        # a list while Transformer.attention_maps records: each forward appends its weights
        self.maps = None

    def forward(self, x, memory, mask):
        """x (B, T, C) the decoder's states, memory (B, S, C) the encoder's, mask
        (B, 1, 1, S) True at the real source words -> (B, T, C)."""
        B, T, C = x.size()
        S = memory.size(1)
        hs = C // self.n_head
        q = self.c_q(x).view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k, v = self.c_kv(memory).split(C, dim=2)
        k = k.view(B, S, self.n_head, hs).transpose(1, 2)  # (B, nh, S, hs)
        v = v.view(B, S, self.n_head, hs).transpose(1, 2)  # (B, nh, S, hs)
        y, weights = attention(q, k, v, mask)  # (B, nh, T, hs), (B, nh, T, S)
        if self.maps is not None:
            self.maps.append(weights)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.c_proj(y)


# 3. The decoder's block ----------
class DecoderBlock(nn.Module):
    """The decoder's layer in the paper's order: causal self-attention over the target so
    far, then cross-attention to the source, then the MLP, each pre-LayerNorm with its
    residual as in model.py's Block."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = MultiHeadAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.cross = CrossAttention(config)
        self.ln_3 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, memory, mask):
        x = x + self.attn(self.ln_1(x))  # no mask given: model.py's causal mask
        x = x + self.cross(self.ln_2(x), memory, mask)
        x = x + self.mlp(self.ln_3(x))
        return x


# 4. The encoder-decoder ----------
@dataclass
class TransformerConfig:
    """The sizes of a Transformer; the blocks inside are checked by model.py's GPTConfig."""

    src_vocab_size: int
    tgt_vocab_size: int
    n_layer: int = 2  # blocks in the encoder, and as many in the decoder
    n_head: int = 4
    n_embd: int = 64
    fused: bool = True  # GPTConfig.fused: False runs attention() and causal_mask() as written

    def blocks(self):
        """The GPTConfig of the blocks: their sizes, no dropout. Blocks read no positions
        and no vocabulary, so block_size and vocab_size are left as they are."""
        return GPTConfig(
            n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd, fused=self.fused
        )


class Transformer(nn.Module):
    """Vaswani et al.'s encoder-decoder: the encoder reads the whole source with no causal
    mask, the decoder writes the target under its causal mask and reads the encoder's
    output through cross-attention in every layer. forward is teacher-forced (training);
    greedy decodes on its own output; attention_maps writes out all three attentions."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        blocks = config.blocks()
        C = config.n_embd
        self.src_embed = nn.Embedding(config.src_vocab_size, C)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, C)
        self.encoder = nn.ModuleList([Block(blocks) for _ in range(config.n_layer)])
        self.ln_enc = nn.LayerNorm(C)
        self.decoder = nn.ModuleList([DecoderBlock(blocks) for _ in range(config.n_layer)])
        self.ln_dec = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, config.tgt_vocab_size, bias=False)
        # the paper's section 3.4: the output layer shares the target embedding's matrix,
        # whose entries are drawn with std 1/sqrt(C) and multiplied by sqrt(C) on the way in,
        # so that the words in and the logits out both start near unit size
        self.lm_head.weight = self.tgt_embed.weight
        nn.init.normal_(self.src_embed.weight, std=C**-0.5)
        nn.init.normal_(self.tgt_embed.weight, std=C**-0.5)

    def num_params(self):
        """Parameters, the tied output layer counted once, as GPT.num_params counts them."""
        return sum(p.numel() for p in self.parameters())

    def embed(self, embedding, idx):
        """Token embeddings times sqrt(C), plus the position encoding: (B, T, C)."""
        C = self.config.n_embd
        return embedding(idx) * math.sqrt(C) + sinusoid(idx.size(1), C, idx.device)

    def encode(self, src, lengths):
        """src (B, S), lengths (B,) -> the encoder's output (B, S, C) and the padding mask
        (B, 1, 1, S), True at real words, which the encoder and cross-attention both use."""
        positions = torch.arange(src.size(1), device=src.device)  # (S,)
        real = positions[None, :] < lengths.to(src.device)[:, None]  # (B, S)
        mask = real[:, None, None, :]  # (B, 1, 1, S): every head and every query alike
        x = self.embed(self.src_embed, src)  # (B, S, C)
        for block in self.encoder:
            # the padding mask in place of the causal one: each word sees the words after it
            x = block(x, mask=mask)
        return self.ln_enc(x), mask

    def decode(self, y_in, memory, mask):
        """y_in (B, T) the target so far (BOS first) -> next-word logits (B, T, V)."""
        x = self.embed(self.tgt_embed, y_in)  # (B, T, C)
        for block in self.decoder:
            x = block(x, memory, mask)
        return self.lm_head(self.ln_dec(x))  # (B, T, V)

    def forward(self, src, lengths, y_in):
        """Teacher-forced: src (B, S), lengths (B,), y_in (B, T) the target shifted right ->
        logits (B, T, V)."""
        memory, mask = self.encode(src, lengths)
        return self.decode(y_in, memory, mask)

    @torch.no_grad()
    def greedy(self, src, lengths, steps):
        """Decode `steps` tokens, each the most likely given the ones before it -> (B, steps).
        The source is encoded once; the decoder runs again over its whole output each step
        (a cache would save that; the sentences here are short)."""
        memory, mask = self.encode(src, lengths)
        y = torch.full((src.size(0), 1), BOS, dtype=torch.long, device=src.device)  # (B, 1)
        for _ in range(steps):
            logits = self.decode(y, memory, mask)  # (B, t, V)
            y = torch.cat([y, logits[:, -1:].argmax(dim=-1)], dim=1)
        return y[:, 1:]

    @torch.no_grad()
    def attention_maps(self, src, lengths, y_in):
        """The teacher-forced forward with every attention written out: a dict of one
        weight tensor per layer for "encoder" (B, nh, S, S), "decoder" (B, nh, T, T) and
        "cross" (B, nh, T, S)."""
        maps = dict(encoder=[], decoder=[], cross=[])
        modules = [(block.attn, "encoder") for block in self.encoder]
        modules += [(block.attn, "decoder") for block in self.decoder]
        modules += [(block.cross, "cross") for block in self.decoder]
        for module, kind in modules:
            module.maps = maps[kind]
        try:
            self(src, lengths, y_in)
        finally:
            for module, _ in modules:
                module.maps = None
        return maps


def target_input(tokens):
    """What the decoder read while writing tokens (B, T): BOS, then each but the last."""
    bos = torch.full_like(tokens[:, :1], BOS)
    return torch.cat([bos, tokens[:, :-1]], dim=1)  # (B, T)


def look_ahead(weights):
    """The weight each query puts on the keys after it, for weights (..., T, T) of a
    sequence attending to itself -> (..., T). Exactly 0 under a causal mask, whatever the
    model: it measures what removing the mask lets a head do."""
    T = weights.size(-1)
    later = torch.ones(T, T, dtype=torch.bool, device=weights.device).triu(1)  # (T, T): j > i
    return (weights * later).sum(-1)
