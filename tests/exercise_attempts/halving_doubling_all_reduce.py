"""Attempts for halving_doubling_all_reduce(ctx, tensor): in-place sum, point-to-point only,
2·log2 N messages and 2(N-1)/N·S bytes per rank, ValueError when N is not a power of two."""
import torch
import torch.distributed as dist


def _exchange(send, into, peer, add):
    buf = torch.empty_like(into)
    works = [dist.isend(send.contiguous().clone(), peer), dist.irecv(buf, peer)]
    for w in works:
        w.wait()
    if add:
        into += buf
    else:
        into.copy_(buf)


def _check(n):
    if n < 1 or n & (n - 1):
        raise ValueError(f"N={n} is not a power of two")


# ---------------------------------------------------------------- correct
def chunk_blocks(ctx, tensor):
    """tensor_split into N chunks; each halving round exchanges a block of chunk indices; blocking
    send/recv, the lower rank sending first."""
    n, r = ctx.world_size, ctx.rank
    _check(n)
    chunks = tensor.view(-1).tensor_split(n)

    def swap(out, count, peer):  # blocking: the lower rank sends first
        buf = torch.empty(count)
        if r < peer:
            dist.send(out, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(out, peer)
        return buf
    lo, hi = 0, n
    history = []
    d = n // 2
    while d:
        peer, mid = r ^ d, (lo + hi) // 2
        mine, theirs = ((lo, mid), (mid, hi)) if r & d == 0 else ((mid, hi), (lo, mid))
        buf = swap(torch.cat([chunks[i] for i in range(*theirs)]), sum(chunks[i].numel() for i in range(*mine)), peer)
        offset = 0
        for i in range(*mine):
            chunks[i].add_(buf[offset:offset + chunks[i].numel()])
            offset += chunks[i].numel()
        history.append((lo, hi, peer))
        lo, hi = mine
        d //= 2
    for olo, ohi, peer in reversed(history):
        other = (hi, ohi) if lo == olo else (olo, lo)
        buf = swap(torch.cat([chunks[i] for i in range(lo, hi)]), sum(chunks[i].numel() for i in range(*other)), peer)
        offset = 0
        for i in range(*other):
            chunks[i].copy_(buf[offset:offset + chunks[i].numel()])
            offset += chunks[i].numel()
        lo, hi = olo, ohi
    return tensor


def upper_rank_keeps_front(ctx, tensor):
    """Split at (lo+hi+1)//2, the higher rank keeping the front half; distances 1, 2, ... first."""
    n, r = ctx.world_size, ctx.rank
    if bin(n).count("1") != 1:
        raise ValueError("world size must be a power of two")
    flat = tensor.view(-1)
    lo, hi, stack, d = 0, flat.numel(), [], 1
    while d < n:
        peer, mid = r ^ d, (lo + hi + 1) // 2
        keep, give = ((mid, hi), (lo, mid)) if r < peer else ((lo, mid), (mid, hi))
        _exchange(flat[give[0]:give[1]], flat[keep[0]:keep[1]], peer, add=True)
        stack.append((lo, hi, peer))
        lo, hi = keep
        d *= 2
    while stack:
        olo, ohi, peer = stack.pop()
        other = (hi, ohi) if lo == olo else (olo, lo)
        _exchange(flat[lo:hi], flat[other[0]:other[1]], peer, add=False)
        lo, hi = olo, ohi
    return tensor


def with_batch_isend_irecv(ctx, tensor):
    """Each exchange as one dist.batch_isend_irecv of two P2POps."""
    n, r = ctx.world_size, ctx.rank
    _check(n)
    flat = tensor.view(-1)

    def swap(send, into, peer, add):
        buf = torch.empty_like(into)
        ops = [dist.P2POp(dist.isend, send.clone(), peer), dist.P2POp(dist.irecv, buf, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        if add:
            into += buf
        else:
            into.copy_(buf)
    lo, hi, rounds, d = 0, flat.numel(), [], n // 2
    while d:
        peer, mid = r ^ d, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if r < peer else ((mid, hi), (lo, mid))
        swap(flat[give[0]:give[1]], flat[keep[0]:keep[1]], peer, True)
        rounds.append((lo, hi, peer))
        lo, hi = keep
        d //= 2
    for olo, ohi, peer in reversed(rounds):
        other = (hi, ohi) if lo == olo else (olo, lo)
        swap(flat[lo:hi], flat[other[0]:other[1]], peer, False)
        lo, hi = olo, ohi
    return tensor


CORRECT = [chunk_blocks, upper_rank_keeps_front, with_batch_isend_irecv]


# ---------------------------------------------------------------- wrong
def ring(ctx, tensor):
    """Correct, but the ring: 2(N-1) messages instead of 2·log2 N."""
    n, r = ctx.world_size, ctx.rank
    _check(n)
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        works = [dist.isend(chunks[(r - k) % n].clone(), (r + 1) % n), dist.irecv(buf, (r - 1) % n)]
        [w.wait() for w in works]
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k) % n])
        works = [dist.isend(chunks[(r + 1 - k) % n].clone(), (r + 1) % n), dist.irecv(buf, (r - 1) % n)]
        [w.wait() for w in works]
        chunks[(r - k) % n].copy_(buf)
    return tensor


def recursive_doubling_whole_tensor(ctx, tensor):
    """Correct, in log2 N rounds, but each round swaps the whole tensor: log2 N · S bytes."""
    n, r = ctx.world_size, ctx.rank
    _check(n)
    d = 1
    while d < n:
        buf = torch.empty_like(tensor)
        works = [dist.isend(tensor.clone(), r ^ d), dist.irecv(buf, r ^ d)]
        [w.wait() for w in works]
        tensor += buf
        d *= 2
    return tensor


def _halve(flat, r, n, mid_of=lambda lo, hi, r, peer: (lo + hi) // 2):
    """The reduce-scatter by halving (the wrong ones below share it): the range kept and the rounds."""
    lo, hi, rounds, d = 0, flat.numel(), [], n // 2
    while d:
        peer = r ^ d
        mid = mid_of(lo, hi, r, peer)
        keep, give = ((lo, mid), (mid, hi)) if r < peer else ((mid, hi), (lo, mid))
        buf = torch.empty(keep[1] - keep[0])
        works = [dist.isend(flat[give[0]:give[1]].clone(), peer), dist.irecv(buf, peer)]
        [w.wait() for w in works]
        flat[keep[0]:keep[1]] += buf
        rounds.append((lo, hi, peer))
        lo, hi = keep
        d //= 2
    return lo, hi, rounds


def _double(flat, lo, hi, rounds):
    for olo, ohi, peer in reversed(rounds):
        other = (hi, ohi) if lo == olo else (olo, lo)
        _exchange(flat[lo:hi], flat[other[0]:other[1]], peer, False)
        lo, hi = olo, ohi


def no_refusal(ctx, tensor):
    """Right for powers of two, never checks N: with 3 ranks rank 2's partner 3 does not exist."""
    flat = tensor.view(-1)
    _double(flat, *_halve(flat, ctx.rank, 1 << ctx.world_size.bit_length() >> 1 if ctx.world_size & (ctx.world_size - 1)
                          else ctx.world_size))
    return tensor


def refuses_after_a_barrier(ctx, tensor):
    """Refuses, but only after a collective: the refusal must come before any communication."""
    dist.barrier()
    _check(ctx.world_size)
    return upper_rank_keeps_front(ctx, tensor)


def forgot_the_doubling(ctx, tensor):
    """Only the halving: each rank holds the complete sum of its own piece only."""
    _check(ctx.world_size)
    _halve(tensor.view(-1), ctx.rank, ctx.world_size)
    return tensor


def averages(ctx, tensor):
    """Divides by N at the end: the mean, not the sum."""
    upper_rank_keeps_front(ctx, tensor)
    tensor /= ctx.world_size
    return tensor


def returns_a_copy(ctx, tensor):
    """Works on a clone and returns it: tensor itself is untouched."""
    return upper_rank_keeps_front(ctx, tensor.clone())


def partners_disagree_on_the_split(ctx, tensor):
    """Each rank splits at its own point (lower rank at floor, upper at ceil): halves overlap."""
    _check(ctx.world_size)
    flat = tensor.view(-1)
    _double(flat, *_halve(flat, ctx.rank, ctx.world_size,
                          lambda lo, hi, r, peer: (lo + hi) // 2 if r < peer else (lo + hi + 1) // 2))
    return tensor


WRONG = [
    (ring, "messages"),
    (recursive_doubling_whole_tensor, "whole tensors"),
    (no_refusal, "refuse with valueerror"),
    (refuses_after_a_barrier, "before refusing"),
    (forgot_the_doubling, "doubling"),
    (averages, "average"),
    (returns_a_copy, "in place"),
    (partners_disagree_on_the_split, "same point"),
]
