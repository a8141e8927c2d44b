"""ring_attention.py against the explicit model.attention with the causal mask:
blockwise on one device, and the ring over 2 and 4 CPU processes joined by gloo,
forward and backward, with and without grouped-query attention, contiguous and
zigzag, pieces that are not a multiple of the block."""

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model import attention, causal_mask
from support.distributed import join_forked
from support.ring_attention import (
    Ring,
    blockwise_attention,
    pairs,
    ring_attention,
    sequence_positions,
    split_sequence,
)


def explicit(q, k, v):
    """The oracle: model.attention with the causal mask, key/value heads repeated for GQA."""
    g = q.size(1) // k.size(1)
    T = q.size(2)
    return attention(
        q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), causal_mask(T, T, device=q.device)
    )[0]


def inputs(B, nh, nkv, T, hs, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, T, hs, generator=gen) for n in (nh, nkv, nkv))
    return q, k, v, torch.randn(B, nh, T, hs, generator=gen)  # w: the loss is (out * w).sum()


def grads(fn, q, k, v, w):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    (out * w).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize(
    "nh, nkv, T, block", [(4, 4, 37, 8), (4, 2, 50, 7), (2, 1, 300, 64), (3, 3, 5, 256)]
)
def test_blockwise_equals_explicit_attention(nh, nkv, T, block):
    q, k, v, w = inputs(2, nh, nkv, T, 16)
    ours, reference = (
        grads(lambda *a: blockwise_attention(*a, block=block), q, k, v, w),
        grads(explicit, q, k, v, w),
    )
    torch.testing.assert_close(ours[0], reference[0], rtol=0, atol=1e-5)
    for name, a, b in zip("qkv", ours[1:], reference[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4, msg=f"gradient of {name}")


def test_blockwise_never_holds_the_whole_score_matrix(monkeypatch):
    from support import ring_attention

    T, block, shapes = 64, 16, []
    original = ring_attention.attend_block
    monkeypatch.setattr(
        ring_attention,
        "attend_block",
        lambda q, k, *rest: shapes.append((q.size(-2), k.size(-2))) or original(q, k, *rest),
    )
    q, k, v, _ = inputs(1, 2, 2, T, 8)
    torch.testing.assert_close(
        blockwise_attention(q, k, v, block), explicit(q, k, v), rtol=0, atol=1e-5
    )
    # (queries, keys) of each block: at most T x block scores, and the queries
    # before a key block (which see none of it) are left out
    assert shapes == [(64, 16), (48, 16), (32, 16), (16, 16)]


@pytest.mark.parametrize("zigzag", [False, True])
def test_causal_skipping_and_balance(zigzag):
    """The block pairs each rank computes at each step of a ring of 4: never a key
    after a query; with zigzag, every rank does the same work at every step."""
    P, c = 4, 6
    n = 2 * P if zigzag else P
    work = {}
    for rank in range(P):
        mine = [rank, 2 * P - 1 - rank] if zigzag else [rank]
        for step in range(P):
            source = (rank - step) % P
            theirs = [source, 2 * P - 1 - source] if zigzag else [source]
            cells = 0
            for rows, cols, mask in pairs(mine, theirs, c, block=4):
                q_pos = torch.tensor(
                    [mine[i // c] * c + i % c for i in range(rows.start, rows.stop)]
                )
                k_pos = torch.tensor(
                    [theirs[j // c] * c + j % c for j in range(cols.start, cols.stop)]
                )
                visible = q_pos[:, None] >= k_pos[None, :]
                assert visible.any(dim=1).all()  # every query row sees a key of the block
                assert torch.equal(visible, mask if mask is not None else torch.ones_like(visible))
                cells += int(visible.sum())
            work[rank, step] = cells
    assert sum(work.values()) == (n * c) * (n * c + 1) // 2  # every (query, earlier key) pair once
    per_step = [[work[r, s] for r in range(P)] for s in range(1, P)]
    if zigzag:
        assert all(len(set(row)) == 1 for row in per_step)
    else:
        # rank 0 idles after its own chunk
        assert all(row[0] == 0 and row[-1] > 0 for row in per_step)


def worker(rank, size, init_file, cases, out_dir):
    join_forked(rank, size, init_file, timeout_s=60)
    try:
        results = {}
        pairs_of_two = [dist.new_group([0, 1]), dist.new_group([2, 3])] if size == 4 else None
        for name, (q, k, v, w, zigzag, block) in cases.items():
            group, r, n = None, rank, size
            if name.startswith("subgroup"):  # two rings of 2 inside a world of 4
                group, r, n = pairs_of_two[rank // 2], rank % 2, 2
            mine = [split_sequence(t, r, n, zigzag, dim=2) for t in (q, k, v, w)]
            results[name] = grads(
                lambda *a: ring_attention(*a, group=group, zigzag=zigzag, block=block), *mine
            )
        torch.save(results, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_ranks(fn, size, args, timeout=120):
    """fn(rank, *args) in size forked processes; a rank that waits forever (a
    send nobody receives) fails the test instead of hanging it."""
    context = mp.start_processes(fn, args=args, nprocs=size, start_method="fork", join=False)
    deadline = time.time() + timeout
    while not context.join(timeout=1):
        if time.time() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {size} processes did not finish within {timeout} s")


def gathered(parts, size, zigzag, T):
    """The whole (B, nh, T, hs) tensors from each rank's part, in sequence order."""
    full = torch.empty(*parts[0].shape[:2], T, parts[0].size(-1))
    for rank, part in enumerate(parts):
        full[:, :, sequence_positions(T, rank, size, zigzag)] = part
    return full


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.exclusive
def test_ring_equals_explicit_attention(size, tmp_path):
    # T / P is not a multiple of the block (5), nor is any zigzag piece
    T, cases = 56, {}
    for zigzag in (False, True):
        for nh, nkv in ((4, 4), (4, 2)):
            name = f"{'zigzag' if zigzag else 'contiguous'}-{nh}/{nkv}"
            cases[name] = (*inputs(2, nh, nkv, T, 8, seed=nkv), zigzag, 5)
    if size == 4:
        cases["subgroup-zigzag-4/1"] = (*inputs(1, 4, 1, 24, 8, seed=3), True, 4)
    run_ranks(worker, size, (size, str(tmp_path / "init"), cases, str(tmp_path)))
    results = [torch.load(tmp_path / f"{rank}.pt") for rank in range(size)]
    for name, (q, k, v, w, zigzag, block) in cases.items():
        reference = grads(explicit, q, k, v, w)
        ranks = [range(2), range(2, 4)] if name.startswith("subgroup") else [range(size)]
        for members in ranks:
            n = len(members)
            for i, what in enumerate(["output", "dq", "dk", "dv"]):
                ours = gathered([results[r][name][i] for r in members], n, zigzag, q.size(2))
                torch.testing.assert_close(
                    ours,
                    reference[i],
                    rtol=0,
                    atol=1e-5 if i == 0 else 1e-4,
                    msg=f"{name}, {what}, P = {n}",
                )


def test_uneven_inputs_are_refused():
    q, k, v, _ = inputs(1, 4, 3, 8, 4)
    with pytest.raises(ValueError, match="evenly"):
        blockwise_attention(q, k, v)
    ring = Ring(single=True)
    ring.zigzag = True
    q, k, v, _ = inputs(1, 2, 2, 7, 4)
    with pytest.raises(ValueError, match="even number of tokens"):
        ring_attention(q, k, v, ring=ring)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_blockwise_attention_on_cuda(float32_cuda_matmuls):
    q, k, v, w = (t.cuda() for t in inputs(2, 4, 2, 300, 16))
    ours, reference = (
        grads(lambda *a: blockwise_attention(*a, block=64), q, k, v, w),
        grads(explicit, q, k, v, w),
    )
    torch.testing.assert_close(ours[0], reference[0], rtol=0, atol=1e-5)
    for a, b in zip(ours[1:], reference[1:]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    # bfloat16: the accumulators stay float32, so it is as close to SDPA as SDPA's own rounding
    q, k, v = (t.bfloat16() for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )
    torch.testing.assert_close(blockwise_attention(q, k, v, 64), sdpa, rtol=2e-2, atol=2e-2)
