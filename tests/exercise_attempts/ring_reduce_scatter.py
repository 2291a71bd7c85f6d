"""Attempts for ring_reduce_scatter(ctx, tensor)."""
import torch
import torch.distributed as dist


# ---------------------------------------------------------------- correct
def ring_other_direction(ctx, tensor):
    """Send to the left neighbour, receive from the right one."""
    r, n = ctx.rank, ctx.world_size
    chunks = list(tensor.detach().clone().reshape(-1).tensor_split(n))
    left, right = (r - 1) % n, (r + 1) % n
    for k in range(n - 1):
        out = chunks[(r + k + 1) % n]
        into = chunks[(r + k + 2) % n]
        buf = torch.empty_like(into)
        reqs = [dist.isend(out.contiguous(), left), dist.irecv(buf, right)]
        for q in reqs:
            q.wait()
        into += buf
    return chunks[r].clone()


def blocking_by_parity(ctx, tensor):
    """Blocking send/recv; even ranks send first, odd ranks receive first."""
    r, n = ctx.rank, ctx.world_size
    flat = tensor.reshape(-1).clone()
    chunks = flat.tensor_split(n)
    nxt, prv = (r + 1) % n, (r - 1) % n
    for k in range(n - 1):
        out = chunks[(r - k - 1) % n].clone()
        into = chunks[(r - k - 2) % n]
        buf = torch.zeros_like(into)
        if r % 2 == 0:
            dist.send(out, nxt)
            dist.recv(buf, prv)
        else:
            dist.recv(buf, prv)
            dist.send(out, nxt)
        into.add_(buf)
    return chunks[r].clone()


CORRECT = [ring_other_direction, blocking_by_parity]


# ---------------------------------------------------------------- wrong
def uses_all_reduce(ctx, tensor):
    t = tensor.clone()
    dist.all_reduce(t)
    return t.reshape(-1).tensor_split(ctx.world_size)[ctx.rank].clone()


def wrong_chunk_index(ctx, tensor):
    """Uses the all-gather's indices (send r-k, add into r-k-1): the finished chunk is r+1, not r."""
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.clone().reshape(-1).tensor_split(n)
    for k in range(n - 1):
        out, into = chunks[(r - k) % n], chunks[(r - k - 1) % n]
        buf = torch.empty_like(into)
        a = dist.isend(out, (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        into += buf
    return chunks[r].clone()


def modifies_input(ctx, tensor):
    """Works on tensor.view(-1) directly: the caller's tensor is changed."""
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.view(-1).tensor_split(n)
    for k in range(n - 1):
        out, into = chunks[(r - k - 1) % n], chunks[(r - k - 2) % n]
        buf = torch.empty_like(into)
        a = dist.isend(out, (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        into += buf
    return chunks[r].clone()


def everyone_sends_first(ctx, tensor):
    """Blocking send then recv on every rank."""
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.clone().reshape(-1).tensor_split(n)
    for k in range(n - 1):
        out, into = chunks[(r - k - 1) % n], chunks[(r - k - 2) % n]
        buf = torch.empty_like(into)
        dist.send(out.contiguous(), (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        into += buf
    return chunks[r].clone()


def n_steps_instead_of_n_minus_1(ctx, tensor):
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.clone().reshape(-1).tensor_split(n)
    for k in range(n):
        out, into = chunks[(r - k - 1) % n], chunks[(r - k - 2) % n]
        buf = torch.empty_like(into)
        a = dist.isend(out.clone(), (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        into += buf
    return chunks[(r - 1) % n].clone() if False else chunks[r].clone()


def averages(ctx, tensor):
    """Divides the result by the world size (the exercise asks for the sum)."""
    r, n = ctx.rank, ctx.world_size
    chunks = tensor.clone().reshape(-1).tensor_split(n)
    for k in range(n - 1):
        out, into = chunks[(r - k - 1) % n], chunks[(r - k - 2) % n]
        buf = torch.empty_like(into)
        a = dist.isend(out, (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        into += buf
    return chunks[r] / n


def returns_view_of_scratch(ctx, tensor):
    """Returns the whole reduced vector instead of this rank's chunk."""
    r, n = ctx.rank, ctx.world_size
    flat = tensor.clone().reshape(-1)
    chunks = flat.tensor_split(n)
    for k in range(n - 1):
        out, into = chunks[(r - k - 1) % n], chunks[(r - k - 2) % n]
        buf = torch.empty_like(into)
        a = dist.isend(out, (r + 1) % n)
        b = dist.irecv(buf, (r - 1) % n)
        a.wait()
        b.wait()
        into += buf
    return flat


WRONG = [
    (uses_all_reduce, "send/recv"),
    (wrong_chunk_index, "chunk"),
    (modifies_input, "leaves its input alone"),
    (everyone_sends_first, "deadlock"),
    (n_steps_instead_of_n_minus_1, "step"),
    (averages, "divide"),
    (returns_view_of_scratch, "shape"),
]
