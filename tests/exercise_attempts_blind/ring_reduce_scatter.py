"""Blind attempts at ring_reduce_scatter (written without the reference)."""
import torch
import torch.distributed as dist


def _exchange(ctx, send, to, recv, frm):
    works = [ctx.comm.isend(send, to), ctx.comm.irecv(recv, frm)]
    for w in works:
        w.wait()


# unusual: the other direction (send to r-1, receive from r+1), so the chunk indices run upwards
def counter_clockwise(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    chunks = tensor.detach().clone().reshape(-1).tensor_split(n)
    for k in range(n - 1):
        send, into = chunks[(r + k + 1) % n], chunks[(r + k + 2) % n]
        buf = torch.empty_like(into)
        _exchange(ctx, send, (r - 1) % n, buf, (r + 1) % n)
        into += buf
    return chunks[r].clone()


# unusual: dist.batch_isend_irecv with P2POp, and the chunks as narrow() views of a flat copy
def batched_p2p(ctx, tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    flat = tensor.reshape(-1).clone()
    sizes = [len(c) for c in torch.arange(flat.numel()).tensor_split(n)]
    starts = [sum(sizes[:i]) for i in range(n)]

    def chunk(i):
        i %= n
        return flat.narrow(0, starts[i], sizes[i])

    for k in range(n - 1):
        buf = torch.empty_like(chunk(r - k - 2))
        ops = [dist.P2POp(dist.isend, chunk(r - k - 1).contiguous(), (r + 1) % n),
               dist.P2POp(dist.irecv, buf, (r - 1) % n)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        chunk(r - k - 2).add_(buf)
    return chunk(r).clone()


def _ring(ctx, tensor, clone=True, result_offset=0):
    n, r = ctx.world_size, ctx.rank
    flat = tensor.reshape(-1)
    chunks = (flat.clone() if clone else flat).tensor_split(n)
    for k in range(n - 1):
        into = chunks[(r - k - 2) % n]
        buf = torch.empty_like(into)
        _exchange(ctx, chunks[(r - k - 1) % n], (r + 1) % n, buf, (r - 1) % n)
        into += buf
    return chunks[(r + result_offset) % n].clone()


# wrong: returns the neighbour's chunk (r+1), which is only partly summed
def returns_next_chunk(ctx, tensor):
    return _ring(ctx, tensor, result_offset=1)


# wrong: adds into the caller's tensor (no clone), so tensor is changed
def modifies_input(ctx, tensor):
    return _ring(ctx, tensor, clone=False)


# wrong: a collective (all_reduce) then a slice, not a ring of messages
def uses_all_reduce(ctx, tensor):
    total = tensor.clone()
    dist.all_reduce(total)
    return total.reshape(-1).tensor_split(ctx.world_size)[ctx.rank].clone()


# wrong (wasteful): every step sends the whole tensor, (N-1)·S bytes instead of (N-1)/N·S
def sends_whole_tensor(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    total, passing = tensor.reshape(-1).clone(), tensor.reshape(-1).clone()
    for _ in range(n - 1):
        buf = torch.empty_like(passing)
        _exchange(ctx, passing, (r + 1) % n, buf, (r - 1) % n)
        passing = buf
        total += buf
    return total.tensor_split(n)[r].clone()


# wrong (deadlock): every rank first waits to receive, then sends
def recv_before_send(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    chunks = tensor.reshape(-1).clone().tensor_split(n)
    for k in range(n - 1):
        into = chunks[(r - k - 2) % n]
        buf = torch.empty_like(into)
        dist.recv(buf, (r - 1) % n)
        dist.send(chunks[(r - k - 1) % n], (r + 1) % n)
        into += buf
    return chunks[r].clone()


# wrong (raises): chunks by view(n, -1), which needs the size to divide by N
def view_into_rows(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    rows = tensor.reshape(-1).clone().view(n, -1)
    for k in range(n - 1):
        buf = torch.empty_like(rows[0])
        _exchange(ctx, rows[(r - k - 1) % n], (r + 1) % n, buf, (r - 1) % n)
        rows[(r - k - 2) % n] += buf
    return rows[r].clone()


CORRECT = [counter_clockwise, batched_p2p]
WRONG = [
    (returns_next_chunk, ("wrong chunk", "another chunk", "other chunk", "chunk ctx.rank", "shifted")),
    (modifies_input, ("unchanged", "modified", "in place", "changed")),
    (uses_all_reduce, ("point-to-point", "all_reduce", "all-reduce", "collective", "send/recv")),
    (sends_whole_tensor, ("bytes", "(n-1)/n")),
    (recv_before_send, ("recv",)),
    (view_into_rows, ("divisible", "divide", "view", "tensor_split")),
]
