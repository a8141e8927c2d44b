"""
Exact causal attention without the n x n matrix: one block of keys at a time.

Explicit attention (model.attention) builds every score of a T-token sequence
at once, a T x T matrix per head: at T = 16384 that is 268 million scores,
1 GiB in float32, for one head of one layer. Nothing about softmax needs them
all at once. This file computes the same output visiting the keys block by
block, keeping per query only three running quantities:

    m      the largest score seen so far       (the softmax's shift, for exp)
    denom  the sum of exp(score - m) so far    (the softmax's denominator)
    acc    the sum of exp(score - m) * value   (the output before dividing by denom)

When a new block raises the maximum from m to m', everything summed so far was
weighted against the old maximum: multiplying denom and acc by exp(m - m') puts it
on the new one, and the block's own terms are added. After the last block the
output is acc / denom, exactly softmax(scores) @ v, and m + log(denom) is the
log-sum-exp of the query's scores, all that the backward pass needs to
recompute any block's weights. Memory goes from T x T scores to T x block.

That is the online softmax of FlashAttention (Dao et al. 2022), which runs it
on one GPU's on-chip memory, and of Ring attention (Liu et al. 2023), which
runs it across devices: each of P processes holds 1/P of the sequence
(its queries, keys and values); the key/value chunks travel round a ring of
processes, and each process merges every chunk it receives into its queries'
running m, denom, acc. The transfer of the next chunk overlaps the compute on this
one. The backward pass sends the chunks round again, now with their key/value
gradients, which arrive home after a full turn.

Causal attention makes the ring uneven: with contiguous chunks, rank 0's
queries see only its own chunk while rank P-1's see all P. The zigzag layout
cuts the sequence into 2P pieces and gives rank r pieces r and 2P-1-r (one
early, one late), so every rank does the same work at every step
(docs/ring_attention.md has the picture and the measured idle time).

    blockwise_attention(q, k, v, block)     one device
    ring_attention(q, k, v, group, zigzag)  the sequence split over a process group
    split_sequence, sequence_positions      which tokens a rank holds, in either layout

Shapes: q (B, nh, T, hs), k and v (B, n_kv_head, T, hs); n_kv_head may divide
nh (grouped-query attention). Differentiable in all of q, k, v.
"""

import math
import time

import torch
import torch.distributed as dist

BLOCK = 256  # keys per block: peak memory grows like T x BLOCK


# The online softmax, written once ----------
def attend_block(q, k, v, mask, scale, m, denom, acc):
    """Merge one block of keys into the running state of the queries q.
    q (..., Tq, hs); k, v (..., Tb, hs); mask (Tq, Tb) bool or None; m, denom (..., Tq)
    and acc (..., Tq, hs) float32, updated in place. Every query must see at least
    one key of the block: then the new maximum is finite and exp() is never NaN."""
    s = (q @ k.transpose(-2, -1)).float() * scale  # (..., Tq, Tb)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m_new = torch.maximum(m, s.amax(dim=-1))
    p = torch.exp(s - m_new[..., None])  # this block's weights, before normalising
    rescale = torch.exp(m - m_new)  # the earlier blocks were weighted against the old maximum
    denom.mul_(rescale).add_(p.sum(dim=-1))
    acc.mul_(rescale[..., None]).add_((p.to(v.dtype) @ v).float())
    m.copy_(m_new)


def attend_block_backward(q, k, v, mask, scale, dout, lse, delta):
    """Gradients (dq, dk, dv) of one block, from the forward's log-sum-exp lse
    (..., Tq), which gives back the block's exact weights, and delta = rowsum(dout *
    out) (..., Tq): softmax's backward needs sum_j p_ij dp_ij, which equals it."""
    s = (q @ k.transpose(-2, -1)).float() * scale  # (..., Tq, Tb)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.exp(s - lse[..., None])  # the forward's normalised weights
    dv = p.to(dout.dtype).transpose(-2, -1) @ dout  # (..., Tb, hs)
    dp = (dout @ v.transpose(-2, -1)).float()  # (..., Tq, Tb)
    ds = (p * (dp - delta[..., None]) * scale).to(q.dtype)
    return ds @ k, ds.transpose(-2, -1) @ q, dv  # dq (..., Tq, hs), dk and dv (..., Tb, hs)


def pairs(q_pieces, k_pieces, c, block, device=None):
    """The work of one ring step: (query rows, key columns, mask) for every block
    of keys that some query may see. Pieces are indices of c-token stretches of
    the sequence; a key piece after a query piece is skipped whole, one before it
    is seen whole, and a piece against itself is the causal triangle, where the
    queries before a key block see none of it and are left out."""
    for qi, qp in enumerate(q_pieces):
        for kj, kp in enumerate(k_pieces):
            if kp > qp:
                continue  # entirely in these queries' future
            for j0 in range(0, c, block):
                j1 = min(j0 + block, c)
                first = j0 if kp == qp else 0  # query i sees key j only if j <= i
                rows = slice(qi * c + first, (qi + 1) * c)
                cols = slice(kj * c + j0, kj * c + j1)
                mask = None
                if kp == qp:
                    mask = (
                        torch.arange(first, c, device=device)[:, None]
                        >= torch.arange(j0, j1, device=device)[None, :]
                    )
                yield rows, cols, mask


# Which tokens a rank holds ----------
def pieces_of(rank, size, zigzag):
    """The pieces of the sequence a rank holds, in order: P pieces, rank r holding
    piece r, or with zigzag 2P pieces, rank r holding r and 2P-1-r."""
    return [rank, 2 * size - 1 - rank] if zigzag else [rank]


def split_sequence(x, rank, size, zigzag=False, dim=1):
    """This rank's part of x along dim (a whole sequence, or a batch of them)."""
    pieces = x.chunk(2 * size if zigzag else size, dim=dim)
    return torch.cat([pieces[i] for i in pieces_of(rank, size, zigzag)], dim=dim)


def sequence_positions(length, rank, size, zigzag=False, device=None):
    """The positions (length / size,) in the whole sequence of this rank's tokens."""
    return split_sequence(torch.arange(length, device=device), rank, size, zigzag, dim=0)


def check_length(length, size, zigzag):
    """A sequence of length tokens must split into equal pieces."""
    n = 2 * size if zigzag else size
    if length % n:
        raise ValueError(
            f"a sequence of {length} tokens does not split into {n} equal pieces for "
            f"{size} processes{' in the zigzag layout' if zigzag else ''}; use a length "
            f"divisible by {n}"
        )


# The ring ----------
class Ring:
    """The processes of a group in a ring: each sends to the next and receives
    from the previous. size 1 (no group) is one process: blockwise attention."""

    def __init__(self, group=None, zigzag=False, single=False):
        self.group = group
        self.zigzag = zigzag
        self.times = None
        if single:
            self.size = 1
            self.rank = 0
            return
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

        def peer(r):
            """Point-to-point ops name their peer by its rank in the whole world."""
            if group is None:
                return r
            return dist.get_global_rank(group, r)

        self.next = peer((self.rank + 1) % self.size)
        self.prev = peer((self.rank - 1) % self.size)

    def exchange(self, tensors, tag=0):
        """Start sending tensors to the next process while receiving the previous
        one's; returns a function that waits and gives the received ones."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group, tag) for t in received]
        requests = dist.batch_isend_irecv(ops)

        def wait():
            for request in requests:
                request.wait()
            del tensors[:]  # sent: no longer needed
            return received

        return wait

    def turn(self, *tensors):
        """Iterate over the ring's steps: yields (source rank, its tensors), first
        this rank's own, and has already started fetching the next step's."""
        for step in range(self.size):
            pending = self.exchange(list(tensors)) if step < self.size - 1 else None
            started = time.thread_time()
            yield (self.rank - step) % self.size, tensors
            if self.times is not None:  # compute time of each step (docs/ring_attention.md)
                self.times.append(time.thread_time() - started)
            if pending is not None:
                tensors = tuple(pending())

    def work(self, source, c, block, device):
        return pairs(
            pieces_of(self.rank, self.size, self.zigzag),
            pieces_of(source, self.size, self.zigzag),
            c,
            block,
            device,
        )


def grouped(q, n_kv_head):
    """(B, nh, T, hs) -> (B, n_kv_head, group, T, hs): the query heads that share a
    key/value head side by side, so that one k (B, n_kv_head, 1, T, hs) broadcasts."""
    return q.unflatten(1, (n_kv_head, q.size(1) // n_kv_head))


def ring_forward(ring, q, k, v, block):
    """(out (B, nh, T, hs), lse (B, nkv, g, T) float32) for this rank's queries."""
    q5 = grouped(q, k.size(1))
    scale = 1.0 / math.sqrt(q.size(-1))
    pieces = len(pieces_of(0, ring.size, ring.zigzag))
    c = q.size(2) // pieces  # tokens per piece
    m = torch.full(q5.shape[:-1], float("-inf"), device=q.device)
    denom = torch.zeros(q5.shape[:-1], device=q.device)
    acc = torch.zeros(q5.shape, device=q.device)
    for source, (k_, v_) in ring.turn(k, v):
        k_, v_ = k_.unsqueeze(2), v_.unsqueeze(2)  # (B, nkv, 1, T, hs)
        for rows, cols, mask in ring.work(source, c, block, q.device):
            attend_block(
                q5[..., rows, :],
                k_[..., cols, :],
                v_[..., cols, :],
                mask,
                scale,
                m[..., rows],
                denom[..., rows],
                acc[..., rows, :],
            )
    out = (acc / denom[..., None]).to(q.dtype).flatten(1, 2)
    return out, m + denom.log()


def ring_backward(ring, q, k, v, out, lse, dout, block):
    """(dq, dk, dv): the key/value chunks go round with their gradients so far;
    after a whole turn each chunk's gradients are back with its own rank."""
    n_kv = k.size(1)
    q5, dout5 = grouped(q, n_kv), grouped(dout, n_kv)
    delta = (dout5.float() * grouped(out, n_kv).float()).sum(-1)  # (B, nkv, g, T)
    scale = 1.0 / math.sqrt(q.size(-1))
    pieces = len(pieces_of(0, ring.size, ring.zigzag))
    c = q.size(2) // pieces
    dq = torch.zeros(q5.shape, device=q.device)
    grads_in_flight = None
    for step, (source, (k_, v_)) in enumerate(ring.turn(k, v)):
        k5, v5 = k_.unsqueeze(2), v_.unsqueeze(2)
        dk = torch.zeros(k5.shape, device=k.device)  # this rank's share for this chunk
        dv = torch.zeros(v5.shape, device=v.device)
        for rows, cols, mask in ring.work(source, c, block, q.device):
            dq_b, dk_b, dv_b = attend_block_backward(
                q5[..., rows, :],
                k5[..., cols, :],
                v5[..., cols, :],
                mask,
                scale,
                dout5[..., rows, :],
                lse[..., rows],
                delta[..., rows],
            )
            dq[..., rows, :] += dq_b
            # summed over the heads of a group
            dk[..., cols, :] += dk_b.float().sum(2, keepdim=True)
            dv[..., cols, :] += dv_b.float().sum(2, keepdim=True)
        if grads_in_flight is not None:  # the previous ranks' shares for the same chunk
            dk_in, dv_in = grads_in_flight()
            dk, dv = dk + dk_in, dv + dv_in
        grads_in_flight = (
            ring.exchange([dk, dv], tag=1) if ring.size > 1 else (lambda dk=dk, dv=dv: (dk, dv))
        )
    dk, dv = grads_in_flight()  # after the last step: this rank's own chunk
    return dq.flatten(1, 2).to(q.dtype), dk.squeeze(2).to(k.dtype), dv.squeeze(2).to(v.dtype)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, block):
        out, lse = ring_forward(ring, q, k, v, block)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.block = ring, block
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(ctx.ring, q, k, v, out, lse, dout.contiguous(), ctx.block)
        return dq, dk, dv, None, None


def check_shapes(q, k, v):
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(
            f"expected q (B, nh, T, hs) and k, v (B, n_kv_head, T, hs), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.size(1) % k.size(1):
        raise ValueError(f"{q.size(1)} query heads do not share {k.size(1)} key/value heads evenly")


def blockwise_attention(q, k, v, block=BLOCK):
    """Causal attention on one device, block keys at a time: equal to
    model.attention with the causal mask, never holding more than T x block scores."""
    check_shapes(q, k, v)
    return RingAttention.apply(q, k, v, Ring(single=True), block)


def ring_attention(q, k, v, group=None, zigzag=False, block=BLOCK, ring=None):
    """Causal attention of a sequence split over the processes of group (default:
    all). Each holds its part (B, nh, T/P, hs) of q and (B, n_kv_head, T/P, hs) of
    k and v: chunk r of P on rank r, or with zigzag pieces r and 2P-1-r of 2P
    (split_sequence). Returns this rank's output (B, nh, T/P, hs)."""
    check_shapes(q, k, v)
    ring = ring or Ring(group, zigzag)
    if q.size(2) % len(pieces_of(0, ring.size, ring.zigzag)):
        raise ValueError(
            f"the zigzag layout needs an even number of tokens per rank, got {q.size(2)}"
        )
    return RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), ring, block)
