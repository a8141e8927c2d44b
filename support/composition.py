"""
How the heads of different layers work together, read from the weights alone:
the Q-, K- and V-composition scores of Elhage et al. (2021), "A Mathematical
Framework for Transformer Circuits".

A head writes into the residual stream through its OV circuit, W_OV = W_V W_O,
and a head of a later layer reads the stream three ways: through its query
and key (the bilinear form W_QK = W_Q W_K^T that sets its attention pattern)
and through its value (its own W_OV, what it moves). How much of what the
earlier head writes lands where the later one reads is

    Q-composition   |W_OV^1 W_QK^2|   / (|W_OV^1| |W_QK^2|)
    K-composition   |W_OV^1 W_QK^2^T| / (|W_OV^1| |W_QK^2|)
    V-composition   |W_OV^1 W_OV^2|   / (|W_OV^1| |W_OV^2|)

with |.| the Frobenius norm, in the row-vector convention (a residual vector
x is a row; the head writes x W_OV; the score of query q and key k is
q W_QK k^T). Each is 1 when the writer's output lies in the directions the
reader reads, and near 1/sqrt(n_embd)-ish for random matrices. An induction
head's key reads what a previous-token head wrote (K-composition: "attend to
the token whose predecessor is my token"), so its strongest K-composition
should come from the previous-token head.

The convention (TransformerLens's HookedTransformer.all_composition_scores on
weights processed with fold_ln=True and center_writing_weights=True, which
tests/test_composition.py checks):
  - LayerNorm folded: the reading matrices W_Q, W_K, W_V of a layer are
    C diag(g) W, with g the layer's ln_1 gain and C = I - 11^T/n_embd the
    centring LayerNorm applies; its division by the norm of the row is a
    scalar per token and drops out of every ratio;
  - writing centred: W_O is W_O C, since LayerNorm removes the mean anyway;
  - biases ignored (they add the same vector at every position);
  - rotary positions and QK-norm ignored: W_QK is the bilinear form of the
    query and key before they are turned and normalised (the scores are
    ratios of norms, so QK-norm's scale is no matter; its direction is);
  - grouped-query attention: a query head's W_K and W_V are those of the
    key/value head it reads.
"""

import numpy as np
import torch


def head_weights(model):
    """Every head's matrices as it reads and writes the residual stream, with the
    convention above: (W_Q, W_K, W_V) each (n_layer, n_head, C, hs) and W_O
    (n_layer, n_head, hs, C), in float32 on the CPU."""
    c = model.config
    C = c.n_embd
    hs = C // c.n_head
    group = c.n_head // c.n_kv_head
    centring = torch.eye(C) - torch.full((C, C), 1.0 / C)  # (C, C)
    queries, keys, values, outputs = [], [], [], []
    for block in model.transformer.h:
        # nn.Linear computes x @ weight.T, so the matrices that act on rows are the transposes
        w = block.attn.c_attn.weight.detach().float().cpu().T  # (C, C + 2 nkv hs)
        w_q, w_k, w_v = w.split([C, c.n_kv_head * hs, c.n_kv_head * hs], dim=1)
        reads = centring @ torch.diag(block.ln_1.weight.detach().float().cpu())  # (C, C)
        w_q = (reads @ w_q).view(C, c.n_head, hs).transpose(0, 1)  # (nh, C, hs)
        w_k = (reads @ w_k).view(C, c.n_kv_head, hs).transpose(0, 1)  # (nkv, C, hs)
        w_v = (reads @ w_v).view(C, c.n_kv_head, hs).transpose(0, 1)  # (nkv, C, hs)
        queries.append(w_q)
        keys.append(w_k.repeat_interleave(group, dim=0))  # (nh, C, hs)
        values.append(w_v.repeat_interleave(group, dim=0))  # (nh, C, hs)
        w_o = block.attn.c_proj.weight.detach().float().cpu().T @ centring  # (C, C)
        outputs.append(w_o.view(c.n_head, hs, C))  # (nh, hs, C)
    return torch.stack(queries), torch.stack(keys), torch.stack(values), torch.stack(outputs)


def triangular(matrix):
    """The (hs, hs) R of matrix = Q R (matrix (..., C, hs), Q's columns orthonormal):
    multiplying by Q keeps Frobenius norms, so |Q R M| = |R M| in (hs, hs) sizes."""
    return torch.linalg.qr(matrix, mode="r").R


def scores(writer, reader):
    """|A B| / (|A| |B|) for every writer A = left @ right and reader B = left @ right,
    each given as its factors (L, H, C, hs) and (L, H, hs, C): (L, H, L, H), entry
    [l1, h1, l2, h2] for writer (l1, h1) and reader (l2, h2). The (C, C) products are
    never formed: with left = Q_1 R_1 and right^T = Q_2 R_2, |left M right| is
    |R_1 M R_2^T|, an (hs, hs) matrix (what TransformerLens's FactoredMatrix does with an SVD)."""
    n_layer, n_head = writer[0].shape[:2]
    a_left, a_right = (m.flatten(0, 1) for m in writer)  # (LH, C, hs), (LH, hs, C)
    b_left, b_right = (m.flatten(0, 1) for m in reader)
    a_in = triangular(a_left)  # (LH, hs, hs)
    a_out = triangular(a_right.transpose(-2, -1)).transpose(-2, -1)  # (LH, hs, hs)
    b_in = triangular(b_left)
    b_out = triangular(b_right.transpose(-2, -1)).transpose(-2, -1)
    a_norm = torch.linalg.matrix_norm(a_in @ a_out)  # (LH,) |A|
    b_norm = torch.linalg.matrix_norm(b_in @ b_out)  # (LH,) |B|
    # one writer at a time: all pairs at once would hold (LH, LH, hs, hs), 0.3 GB for GPT-2
    both = torch.stack(
        [
            torch.linalg.matrix_norm(a_in[w] @ (a_right[w] @ b_left) @ b_out)  # (LH,) |A B|
            for w in range(len(a_in))
        ]
    )  # (LH, LH)
    ratio = both / (a_norm[:, None] * b_norm[None, :])
    return ratio.view(n_layer, n_head, n_layer, n_head)


@torch.no_grad()
def composition_scores(model):
    """{"q", "k", "v"}: float32 tensors (n_layer, n_head, n_layer, n_head); entry
    [l1, h1, l2, h2] is how much head (l1, h1)'s output (W_OV) composes into head
    (l2, h2)'s query (W_QK), key (W_QK^T) or value (W_OV) input. NaN where
    l2 <= l1: a head reads only what earlier layers wrote."""
    w_q, w_k, w_v, w_o = head_weights(model)
    ov = (w_v, w_o)  # W_OV = W_V W_O
    qk = (w_q, w_k.transpose(-2, -1))  # W_QK = W_Q W_K^T
    qk_transposed = (w_k, w_q.transpose(-2, -1))  # W_QK^T = W_K W_Q^T
    found = {"q": scores(ov, qk), "k": scores(ov, qk_transposed), "v": scores(ov, ov)}
    layer = torch.arange(model.config.n_layer)
    later = layer[:, None, None, None] < layer[None, None, :, None]  # (L, 1, L, 1)
    return {name: s.masked_fill(~later, float("nan")) for name, s in found.items()}


def strongest(scores, layer, head):
    """The earlier head (l1, h1) with the largest score into (layer, head), and the
    score; None for a head of layer 0, which reads no other head."""
    into = scores[:layer, :, layer, head]  # (layer, H)
    if into.numel() == 0:
        return None
    best = int(torch.argmax(into))
    n_head = into.shape[1]
    return (best // n_head, best % n_head), float(into.flatten()[best])


def as_lists(scores):
    """A score tensor as nested lists for JSON, rounded, None where it is NaN."""
    flat = [None if np.isnan(v) else round(v, 4) for v in scores.flatten().tolist()]
    return np.array(flat, dtype=object).reshape(scores.shape).tolist()
