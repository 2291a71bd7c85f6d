"""Blind attempts at ring_all_reduce (written without the reference)."""
import torch
import torch.distributed as dist
from torch.distributed import irecv, isend


def _exchange(send, to, recv, frm):
    works = [isend(send, to), irecv(recv, frm)]
    for w in works:
        w.wait()


# unusual: the other direction (to r-1, from r+1); functions imported by name from torch.distributed
def counter_clockwise(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):                       # reduce-scatter: chunk r-1 ends complete on rank r
        into = chunks[(r + k + 1) % n]
        buf = torch.empty_like(into)
        _exchange(chunks[(r + k) % n], (r - 1) % n, buf, (r + 1) % n)
        into += buf
    for k in range(n - 1):                       # all-gather: pass the complete chunks on
        _exchange(chunks[(r + k - 1) % n], (r - 1) % n, chunks[(r + k) % n], (r + 1) % n)
    return tensor


# unusual: batch_isend_irecv and its own partition (the extra elements at the END, not tensor_split's start)
def batched_own_partition(ctx, tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1)
    base, extra = divmod(flat.numel(), n)
    sizes = [base + (1 if i >= n - extra else 0) for i in range(n)]
    starts = [sum(sizes[:i]) for i in range(n)]

    def chunk(i):
        i %= n
        return flat.narrow(0, starts[i], sizes[i])

    def swap(send, recv):
        ops = [dist.P2POp(dist.isend, send.clone(), (r + 1) % n), dist.P2POp(dist.irecv, recv, (r - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()

    for k in range(n - 1):
        buf = torch.empty_like(chunk(r - k - 1))
        swap(chunk(r - k), buf)
        chunk(r - k - 1).add_(buf)
    for k in range(n - 1):
        buf = torch.empty_like(chunk(r - k))
        swap(chunk(r + 1 - k), buf)
        chunk(r - k).copy_(buf)
    return tensor


def _ring(ctx, tensor, gather_start=1, gather=True):
    n, r = ctx.world_size, ctx.rank
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        into = chunks[(r - k - 1) % n]
        buf = torch.empty_like(into)
        _exchange(chunks[(r - k) % n], (r + 1) % n, buf, (r - 1) % n)
        into += buf
    if gather:
        for k in range(n - 1):
            _exchange(chunks[(r + gather_start - k) % n], (r + 1) % n, chunks[(r + gather_start - k - 1) % n],
                      (r - 1) % n)
    return tensor


# wrong: returns the sum in a new tensor and leaves tensor unchanged
def not_in_place(ctx, tensor):
    return _ring(ctx, tensor.clone())


# wrong: the all-gather starts from chunk r, not from the complete chunk r+1
def gather_from_wrong_chunk(ctx, tensor):
    return _ring(ctx, tensor, gather_start=0)


# wrong: only the reduce-scatter, no all-gather phase
def no_all_gather(ctx, tensor):
    return _ring(ctx, tensor, gather=False)


# wrong (wasteful): passes the whole tensor round the ring N-1 times, (N-1)·S bytes instead of 2(N-1)/N·S
def whole_tensor_round(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    passing = tensor.clone()
    for _ in range(n - 1):
        buf = torch.empty_like(passing)
        _exchange(passing, (r + 1) % n, buf, (r - 1) % n)
        tensor += buf
        passing = buf
    return tensor


# wrong: the dist.all_reduce collective, not a ring of messages
def uses_all_reduce(ctx, tensor):
    dist.all_reduce(tensor)
    return tensor


# wrong (raises): the signature (tensor, group) instead of (ctx, tensor)
def tensor_then_group(tensor, group=None):
    dist.all_reduce(tensor, group=group)
    return tensor


CORRECT = [counter_clockwise, batched_own_partition]
WRONG = [
    (not_in_place, ("in place", "unchanged")),
    (gather_from_wrong_chunk, ("all-gather", "complete chunk", "second phase")),
    (no_all_gather, ("all-gather", "all gather")),
    (whole_tensor_round, ("bytes", "2(n-1)/n")),
    (uses_all_reduce, ("point-to-point", "all_reduce", "all-reduce", "collective", "send/recv")),
    (tensor_then_group, ("signature", "(ctx, tensor)", "takes")),
]
