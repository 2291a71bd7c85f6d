"""Attempts for ring_attention_merge(ctx, q, k, v) -> (out, lse), q, k, v this rank's chunks r and 2N-1-r."""
import torch
import torch.distributed as dist


def _positions(rank, n, c):
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * n - 1 - rank) * c, (2 * n - rank) * c)])


def _blocks(ctx, k, v, backwards=False):
    """Yields (owner, k, v) for the N blocks, passing (k, v) around the ring with blocking send/recv
    ordered by parity (even ranks send first); ``backwards``: towards rank r-1."""
    n, r = ctx.world_size, ctx.rank
    to, frm = ((r - 1) % n, (r + 1) % n) if backwards else ((r + 1) % n, (r - 1) % n)
    for step in range(n):
        yield ((r + step) % n if backwards else (r - step) % n), k, v
        if step == n - 1:
            break
        new_k, new_v = torch.empty_like(k), torch.empty_like(v)
        if r % 2 == 0:
            dist.send(k.contiguous(), to)
            dist.send(v.contiguous(), to)
            dist.recv(new_k, frm)
            dist.recv(new_v, frm)
        else:
            dist.recv(new_k, frm)
            dist.recv(new_v, frm)
            dist.send(k.contiguous(), to)
            dist.send(v.contiguous(), to)
        k, v = new_k, new_v


# ---------------------------------------------------------------- correct
def flash_style(ctx, q, k, v):
    """Unnormalised accumulator with a running max (FlashAttention's m, l, acc), blocking sends by parity, K and V
    as two messages; lse = m + log l at the end. Fully masked blocks are skipped."""
    n, c, d = ctx.world_size, q.shape[2] // 2, q.shape[-1]
    mine = _positions(ctx.rank, n, c)
    qf = q.float()
    m = torch.full(q.shape[:-1], float("-inf"))
    l = torch.zeros(q.shape[:-1])
    acc = torch.zeros(q.shape, dtype=torch.float32)
    for owner, kb, vb in _blocks(ctx, k, v):
        mask = mine[:, None] >= _positions(owner, n, c)[None, :]
        if not mask.any():
            continue
        s = (qf @ kb.float().transpose(-1, -2)) / d ** 0.5
        s = torch.where(mask, s, torch.tensor(float("-inf")))
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - safe[..., None])
        alpha = torch.exp(m - safe)
        l = alpha * l + p.sum(-1)
        acc = alpha[..., None] * acc + p @ vb.float()
        m = m_new
    return (acc / l[..., None]).to(q.dtype), m + torch.log(l)


def backwards_ring_per_chunk(ctx, q, k, v):
    """K/V passed towards rank r-1; the mask worked out per pair of chunks (full, diagonal or none) instead of from
    a position matrix; the merge in fp32 with logaddexp."""
    n, c, d = ctx.world_size, q.shape[2] // 2, q.shape[-1]
    chunk_ids = lambda rank: (rank, 2 * n - 1 - rank)  # noqa: E731
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:-1], float("-inf"))
    qf = q.float() / d ** 0.5
    for owner, kb, vb in _blocks(ctx, k, v, backwards=True):
        for qi, qchunk in enumerate(chunk_ids(ctx.rank)):
            rows = slice(qi * c, (qi + 1) * c)
            for ki, kchunk in enumerate(chunk_ids(owner)):
                if kchunk > qchunk:
                    continue
                s = qf[:, :, rows] @ kb[:, :, ki * c:(ki + 1) * c].float().transpose(-1, -2)
                if kchunk == qchunk:
                    s = s.masked_fill(torch.ones(c, c, dtype=torch.bool).triu(1), float("-inf"))
                block_lse = torch.logsumexp(s, -1)
                block_out = torch.softmax(s, -1) @ vb[:, :, ki * c:(ki + 1) * c].float()
                new = torch.logaddexp(lse[:, :, rows], block_lse)
                out[:, :, rows] = (torch.exp(lse[:, :, rows] - new)[..., None] * out[:, :, rows]
                                   + torch.exp(block_lse - new)[..., None] * block_out)
                lse[:, :, rows] = new
    return out.to(q.dtype), lse


CORRECT = [flash_style, backwards_ring_per_chunk]


# ---------------------------------------------------------------- wrong
def _merge_ring(ctx, q, k, v, *, scale=True, mask_rule="global", merge="lse", dtype=torch.float32, nan_safe=True,
                out_dtype=None):
    """One ring with a choice of the classic mistakes (``dtype``: scores and lse; ``out_dtype``: the accumulator)."""
    n, r, c, d = ctx.world_size, ctx.rank, q.shape[2] // 2, q.shape[-1]
    mine = _positions(r, n, c)
    out = torch.zeros(q.shape, dtype=out_dtype or dtype)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=dtype)
    for owner, kb, vb in _blocks(ctx, k, v):
        if mask_rule == "global":
            mask = mine[:, None] >= _positions(owner, n, c)[None, :]
        elif mask_rule == "contiguous":  # rank r taken to hold block r of N
            mask = (torch.full((2 * c, 2 * c), owner < r) | (torch.ones(2 * c, 2 * c, dtype=torch.bool).tril()
                                                              & torch.tensor(owner == r)))
        if not mask.any():
            continue
        s = (q.to(dtype) @ kb.to(dtype).transpose(-1, -2)) * (d ** -0.5 if scale else 1.0)
        s = s.masked_fill(~mask, float("-inf"))
        block_lse = torch.logsumexp(s, -1)
        if nan_safe:
            block_out = torch.exp(s - torch.where(torch.isinf(block_lse), 0, block_lse)[..., None]) @ vb.to(dtype)
        else:
            block_out = torch.exp(s - block_lse[..., None]) @ vb.to(dtype)
        new = torch.logaddexp(lse, block_lse)
        safe = torch.where(torch.isinf(new), 0, new)
        if merge == "lse":
            out = (torch.exp(lse - safe)[..., None] * out + torch.exp(block_lse - safe)[..., None] * block_out).to(out.dtype)
        else:  # the partial outputs added as they are
            out = out + torch.nan_to_num(block_out)
        lse = new
    return out.to(q.dtype), lse.float() if dtype == torch.float32 else lse


def no_rescale(ctx, q, k, v):
    return _merge_ring(ctx, q, k, v, merge="sum")


def contiguous_mask(ctx, q, k, v):
    return _merge_ring(ctx, q, k, v, mask_rule="contiguous")


def no_scale(ctx, q, k, v):
    return _merge_ring(ctx, q, k, v, scale=False)


def nan_in_masked_rows(ctx, q, k, v):
    return _merge_ring(ctx, q, k, v, nan_safe=False)


def statistics_in_input_dtype(ctx, q, k, v):
    """Everything in q's dtype: fine for float32 inputs, bf16 statistics for bf16 ones."""
    return _merge_ring(ctx, q, k, v, dtype=q.dtype)


def output_accumulated_in_input_dtype(ctx, q, k, v):
    """fp32 scores and lse, but the output accumulator kept in q's dtype (bf16: rounded at every merge)."""
    return _merge_ring(ctx, q, k, v, out_dtype=q.dtype)


def all_gather_kv(ctx, q, k, v):
    """Right values, but K/V all-gathered (Llama 3's CP): every rank holds the whole sequence's K/V."""
    n, c, d = ctx.world_size, q.shape[2] // 2, q.shape[-1]
    ks = [torch.empty_like(k) for _ in range(n)]
    vs = [torch.empty_like(v) for _ in range(n)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    pos = torch.cat([_positions(o, n, c) for o in range(n)])
    s = (q.float() @ torch.cat(ks, 2).float().transpose(-1, -2)) / d ** 0.5
    s = s.masked_fill(~(_positions(ctx.rank, n, c)[:, None] >= pos[None, :]), float("-inf"))
    return (torch.softmax(s, -1) @ torch.cat(vs, 2).float()).to(q.dtype), torch.logsumexp(s, -1)


def one_hop_too_many(ctx, q, k, v):
    """Right values, but the blocks travel N times: the last hop only brings the rank's own block back."""
    n, r = ctx.world_size, ctx.rank
    result = _merge_ring(ctx, q, k, v)
    kv = torch.stack([k, v])
    back = torch.empty_like(kv)
    works = [dist.isend(kv, (r + 1) % n), dist.irecv(back, (r - 1) % n)]
    for w in works:
        w.wait()
    return result


def straight_to_everyone(ctx, q, k, v):
    """Right values, but the K/V block is sent to every other rank directly (an all-gather by messages)."""
    n, r, c, d = ctx.world_size, ctx.rank, q.shape[2] // 2, q.shape[-1]
    kv = torch.stack([k, v])
    got = {r: kv}
    works = []
    for other in range(n):
        if other != r:
            got[other] = torch.empty_like(kv)
            works += [dist.isend(kv, other), dist.irecv(got[other], other)]
    for w in works:
        w.wait()
    pos = torch.cat([_positions(o, n, c) for o in range(n)])
    keys = torch.cat([got[o][0] for o in range(n)], 2).float()
    values = torch.cat([got[o][1] for o in range(n)], 2).float()
    s = (q.float() @ keys.transpose(-1, -2)) / d ** 0.5
    s = s.masked_fill(~(_positions(r, n, c)[:, None] >= pos[None, :]), float("-inf"))
    return (torch.softmax(s, -1) @ values).to(q.dtype), torch.logsumexp(s, -1)


WRONG = [
    (no_rescale, "rescale"),
    (contiguous_mask, "contiguous block"),
    (no_scale, "1/√d"),
    (nan_in_masked_rows, "nan"),
    (statistics_in_input_dtype, "fp32"),
    (output_accumulated_in_input_dtype, "output accumulator in fp32"),
    (all_gather_kv, "all-gather cp"),
    (one_hop_too_many, "n-1 hops"),
    (straight_to_everyone, "one neighbour"),
]
