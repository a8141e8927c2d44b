"""
The story before GPT, in one file: an RNN encoder-decoder whose decoder reads one fixed
vector (the bottleneck), and the same encoder-decoder with attention, whose decoder pulls
from every encoder state through one of four score functions.

The ideas appear in the order the lectures tell them:
   1. score functions   additive (Bahdanau), dot, general and concat (Luong), each its formula
   2. masked_softmax    scores to weights, the padding never receiving any
   3. Encoder           a bidirectional GRU: one state per source token, and a summary
   4. BottleneckDecoder reads the summary only, the fixed vector of the lecture's cliff-hanger
   5. LuongDecoder      attends after its step, so its GRU runs in one call over the target
   6. BahdanauDecoder   attends before its step and feeds the context in: a loop over t
   7. Seq2Seq           encoder + decoder, teacher-forced forward and greedy decoding

Shapes use B = batch, S = source length, T = target length, E = embedding width,
H = the encoder's hidden size per direction, D = 2H = the width of an encoder state and of
the decoder's state, A = the width inside the additive and concat scores, V = vocabulary.
A score is e[b, t, i]: how well decoder state t matches encoder state i.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

PAD = 0  # token 0 in every vocabulary here: padding, never attended to, never scored
BOS = 1  # target vocabulary: the decoder's first input
EOS = 2  # target vocabulary: the end of a translation


# 1. Score functions ----------
# Each takes the decoder's states s (B, T, D) and the encoder's states h (B, S, D) and
# returns the scores e (B, T, S). Every part that depends on h alone is computed once per
# sentence by keys(h), not once per decoder step: that is what makes a step loop affordable.


class AdditiveScore(nn.Module):
    """Bahdanau's score, e = v^T tanh(W s + U h): a one-hidden-layer network judges each
    (decoder state, encoder state) pair, so the two need not live in the same space."""

    def __init__(self, dec_size, enc_size, attn_size):
        super().__init__()
        self.W = nn.Linear(dec_size, attn_size, bias=False)
        self.U = nn.Linear(enc_size, attn_size, bias=False)
        self.v = nn.Linear(attn_size, 1, bias=False)

    def keys(self, h):
        return self.U(h)  # (B, S, A)

    def forward(self, s, keys):
        Ws = self.W(s)  # (B, T, A)
        hidden = torch.tanh(Ws[:, :, None, :] + keys[:, None, :, :])  # (B, T, S, A)
        return self.v(hidden).squeeze(-1)  # (B, T, S)


class DotScore(nn.Module):
    """Luong's dot score, e = s^T h: no parameters at all, so the decoder and the encoder
    must learn to put matching content in the same directions."""

    def keys(self, h):
        return h  # (B, S, D)

    def forward(self, s, keys):
        return s @ keys.transpose(1, 2)  # (B, T, D) @ (B, D, S) -> (B, T, S)


class GeneralScore(nn.Module):
    """Luong's general score, e = s^T W h: a learned bilinear form between the two spaces,
    the step that becomes the transformer's W_Q and W_K."""

    def __init__(self, dec_size, enc_size):
        super().__init__()
        self.W = nn.Linear(enc_size, dec_size, bias=False)

    def keys(self, h):
        return self.W(h)  # (B, S, D): W h

    def forward(self, s, keys):
        return s @ keys.transpose(1, 2)  # (B, T, S): s^T (W h)


class ConcatScore(nn.Module):
    """Luong's concat score, e = v^T tanh(W [s; h]). W [s; h] = W_s s + W_h h for W split
    into the columns that meet s and those that meet h, so this is Bahdanau's additive form
    with its two matrices stored as one; the Luong and Bahdanau models differ in where the
    attention sits in the decoder, not in this formula."""

    def __init__(self, dec_size, enc_size, attn_size):
        super().__init__()
        self.dec_size = dec_size
        self.W = nn.Linear(dec_size + enc_size, attn_size, bias=False)
        self.v = nn.Linear(attn_size, 1, bias=False)

    def keys(self, h):
        W_h = self.W.weight[:, self.dec_size :]  # (A, D)
        return F.linear(h, W_h)  # (B, S, A)

    def forward(self, s, keys):
        W_s = self.W.weight[:, : self.dec_size]  # (A, D)
        hidden = torch.tanh(F.linear(s, W_s)[:, :, None, :] + keys[:, None, :, :])  # (B, T, S, A)
        return self.v(hidden).squeeze(-1)  # (B, T, S)


def make_score(kind, dec_size, enc_size, attn_size):
    """The score module a decoder uses, by the name the lectures give it."""
    if kind == "additive":
        return AdditiveScore(dec_size, enc_size, attn_size)
    if kind == "concat":
        return ConcatScore(dec_size, enc_size, attn_size)
    if kind == "general":
        return GeneralScore(dec_size, enc_size)
    if kind == "dot":
        if dec_size != enc_size:
            raise ValueError(f"the dot score needs equal widths, got {dec_size} and {enc_size}")
        return DotScore()
    raise ValueError(f"unknown score {kind!r}; use additive, dot, general or concat")


# 2. Scores to weights ----------
def masked_softmax(scores, mask):
    """Attention weights from scores (B, T, S), over the source positions where mask (B, S)
    is True. -inf, not a large negative number: exp(-inf) is exactly 0, so padding receives
    exactly no weight whatever the scores."""
    scores = scores.masked_fill(~mask[:, None, :], float("-inf"))  # (B, T, S)
    return torch.softmax(scores, dim=-1)  # (B, T, S), each row sums to 1


# 3. The encoder ----------
@dataclass
class Memory:
    """What the decoder may read of the source: every state h, their padding mask, the
    score's per-sentence part of h (keys), and the one summary vector."""

    h: torch.Tensor  # (B, S, D)
    mask: torch.Tensor  # (B, S), True at real tokens
    keys: torch.Tensor | None  # (B, S, A or D), None without attention
    summary: torch.Tensor  # (B, D)


class Encoder(nn.Module):
    """A bidirectional GRU over the source, as Bahdanau et al. use: state i knows token i
    and its context on both sides. With bidirectional=False, one GRU of width D reads left
    to right, and state i knows only tokens 1..i. Packing the padded batch makes each
    direction start and end at each sentence's own ends, so the padding never enters a
    state."""

    def __init__(self, vocab_size, emb_size, hidden_size, bidirectional=True):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        width = hidden_size
        if not bidirectional:
            width = 2 * hidden_size  # the same D = 2H as the two directions side by side
        self.rnn = nn.GRU(emb_size, width, batch_first=True, bidirectional=bidirectional)

    def forward(self, src, lengths):
        """src (B, S) token ids, lengths (B,) -> states h (B, S, D), zero at padding, and
        the summary (B, D): the forward GRU's last state beside the backward GRU's first,
        or the one GRU's last state."""
        x = self.embed(src)  # (B, S, E)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, last = self.rnn(packed)  # last (directions, B, D / directions): final states
        h, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))  # (B, S, D)
        summary = torch.cat(list(last), dim=-1)  # (B, D)
        return h, summary


# 4.-6. The decoders ----------
# Each decoder maps its inputs y_in (B, T) (the previous target tokens, BOS first), the
# memory and its state before them (B, D) to (logits (B, T, V), weights (B, T, S) or None,
# its state after them). Greedy decoding calls it with T = 1, one token at a time.


class Readout(nn.Module):
    """From a decoder state s_t and a context c_t to next-token logits, through Luong's
    attentional state tanh(W_c [c_t; s_t]). All decoders here share it, so they differ only
    in where c_t comes from."""

    def __init__(self, dec_size, enc_size, vocab_size):
        super().__init__()
        self.W_c = nn.Linear(enc_size + dec_size, dec_size)
        self.out = nn.Linear(dec_size, vocab_size)

    def forward(self, c, s):
        attentional = torch.tanh(self.W_c(torch.cat([c, s], dim=-1)))  # (B, T, D)
        return self.out(attentional)  # (B, T, V)


class BottleneckDecoder(nn.Module):
    """The decoder without attention: the summary is its only view of the source, given as
    its first state and again beside every input (as in Cho et al. 2014). However long the
    source, the decoder reads these D numbers."""

    def __init__(self, vocab_size, emb_size, dec_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        self.rnn = nn.GRU(emb_size + dec_size, dec_size, batch_first=True)
        self.readout = Readout(dec_size, dec_size, vocab_size)

    def forward(self, y_in, memory, state):
        T = y_in.size(1)
        x = self.embed(y_in)  # (B, T, E)
        c = memory.summary[:, None, :].expand(-1, T, -1)  # (B, T, D): the same vector each step
        s, last = self.rnn(torch.cat([x, c], dim=-1), state[None])  # (B, T, D)
        return self.readout(c, s), None, last[0]


class LuongDecoder(nn.Module):
    """Luong et al. 2015: the GRU steps first, then its new state s_t attends over the
    encoder states, and the context c_t only shapes the output. The states s_1..s_T do not
    depend on any context, so one nn.GRU call computes them all and the attention of all T
    steps is one batched matmul. (Luong's "input feeding", which passes the attentional
    state into the next step, would bring the loop back; it is left out.)"""

    def __init__(self, vocab_size, emb_size, dec_size, score):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        self.rnn = nn.GRU(emb_size, dec_size, batch_first=True)
        self.score = score
        self.readout = Readout(dec_size, dec_size, vocab_size)

    def forward(self, y_in, memory, state):
        x = self.embed(y_in)  # (B, T, E)
        s, last = self.rnn(x, state[None])  # (B, T, D): every s_t in one call
        e = self.score(s, memory.keys)  # (B, T, S)
        alpha = masked_softmax(e, memory.mask)  # (B, T, S)
        c = alpha @ memory.h  # (B, T, S) @ (B, S, D) -> (B, T, D)
        return self.readout(c, s), alpha, last[0]


class BahdanauDecoder(nn.Module):
    """Bahdanau et al. 2015: the previous state s_{t-1} scores the encoder states, and the
    context c_t enters the GRU step beside the previous token. s_t depends on c_t, which
    depends on s_{t-1}: the steps run one after another in a Python loop."""

    def __init__(self, vocab_size, emb_size, dec_size, score):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, emb_size, padding_idx=PAD)
        self.cell = nn.GRUCell(emb_size + dec_size, dec_size)
        self.score = score
        self.readout = Readout(dec_size, dec_size, vocab_size)

    def forward(self, y_in, memory, state):
        x = self.embed(y_in)  # (B, T, E)
        s = state  # (B, D): s_{t-1}
        logits = []
        weights = []
        for t in range(y_in.size(1)):
            e = self.score(s[:, None, :], memory.keys)  # (B, 1, S): e_ti = score(s_{t-1}, h_i)
            alpha = masked_softmax(e, memory.mask)  # (B, 1, S)
            c = alpha @ memory.h  # (B, 1, D): c_t = sum_i alpha_ti h_i
            s = self.cell(torch.cat([x[:, t], c[:, 0]], dim=-1), s)  # (B, D): s_t
            logits.append(self.readout(c, s[:, None, :]))  # (B, 1, V)
            weights.append(alpha)
        return torch.cat(logits, dim=1), torch.cat(weights, dim=1), s


# 7. The encoder-decoder ----------
ATTENTION = ("none", "additive", "dot", "general", "concat")


@dataclass
class Seq2SeqConfig:
    """The sizes and the attention of a Seq2Seq, checked once."""

    src_vocab_size: int
    tgt_vocab_size: int
    attention: str = "none"  # one of ATTENTION: "additive" is Bahdanau's model, the rest Luong's
    emb_size: int = 64  # E
    hidden_size: int = 64  # H per direction: encoder states and the decoder are D = 2H wide
    attn_size: int = 64  # A, inside the additive and concat scores
    bidirectional: bool = True  # the encoder reads both ways; False: left to right only

    def __post_init__(self):
        if self.attention not in ATTENTION:
            raise ValueError(
                f"attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}"
            )
        for name in ("src_vocab_size", "tgt_vocab_size", "emb_size", "hidden_size", "attn_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.bidirectional, bool):
            raise ValueError(f"bidirectional must be True or False, got {self.bidirectional!r}")


class Seq2Seq(nn.Module):
    """The encoder-decoder of the lectures' first chapter: an Encoder, and the decoder its
    config names. forward is teacher-forced (training); greedy decodes on its own output."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        c = config  # short, for the sizes below
        D = 2 * c.hidden_size
        self.encoder = Encoder(c.src_vocab_size, c.emb_size, c.hidden_size, c.bidirectional)
        # the decoder's first state, s_0 = tanh(W_init summary), as Bahdanau et al. set it
        self.init = nn.Linear(D, D)
        if c.attention == "none":
            self.decoder = BottleneckDecoder(c.tgt_vocab_size, c.emb_size, D)
        elif c.attention == "additive":
            score = make_score("additive", D, D, c.attn_size)
            self.decoder = BahdanauDecoder(c.tgt_vocab_size, c.emb_size, D, score)
        else:
            score = make_score(c.attention, D, D, c.attn_size)
            self.decoder = LuongDecoder(c.tgt_vocab_size, c.emb_size, D, score)

    def num_params(self):
        """Parameters, as GPT.num_params counts them, for the comparison table."""
        return sum(p.numel() for p in self.parameters())

    def start(self, src, lengths):
        """Encode the source: the decoder's memory and its first state s_0 (B, D)."""
        h, summary = self.encoder(src, lengths)  # (B, S, D), (B, D)
        keys = None
        if self.config.attention != "none":
            keys = self.decoder.score.keys(h)  # (B, S, A or D)
        positions = torch.arange(src.size(1), device=src.device)  # (S,)
        mask = positions[None, :] < lengths.to(src.device)[:, None]  # (B, S)
        memory = Memory(h=h, mask=mask, keys=keys, summary=summary)
        return memory, torch.tanh(self.init(summary))

    def forward(self, src, lengths, y_in):
        """src (B, S), lengths (B,), y_in (B, T) the target shifted right (BOS first) ->
        logits (B, T, V) and the attention weights (B, T, S), or None without attention."""
        memory, state = self.start(src, lengths)
        logits, weights, _ = self.decoder(y_in, memory, state)
        return logits, weights

    @torch.no_grad()
    def greedy(self, src, lengths, steps):
        """Decode `steps` tokens, each the most likely given the ones decoded before it ->
        tokens (B, steps) and weights (B, steps, S), or None without attention."""
        memory, state = self.start(src, lengths)
        y = torch.full((src.size(0), 1), BOS, dtype=torch.long, device=src.device)  # (B, 1)
        tokens = []
        weights = []
        for _ in range(steps):
            logits, alpha, state = self.decoder(y, memory, state)  # (B, 1, V)
            y = logits.argmax(dim=-1)  # (B, 1)
            tokens.append(y)
            weights.append(alpha)
        if self.config.attention == "none":
            return torch.cat(tokens, dim=1), None
        return torch.cat(tokens, dim=1), torch.cat(weights, dim=1)
