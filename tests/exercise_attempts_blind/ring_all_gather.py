"""Blind attempts at ring_all_gather (written without the reference)."""
import torch
import torch.distributed as dist


def _exchange(ctx, send, to, recv, frm):
    works = [ctx.comm.isend(send, to), ctx.comm.irecv(recv, frm)]
    for w in works:
        w.wait()


# unusual: the other direction (send to r-1, receive from r+1): at step k pass on piece (r+k) and get (r+k+1)
def counter_clockwise(ctx, piece):
    n, r, size = ctx.world_size, ctx.rank, piece.numel()
    out = torch.empty(n * size, dtype=piece.dtype)
    slots = out.split(size)
    slots[r].copy_(piece.reshape(-1))
    for k in range(n - 1):
        _exchange(ctx, slots[(r + k) % n], (r - 1) % n, slots[(r + k + 1) % n], (r + 1) % n)
    return out


# unusual: dist.batch_isend_irecv into a dict of received pieces, joined with torch.cat at the end
def batched_then_cat(ctx, piece):
    n, r = dist.get_world_size(), dist.get_rank()
    have = {r: piece.reshape(-1).clone()}
    for k in range(n - 1):
        incoming = torch.empty_like(have[r])
        ops = [dist.P2POp(dist.isend, have[(r - k) % n], (r + 1) % n),
               dist.P2POp(dist.irecv, incoming, (r - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        have[(r - k - 1) % n] = incoming
    return torch.cat([have[i] for i in range(n)])


def _gather(ctx, piece, steps=None, order_by_arrival=False):
    n, r = ctx.world_size, ctx.rank
    flat = piece.reshape(-1).clone()
    got, current = [flat], flat
    for _ in range(n - 1 if steps is None else steps):
        buf = torch.empty_like(flat)
        _exchange(ctx, current, (r + 1) % n, buf, (r - 1) % n)
        got.append(buf)
        current = buf
    if order_by_arrival:
        return torch.cat(got)
    by_rank = {(r - k) % n: t for k, t in enumerate(got)}
    return torch.cat([by_rank.get(i, torch.zeros_like(flat)) for i in range(n)])


# wrong: pieces concatenated in the order they arrived, not in rank order
def arrival_order(ctx, piece):
    return _gather(ctx, piece, order_by_arrival=True)


# wrong: stacked as an N x piece 2-D tensor, not flattened
def stacked_2d(ctx, piece):
    return _gather(ctx, piece).view(ctx.world_size, -1)


# wrong: calls the all_gather collective instead of a ring of messages
def uses_all_gather(ctx, piece):
    out = [torch.empty(piece.numel()) for _ in range(ctx.world_size)]
    dist.all_gather(out, piece.reshape(-1).contiguous())
    return torch.cat(out)


# wrong (wasteful): forwards everything gathered so far each step, the buffer growing (more than (N-1)/N·S bytes)
def forwards_everything(ctx, piece):
    n, r = ctx.world_size, ctx.rank
    flat = piece.reshape(-1).clone()
    have = {r: flat}
    for k in range(n - 1):
        mine = torch.cat([have[(r - j) % n] for j in range(k + 1)])
        buf = torch.empty_like(mine)
        _exchange(ctx, mine, (r + 1) % n, buf, (r - 1) % n)
        for j, part in enumerate(buf.split(flat.numel())):
            have[(r - 1 - j) % n] = part
    return torch.cat([have[i] for i in range(n)])


# wrong: one step short (N-2 steps), so one piece never arrives
def one_step_short(ctx, piece):
    return _gather(ctx, piece, steps=ctx.world_size - 2)


# wrong (raises): sends to rank r+1 without wrapping, so the last rank sends to rank N
def no_wrap_around(ctx, piece):
    n, r, size = ctx.world_size, ctx.rank, piece.numel()
    out = torch.empty(n * size)
    slots = out.split(size)
    slots[r].copy_(piece.reshape(-1))
    for k in range(n - 1):
        _exchange(ctx, slots[(r - k) % n], r + 1, slots[(r - k - 1) % n], r - 1)
    return out


CORRECT = [counter_clockwise, batched_then_cat]
WRONG = [
    (arrival_order, ("rank order", "order")),
    (stacked_2d, ("1-d", "shape", "flatten")),
    (uses_all_gather, ("point-to-point", "all_gather", "all-gather", "collective", "send/recv")),
    (forwards_everything, ("bytes", "(n-1)/n", "whole", "one piece")),
    (one_step_short, ("n-1 steps", "missing", "never arrive", "steps")),
    (no_wrap_around, ("modulo", "% n", "wrap", "rank n", "out of range", "invalid rank")),
]
