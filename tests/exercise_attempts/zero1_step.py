"""Attempts for zero1_step(ctx, params, grad, optimizer)."""
import torch
import torch.distributed as dist


def _bounds(numel, n):
    base, extra = divmod(numel, n)
    sizes = [base + (1 if i < extra else 0) for i in range(n)]
    starts = [sum(sizes[:i]) for i in range(n)]
    return starts, sizes


# ---------------------------------------------------------------- correct
def allreduce_then_broadcast_shards(ctx, params, grad, optimizer):
    """Wrong on cost (issue 41): all-reduce the gradient, update own shard, one broadcast per owner: right
    values, but 1.5x DP's bytes where ZeRO-1 sends one reduce-scatter and one all-gather."""
    r, n = ctx.rank, ctx.world_size
    sizes = [c.numel() for c in params.detach().tensor_split(n)]
    starts = [sum(sizes[:i]) for i in range(n)]
    g = grad.detach().clone()
    dist.all_reduce(g)
    g /= n
    s, e = starts[r], starts[r] + sizes[r]
    with torch.no_grad():
        optimizer.step(s, params[s:e], g[s:e])
        for i in range(n):
            if sizes[i]:
                view = params[starts[i]:starts[i] + sizes[i]]
                buf = view.clone()
                dist.broadcast(buf, src=i)
                view.copy_(buf)
    return params


def reduce_to_owner_then_padded_all_gather(ctx, params, grad, optimizer):
    """dist.reduce each shard to its owner (a reduce-scatter by hand), then a padded all_gather."""
    r, n = ctx.rank, ctx.world_size
    numel = params.numel()
    base, extra = divmod(numel, n)
    sizes = [base + (1 if i < extra else 0) for i in range(n)]
    starts = [sum(sizes[:i]) for i in range(n)]
    mine = None
    for i in range(n):
        if sizes[i] == 0:
            continue
        buf = grad.detach()[starts[i]:starts[i] + sizes[i]].clone()
        dist.reduce(buf, dst=i)
        if i == r:
            mine = buf / n
    if mine is None:
        mine = grad.detach()[0:0].clone()
    s, e = starts[r], starts[r] + sizes[r]
    with torch.no_grad():
        optimizer.step(s, params[s:e], mine)
        width = max(sizes)
        padded = torch.zeros(width, dtype=params.dtype)
        padded[:sizes[r]] = params[s:e]
        outs = [torch.empty_like(padded) for _ in range(n)]
        dist.all_gather(outs, padded)
        for i in range(n):
            params[starts[i]:starts[i] + sizes[i]].copy_(outs[i][:sizes[i]])
    return params


def remainder_on_last_rank(ctx, params, grad, optimizer):
    """Wrong on cost (issue 41): another contiguous partition (numel // N each, the remainder on the last
    rank) is fine, but all-reduce plus broadcasts sends 1.5x DP's bytes."""
    r, n = ctx.rank, ctx.world_size
    numel = params.numel()
    base = numel // n
    starts = [i * base for i in range(n)]
    sizes = [base] * (n - 1) + [numel - base * (n - 1)]
    g = grad.detach().clone()
    dist.all_reduce(g)
    g /= n
    s, e = starts[r], starts[r] + sizes[r]
    with torch.no_grad():
        optimizer.step(s, params[s:e], g[s:e])
        for i in range(n):
            if sizes[i]:
                view = params[starts[i]:starts[i] + sizes[i]]
                buf = view.clone()
                dist.broadcast(buf, src=i)
                view.copy_(buf)


CORRECT = [reduce_to_owner_then_padded_all_gather]


# ---------------------------------------------------------------- wrong
def _gather(params, starts, sizes, n):
    for i in range(n):
        if sizes[i]:
            view = params[starts[i]:starts[i] + sizes[i]]
            buf = view.clone()
            dist.broadcast(buf, src=i)
            view.copy_(buf)


def summed_not_averaged(ctx, params, grad, optimizer):
    r, n = ctx.rank, ctx.world_size
    starts, sizes = _bounds(params.numel(), n)
    g = grad.detach().clone()
    dist.all_reduce(g)
    s, e = starts[r], starts[r] + sizes[r]
    with torch.no_grad():
        optimizer.step(s, params[s:e], g[s:e])
        _gather(params, starts, sizes, n)


def updates_everything(ctx, params, grad, optimizer):
    """Every rank steps the whole vector (no sharding of the optimizer state)."""
    n = ctx.world_size
    g = grad.detach().clone()
    dist.all_reduce(g)
    g /= n
    with torch.no_grad():
        optimizer.step(0, params, g)


def forgot_all_gather(ctx, params, grad, optimizer):
    r, n = ctx.rank, ctx.world_size
    starts, sizes = _bounds(params.numel(), n)
    g = grad.detach().clone()
    dist.all_reduce(g)
    g /= n
    s, e = starts[r], starts[r] + sizes[r]
    with torch.no_grad():
        optimizer.step(s, params[s:e], g[s:e])


def shard_bounds_floor(ctx, params, grad, optimizer):
    """Shards of numel // N: the last numel % N elements belong to nobody and are never updated."""
    r, n = ctx.rank, ctx.world_size
    size = params.numel() // n
    starts, sizes = [i * size for i in range(n)], [size] * n
    g = grad.detach().clone()
    dist.all_reduce(g)
    g /= n
    s, e = starts[r], starts[r] + size
    with torch.no_grad():
        optimizer.step(s, params[s:e], g[s:e])
        _gather(params, starts, sizes, n)


def shard_bounds_off_by_one(ctx, params, grad, optimizer):
    """end = start + size + 1: neighbouring shards overlap by one element."""
    r, n = ctx.rank, ctx.world_size
    starts, sizes = _bounds(params.numel(), n)
    g = grad.detach().clone()
    dist.all_reduce(g)
    g /= n
    s = starts[r]
    e = min(s + sizes[r] + 1, params.numel())
    with torch.no_grad():
        optimizer.step(s, params[s:e], g[s:e])
        _gather(params, starts, sizes, n)


def local_gradient_only(ctx, params, grad, optimizer):
    """No reduce-scatter: each rank steps its shard with its own gradient."""
    r, n = ctx.rank, ctx.world_size
    starts, sizes = _bounds(params.numel(), n)
    s, e = starts[r], starts[r] + sizes[r]
    with torch.no_grad():
        optimizer.step(s, params[s:e], grad.detach()[s:e].clone())
        _gather(params, starts, sizes, n)


def divides_twice(ctx, params, grad, optimizer):
    r, n = ctx.rank, ctx.world_size
    starts, sizes = _bounds(params.numel(), n)
    g = grad.detach() / n
    dist.all_reduce(g)
    g /= n
    s, e = starts[r], starts[r] + sizes[r]
    with torch.no_grad():
        optimizer.step(s, params[s:e], g[s:e])
        _gather(params, starts, sizes, n)


def steps_on_a_copy(ctx, params, grad, optimizer):
    """Passes a copy of the shard (params[s:e].clone()) to the optimizer, then gathers the untouched params."""
    r, n = ctx.rank, ctx.world_size
    starts, sizes = _bounds(params.numel(), n)
    g = grad.detach().clone()
    dist.all_reduce(g)
    g /= n
    s, e = starts[r], starts[r] + sizes[r]
    with torch.no_grad():
        optimizer.step(s, params[s:e].clone(), g[s:e])
        _gather(params, starts, sizes, n)


WRONG = [
    (remainder_on_last_rank, "bytes"),
    (allreduce_then_broadcast_shards, "bytes"),
    (summed_not_averaged, "averag"),
    (updates_everything, "shard"),
    (forgot_all_gather, "all-gather"),
    (shard_bounds_floor, "shard"),
    (shard_bounds_off_by_one, "shard"),
    (local_gradient_only, "averag"),
    (divides_twice, "once more"),
    (steps_on_a_copy, "not a copy"),
]
