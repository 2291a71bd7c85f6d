"""Attempts for ring_all_reduce(ctx, tensor)."""
import torch
import torch.distributed as dist


# ---------------------------------------------------------------- correct
def ring_other_direction(ctx, tensor):
    """Both phases leftwards (send to r-1, receive from r+1); rank r finishes chunk r-1 in phase 1."""
    r, n = ctx.rank, ctx.world_size
    left, right = (r - 1) % n, (r + 1) % n
    flat = tensor.view(-1)
    chunks = flat.tensor_split(n)
    for k in range(n - 1):                       # reduce-scatter
        out, into = chunks[(r + k) % n], chunks[(r + k + 1) % n]
        buf = torch.empty_like(into)
        reqs = [dist.isend(out.clone(), left), dist.irecv(buf, right)]
        for q in reqs:
            q.wait()
        into.add_(buf)
    for k in range(n - 1):                       # all-gather
        out, into = chunks[(r - 1 + k) % n], chunks[(r + k) % n]
        buf = torch.empty_like(into)
        reqs = [dist.isend(out.clone(), left), dist.irecv(buf, right)]
        for q in reqs:
            q.wait()
        into.copy_(buf)
    return tensor


def blocking_by_parity_any_layout(ctx, tensor):
    """Blocking send/recv by parity; works on a contiguous copy and writes it back (also for non-contiguous)."""
    r, n = ctx.rank, ctx.world_size
    work = tensor.detach().reshape(-1).clone()
    chunks = work.tensor_split(n)

    def exchange(out, buf):
        if r % 2 == 0:
            dist.send(out.contiguous(), (r + 1) % n)
            dist.recv(buf, (r - 1) % n)
        else:
            dist.recv(buf, (r - 1) % n)
            dist.send(out.contiguous(), (r + 1) % n)

    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        exchange(chunks[(r - k) % n], buf)
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k) % n])
        exchange(chunks[(r + 1 - k) % n], buf)
        chunks[(r - k) % n].copy_(buf)
    tensor.copy_(work.view_as(tensor))
    return tensor


CORRECT = [ring_other_direction, blocking_by_parity_any_layout]


# ---------------------------------------------------------------- wrong
def _ring(ctx, tensor, gather=True, gather_adds=False):
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        a = dist.isend(chunks[(r - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        chunks[(r - k - 1) % n].add_(buf)
    if gather:
        for k in range(n - 1):
            buf = torch.empty_like(chunks[(r - k) % n])
            a = dist.isend(chunks[(r + 1 - k) % n].clone(), (r + 1) % n)
            b = dist.irecv(buf, (r - 1) % n)
            a.wait()
            b.wait()
            if gather_adds:
                chunks[(r - k) % n].add_(buf)
            else:
                chunks[(r - k) % n].copy_(buf)
    return tensor


def uses_all_reduce(ctx, tensor):
    dist.all_reduce(tensor)
    return tensor


def returns_new_tensor(ctx, tensor):
    """Correct ring on a clone; the caller's tensor is left unchanged."""
    return _ring(ctx, tensor.clone())


def forgot_all_gather(ctx, tensor):
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        a = dist.isend(chunks[(r - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        chunks[(r - k - 1) % n].add_(buf)
    return tensor


def all_gather_adds(ctx, tensor):
    """Second phase adds what arrives instead of copying it."""
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        a = dist.isend(chunks[(r - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k) % n])
        a = dist.isend(chunks[(r + 1 - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        chunks[(r - k) % n].add_(buf)
    return tensor


def everyone_sends_first(ctx, tensor):
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        dist.send(chunks[(r - k) % n].clone(), (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k) % n])
        dist.send(chunks[(r + 1 - k) % n].clone(), (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        chunks[(r - k) % n].copy_(buf)
    return tensor


def averages(ctx, tensor):
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        a = dist.isend(chunks[(r - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k) % n])
        a = dist.isend(chunks[(r + 1 - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        chunks[(r - k) % n].copy_(buf)
    tensor /= n
    return tensor


def gather_starts_from_wrong_chunk(ctx, tensor):
    """All-gather phase starts by sending chunk r (not the finished chunk r+1)."""
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        a = dist.isend(chunks[(r - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        chunks[(r - k - 1) % n].add_(buf)
    for k in range(n - 1):
        buf = torch.empty_like(chunks[(r - k - 1) % n])
        a = dist.isend(chunks[(r - k) % n].clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        chunks[(r - k - 1) % n].copy_(buf)
    return tensor


WRONG = [
    (uses_all_reduce, "send/recv"),
    (returns_new_tensor, "in place"),
    (forgot_all_gather, "all-gather"),
    (all_gather_adds, "all-gather phase"),
    (everyone_sends_first, "deadlock"),
    (averages, "sum"),
    (gather_starts_from_wrong_chunk, "chunk"),
]
