"""Blind attempts (blind-b) at ring_attention_merge: written from the stub and hints only."""
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import all_gather


def _positions(rank, n, c, balanced=True):
    if not balanced:
        return torch.arange(2 * rank * c, 2 * (rank + 1) * c)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * n - 1 - rank) * c, (2 * n - rank) * c)])


def _block(q, k, v, pq, pk, causal=True, dtype=torch.float32):
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    s = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~(pq[:, None] >= pk[None, :]), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    return torch.exp(s - safe[..., None]) @ v.to(dtype), lse


def _merge(out, lse, out_i, lse_i):
    new = torch.logaddexp(lse, lse_i)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    return (torch.exp(lse - safe)[..., None] * out + torch.exp(lse_i - safe)[..., None] * out_i), new


# correct, unusual: the ring turns the other way (send to rank-1, receive from rank+1), one stacked K/V buffer
def reverse_ring(ctx, q, k, v):
    r, n = ctx.rank, ctx.world_size
    c = q.shape[2] // 2
    pq = _positions(r, n, c)
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:3], float("-inf"))
    kv = torch.stack([k, v]).contiguous()
    for step in range(n):
        reqs = []
        if step < n - 1:
            nxt = torch.empty_like(kv)
            reqs = [dist.isend(kv, (r - 1) % n), dist.irecv(nxt, (r + 1) % n)]
        owner = (r + step) % n
        out_i, lse_i = _block(q, kv[0], kv[1], pq, _positions(owner, n, c))
        out, lse = _merge(out, lse, out_i, lse_i)
        for req in reqs:
            req.wait()
        if reqs:
            kv = nxt
    return out.to(q.dtype), lse


# correct, unusual: batch_isend_irecv with P2POp, and flash-attention's sigmoid form of the merge
def sigmoid_merge(ctx, q, k, v):
    r, n = ctx.rank, ctx.world_size
    c = q.shape[2] // 2
    pq = _positions(r, n, c)
    kk, vv = k.contiguous(), v.contiguous()
    out = lse = None
    for step in range(n):
        reqs = []
        if step < n - 1:
            nk, nv = torch.empty_like(kk), torch.empty_like(vv)
            ops = [dist.P2POp(dist.isend, kk, (r + 1) % n), dist.P2POp(dist.isend, vv, (r + 1) % n),
                   dist.P2POp(dist.irecv, nk, (r - 1) % n), dist.P2POp(dist.irecv, nv, (r - 1) % n)]
            reqs = dist.batch_isend_irecv(ops)
        out_i, lse_i = _block(q, kk, vv, pq, _positions((r - step) % n, n, c))
        if out is None:
            out, lse = out_i, lse_i
        else:
            out = out - torch.sigmoid(lse_i - lse)[..., None] * (out - out_i)
            lse = lse - F.logsigmoid(lse - lse_i)
        for req in reqs:
            req.wait()
        if reqs:
            kk, vv = nk, nv
    return out.to(q.dtype), lse


def _ring(ctx, q, k, v, balanced=True, causal=True, dtype=torch.float32, merge=_merge):
    r, n = ctx.rank, ctx.world_size
    c = q.shape[2] // 2
    pq = _positions(r, n, c, balanced)
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:3], float("-inf"))
    kk, vv = k.contiguous(), v.contiguous()
    for step in range(n):
        reqs = []
        if step < n - 1:
            nk, nv = torch.empty_like(kk), torch.empty_like(vv)
            reqs = [dist.isend(kk, (r + 1) % n), dist.irecv(nk, (r - 1) % n),
                    dist.isend(vv, (r + 1) % n), dist.irecv(nv, (r - 1) % n)]
        out_i, lse_i = _block(q, kk, vv, pq, _positions((r - step) % n, n, c, balanced), causal, dtype)
        out, lse = merge(out, lse, out_i.float(), lse_i.float())
        for req in reqs:
            req.wait()
        if reqs:
            kk, vv = nk, nv
    return out.to(q.dtype), lse.float()


# mistake (values right, wasteful): all-gathers every K/V block instead of passing them around the ring
def all_gather_kv(ctx, q, k, v):
    r, n = ctx.rank, ctx.world_size
    c = q.shape[2] // 2
    ks = [torch.empty_like(k) for _ in range(n)]
    vs = [torch.empty_like(v) for _ in range(n)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    pq = _positions(r, n, c)
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:3], float("-inf"))
    for j in range(n):
        out, lse = _merge(out, lse, *_block(q, ks[j], vs[j], pq, _positions(j, n, c)))
    return out.to(q.dtype), lse


# mistake (values right, wasteful): the same all-gather of K/V, via `from torch.distributed import all_gather`
def all_gather_kv_imported(ctx, q, k, v):
    r, n = ctx.rank, ctx.world_size
    c = q.shape[2] // 2
    ks = [torch.empty_like(k) for _ in range(n)]
    vs = [torch.empty_like(v) for _ in range(n)]
    all_gather(ks, k.contiguous())
    all_gather(vs, v.contiguous())
    pq = _positions(r, n, c)
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:3], float("-inf"))
    for j in range(n):
        out, lse = _merge(out, lse, *_block(q, ks[j], vs[j], pq, _positions(j, n, c)))
    return out.to(q.dtype), lse


# mistake: positions as if rank r held one contiguous block of 2c tokens (not chunks r and 2N-1-r)
def contiguous_positions(ctx, q, k, v):
    return _ring(ctx, q, k, v, balanced=False)


# mistake: no causal mask
def no_mask(ctx, q, k, v):
    return _ring(ctx, q, k, v, causal=False)


def _plain_sum(out, lse, out_i, lse_i):
    return out + out_i, torch.logaddexp(lse, lse_i)


# mistake: the blocks' outputs added without the exp(lse_i - lse) weights
def sum_without_weights(ctx, q, k, v):
    return _ring(ctx, q, k, v, merge=_plain_sum)


# mistake: scores and softmax in the input's dtype (bf16), not fp32
def scores_in_input_dtype(ctx, q, k, v):
    return _ring(ctx, q, k, v, dtype=q.dtype)


# mistake (raises at the caller): returns only out, not (out, lse)
def out_only(ctx, q, k, v):
    return _ring(ctx, q, k, v)[0]


CORRECT = [reverse_ring, sigmoid_merge]
WRONG = [
    (all_gather_kv, ("all-gather", "all_gather", "ring", "bytes")),
    (all_gather_kv_imported, ("all-gather", "all_gather", "ring", "bytes")),
    (contiguous_positions, ("2n-1-r", "load-balanced", "load balanced", "positions")),
    (no_mask, ("causal", "mask")),
    (sum_without_weights, ("log-sum-exp", "exp(lse", "weight", "merge")),
    (scores_in_input_dtype, ("fp32", "float32", "precision")),
    (out_only, ("tuple", "(out, lse)", "lse")),
]
