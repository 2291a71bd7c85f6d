"""Blind attempts at halving_doubling_all_reduce (written without the reference)."""
import torch
import torch.distributed as dist


def _power_of_two(n):
    if n & (n - 1):
        raise ValueError(f"halving-doubling needs a power-of-two world size, got {n}")


def _swap(ctx, send, recv, partner):
    works = [ctx.comm.isend(send.contiguous(), partner), ctx.comm.irecv(recv, partner)]
    for w in works:
        w.wait()


def _halving_doubling(ctx, tensor, lower_keeps_front=True, doubling_backwards=True, check=True):
    n, r = ctx.world_size, ctx.rank
    if check:
        _power_of_two(n)
    flat = tensor.view(-1)
    lo, hi, ranges = 0, flat.numel(), []
    d = n // 2
    while d >= 1:
        partner = r ^ d
        mid = (lo + hi) // 2
        front = (r < partner) == lower_keeps_front
        keep, give = ((lo, mid), (mid, hi)) if front else ((mid, hi), (lo, mid))
        buf = torch.empty(keep[1] - keep[0])
        _swap(ctx, flat[give[0]:give[1]], buf, partner)
        flat[keep[0]:keep[1]] += buf
        ranges.append((partner, lo, hi, keep, give))
        lo, hi = keep
        d //= 2
    for partner, lo_, hi_, keep, give in (reversed(ranges) if doubling_backwards else ranges):
        _swap(ctx, flat[keep[0]:keep[1]], flat[give[0]:give[1]], partner)
    return tensor


# unusual: the lower rank of each pair keeps the BACK half (the hint's choice reversed)
def lower_keeps_back(ctx, tensor):
    return _halving_doubling(ctx, tensor, lower_keeps_front=False)


# unusual: dist.batch_isend_irecv for each exchange, the power-of-two test by bit_count, recursion
def batched_recursive(ctx, tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    if n.bit_count() != 1:
        raise ValueError("world size must be a power of two")
    flat = tensor.view(-1)

    def exchange(send, recv, partner):
        ops = [dist.P2POp(dist.isend, send.clone(), partner), dist.P2POp(dist.irecv, recv, partner)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    def step(lo, hi, d):
        if d == 0:
            return
        partner = r ^ d
        mid = (lo + hi) // 2
        mine, theirs = ((lo, mid), (mid, hi)) if r < partner else ((mid, hi), (lo, mid))
        buf = torch.empty(mine[1] - mine[0])
        exchange(flat[theirs[0]:theirs[1]], buf, partner)
        flat[mine[0]:mine[1]] += buf
        step(*mine, d // 2)
        exchange(flat[mine[0]:mine[1]], flat[theirs[0]:theirs[1]], partner)

    step(0, flat.numel(), n // 2)
    return tensor


# wrong: never refuses a world size that is not a power of two
def no_power_of_two_check(ctx, tensor):
    return _halving_doubling(ctx, tensor, check=False)


# wrong: raises the ValueError only after the first exchange has been sent
def refuses_too_late(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    partner = r ^ (n // 2)
    if partner < n:
        buf = torch.empty(1)
        _swap(ctx, tensor.view(-1)[:1], buf, partner)
    _power_of_two(n)
    return _halving_doubling(ctx, tensor)


# wrong (wasteful): recursive doubling, the whole tensor exchanged each round: log2 N · S bytes
def whole_tensor_each_round(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    _power_of_two(n)
    d = 1
    while d < n:
        buf = torch.empty_like(tensor)
        _swap(ctx, tensor.clone(), buf, r ^ d)
        tensor += buf
        d *= 2
    return tensor


# wrong (wasteful): a ring all-reduce, 2(N-1) messages instead of 2·log2 N
def ring_instead(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    _power_of_two(n)
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        works = [ctx.comm.isend(chunks[(r - k) % n], (r + 1) % n), ctx.comm.irecv(buf, (r - 1) % n)]
        for w in works:
            w.wait()
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        works = [ctx.comm.isend(chunks[(r + 1 - k) % n], (r + 1) % n),
                 ctx.comm.irecv(chunks[(r - k) % n], (r - 1) % n)]
        for w in works:
            w.wait()
    return tensor


# wrong: the doubling runs the partners in the same order as the halving (d = N/2 first), not backwards
def doubling_same_order(ctx, tensor):
    return _halving_doubling(ctx, tensor, doubling_backwards=False)


# wrong: sums into a copy and returns it, tensor unchanged
def not_in_place(ctx, tensor):
    return _halving_doubling(ctx, tensor.clone())


# wrong (raises): halves by size // 2 from 0, not from lo, so the ranges go out of bounds / mismatch
def mid_not_offset(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    _power_of_two(n)
    flat = tensor.view(-1)
    lo, hi, d, ranges = 0, flat.numel(), n // 2, []
    while d >= 1:
        partner = r ^ d
        mid = (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if r < partner else ((mid, hi), (lo, mid))
        buf = torch.empty(keep[1] - keep[0])
        _swap(ctx, flat[give[0]:give[1]], buf, partner)
        flat[keep[0]:keep[1]] += buf
        ranges.append((partner, keep, give))
        lo, hi = keep
        d //= 2
    for partner, keep, give in reversed(ranges):
        _swap(ctx, flat[keep[0]:keep[1]], flat[give[0]:give[1]], partner)
    return tensor


CORRECT = [lower_keeps_back, batched_recursive]
WRONG = [
    (no_power_of_two_check, ("power of two", "valueerror")),
    (refuses_too_late, ("before", "sending anything", "sent")),
    (whole_tensor_each_round, ("bytes", "2(n-1)/n", "halv")),
    (ring_instead, ("messages", "log2", "alpha", "latency")),
    (doubling_same_order, ("reverse", "backwards", "order")),
    (not_in_place, ("in place", "unchanged")),
    (mid_not_offset, ("mid", "lo + hi", "(lo+hi)", "range")),
]
