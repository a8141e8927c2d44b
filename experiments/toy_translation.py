"""
A toy translation whose true alignment is known, for experiments/bottleneck.py.

The source language has nouns and adjectives; the target language has one word for each
source word (a fixed dictionary) and puts its adjectives after the noun, as French does:
"a7 n12" becomes "N12 A7". Every other word keeps its place. So target word j translates
exactly one source word, align[j], and the alignment is a rough diagonal with local swaps,
not the identity. A sentence of length L has a translation of length L.

Vocabularies, token 0 always padding:
    source   0 PAD, 1..N_NOUNS nouns, then N_ADJECTIVES adjectives
    target   0 PAD, 1 BOS, 2 EOS, then the translation of source word w at w + 2
    GPT      the source vocabulary, then the target one shifted by SRC_VOCAB: one sequence
             holds the source, the target's BOS (the separator) and the target
"""

import torch

from experiments.seq2seq import BOS, EOS, PAD

N_NOUNS = 60
N_ADJECTIVES = 40
P_ADJECTIVE = 0.35  # how often a source word is an adjective
SRC_VOCAB = 1 + N_NOUNS + N_ADJECTIVES
TGT_VOCAB = 3 + N_NOUNS + N_ADJECTIVES
GPT_VOCAB = SRC_VOCAB + TGT_VOCAB
SEP = SRC_VOCAB + BOS  # the GPT's separator between source and target
GPT_EOS = SRC_VOCAB + EOS


def words(lengths, S, gen):
    """Random source sentences: (B, S) token ids, PAD after each sentence's length."""
    B = len(lengths)
    nouns = torch.randint(1, 1 + N_NOUNS, (B, S), generator=gen)
    adjectives = torch.randint(1 + N_NOUNS, SRC_VOCAB, (B, S), generator=gen)
    is_adjective = torch.rand(B, S, generator=gen) < P_ADJECTIVE
    src = torch.where(is_adjective, adjectives, nouns)  # (B, S)
    real = torch.arange(S)[None, :] < lengths[:, None]  # (B, S)
    return src.masked_fill(~real, PAD)


def translate(src):
    """The reference translation of src (B, S) -> (tgt (B, S), align (B, S)): target word j
    is the dictionary's word for source word align[j], PAD (and align -1) past the end.
    An adjective followed by a noun swaps places with it; the pairs never overlap, since
    the second word of a pair is a noun and a pair starts with an adjective."""
    B, S = src.shape
    is_adjective = src > N_NOUNS  # (B, S)
    is_noun = (src >= 1) & ~is_adjective  # (B, S)
    starts = torch.zeros(B, S, dtype=torch.bool)
    starts[:, :-1] = is_adjective[:, :-1] & is_noun[:, 1:]  # an adjective, a noun after it
    seconds = torch.zeros(B, S, dtype=torch.bool)
    seconds[:, 1:] = starts[:, :-1]
    positions = torch.arange(S).expand(B, S)  # (B, S)
    align = positions + starts.long() - seconds.long()  # (B, S)
    source_word = torch.gather(src, 1, align)  # (B, S)
    tgt = torch.where(source_word == PAD, PAD, source_word + 2)  # the dictionary: w -> w + 2
    align = align.masked_fill(source_word == PAD, -1)
    return tgt, align


def batch(lengths, gen):
    """Source, target and alignment for sentences of the given lengths (B,): src (B, S),
    y_in (B, S + 1) the target after BOS, y_out (B, S + 1) the target then EOS (PAD after),
    align (B, S), with S the longest length."""
    S = int(lengths.max())
    src = words(lengths, S, gen)
    tgt, align = translate(src)  # (B, S)
    B = len(lengths)
    bos = torch.full((B, 1), BOS)
    pad = torch.full((B, 1), PAD)
    y_in = torch.cat([bos, tgt], dim=1)  # (B, S + 1)
    y_out = torch.cat([tgt, pad], dim=1)  # (B, S + 1)
    y_out[torch.arange(B), lengths] = EOS
    return src, y_in, y_out, align


def gpt_layout(src, y_out, s_max):
    """The same sentences as one sequence each for a decoder-only model: the source padded to
    s_max slots, SEP, the target, EOS. Padding to a fixed width puts target word j a fixed
    s_max + 1 positions after source word j whatever the length, so that a position can
    find its source word by position alone. Returns idx (B, s_max + S + 1) and targets, -1
    except where the next token is a target word or EOS (the loss skips -1)."""
    B, S = src.shape
    source = torch.full((B, s_max), PAD)
    source[:, :S] = src
    target = torch.where(y_out == PAD, PAD, y_out + SRC_VOCAB)  # (B, S + 1)
    sep = torch.full((B, 1), SEP)
    seq = torch.cat([source, sep, target], dim=1)  # (B, s_max + S + 2)
    idx = seq[:, :-1]
    targets = seq[:, 1:].clone()
    targets[:, :s_max] = -1  # the source is given, not predicted
    targets[targets == PAD] = -1
    return idx, targets


def gpt_prompt(src, s_max):
    """What a decoder-only model translates from: the source padded to s_max slots, then SEP
    -> (B, s_max + 1)."""
    B, S = src.shape
    prompt = torch.full((B, s_max + 1), PAD)
    prompt[:, :S] = src
    prompt[:, s_max] = SEP
    return prompt


def training_lengths(B, shortest, longest, gen, spread=4):
    """Lengths (B,) for one training batch: a batch length drawn with equal chance for each
    length, and every sentence within `spread` below it, so that a batch is nearly one
    length (cheap to run) and still has padding to mask."""
    top = int(torch.randint(shortest, longest + 1, (1,), generator=gen))
    low = max(shortest, top - spread)
    return torch.randint(low, top + 1, (B,), generator=gen)


def source_name(w):
    """A source word as text: nouns n1..n60, adjectives a1..a40."""
    if w > N_NOUNS:
        return f"a{w - N_NOUNS}"
    return f"n{w}"


def target_name(t):
    """A target word as text: the translation of n7 is N7, of a3 A3."""
    if t == EOS:
        return "<eos>"
    if t < 3:
        return "."
    return source_name(t - 2).upper()
