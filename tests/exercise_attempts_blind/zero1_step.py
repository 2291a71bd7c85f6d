"""Blind attempts (blind-b) at zero1_step: written from the stub and hints only."""
import torch
import torch.distributed as dist


def _bounds(n, world):
    sizes = [len(c) for c in torch.empty(n, dtype=torch.uint8).tensor_split(world)]
    starts = [sum(sizes[:r]) for r in range(world)]
    return [(s, s + z) for s, z in zip(starts, sizes)]


# correct, unusual: pads every shard to the largest one, reduce_scatter_tensor then all_gather_into_tensor
def padded_collectives(ctx, params, grad, optimizer):
    n, rank = ctx.world_size, ctx.rank
    bounds = _bounds(params.numel(), n)
    m = max(b - a for a, b in bounds)
    padded = grad.new_zeros(n, m)
    for r, (a, b) in enumerate(bounds):
        padded[r, : b - a] = grad[a:b]
    mine = grad.new_empty(m)
    dist.reduce_scatter_tensor(mine, padded.reshape(-1))
    mine /= n
    start, end = bounds[rank]
    optimizer.step(start, params[start:end], mine[: end - start])
    send = params.new_zeros(m)
    send[: end - start] = params[start:end]
    everyone = params.new_empty(n * m)
    dist.all_gather_into_tensor(everyone, send)
    everyone = everyone.view(n, m)
    for r, (a, b) in enumerate(bounds):
        params[a:b] = everyone[r, : b - a]


# wasteful (relabelled by the coordinator: it was filed correct after the old hint 3, which review X2 found
# teaches this 1.5x version): a whole all-reduce, then one broadcast per shard owner: 1.5x DP's bytes
def allreduce_then_broadcasts(ctx, params, grad, optimizer):
    g = grad.clone()
    ctx.comm.all_reduce(g, op="avg")
    bounds = _bounds(params.numel(), ctx.world_size)
    start, end = bounds[ctx.rank]
    optimizer.step(start, params[start:end], g[start:end])
    for r, (a, b) in enumerate(bounds):
        shard = params[a:b].contiguous()
        ctx.comm.broadcast(shard, src=r)
        params[a:b] = shard


# mistake: sums the gradients over the ranks but never divides by N
def no_average(ctx, params, grad, optimizer):
    g = grad.clone()
    dist.all_reduce(g)
    bounds = _bounds(params.numel(), ctx.world_size)
    start, end = bounds[ctx.rank]
    optimizer.step(start, params[start:end], g[start:end])
    for r, (a, b) in enumerate(bounds):
        shard = params[a:b].contiguous()
        dist.broadcast(shard, src=r)
        params[a:b] = shard


# mistake: never all-gathers the updated shards, so the other ranks' shards stay stale
def no_all_gather(ctx, params, grad, optimizer):
    g = grad.clone()
    dist.all_reduce(g)
    g /= ctx.world_size
    start, end = _bounds(params.numel(), ctx.world_size)[ctx.rank]
    optimizer.step(start, params[start:end], g[start:end])


# mistake: shards cut at multiples of numel // N with the remainder on the last rank (not tensor_split's)
def floor_shards(ctx, params, grad, optimizer):
    n, rank = ctx.world_size, ctx.rank
    q = params.numel() // n
    bounds = [(r * q, params.numel() if r == n - 1 else (r + 1) * q) for r in range(n)]
    g = grad.clone()
    dist.all_reduce(g)
    g /= n
    start, end = bounds[rank]
    optimizer.step(start, params[start:end], g[start:end])
    for r, (a, b) in enumerate(bounds):
        shard = params[a:b].contiguous()
        dist.broadcast(shard, src=r)
        params[a:b] = shard


# mistake (values right, wasteful): reduce-scatter, then an all-reduce of a zero-filled vector instead of an all-gather
def allreduce_instead_of_gather(ctx, params, grad, optimizer):
    n, rank = ctx.world_size, ctx.rank
    bounds = _bounds(params.numel(), n)
    m = max(b - a for a, b in bounds)
    padded = grad.new_zeros(n, m)
    for r, (a, b) in enumerate(bounds):
        padded[r, : b - a] = grad[a:b]
    mine = grad.new_empty(m)
    dist.reduce_scatter_tensor(mine, padded.reshape(-1))
    mine /= n
    start, end = bounds[rank]
    optimizer.step(start, params[start:end], mine[: end - start])
    full = torch.zeros_like(params)
    full[start:end] = params[start:end]
    dist.all_reduce(full)
    params.copy_(full)


# mistake (values right, wasteful): all-reduces the full gradient AND all-reduces a zero-filled parameter vector (ctx.comm)
def two_all_reduces(ctx, params, grad, optimizer):
    g = grad.clone()
    ctx.comm.all_reduce(g, op="avg")
    start, end = _bounds(params.numel(), ctx.world_size)[ctx.rank]
    optimizer.step(start, params[start:end], g[start:end])
    full = torch.zeros_like(params)
    full[start:end] = params[start:end]
    ctx.comm.all_reduce(full)
    params.copy_(full)


# mistake (raises): off-by-one rank index into the shard bounds (IndexError on the last rank)
def off_by_one(ctx, params, grad, optimizer):
    g = grad.clone()
    dist.all_reduce(g)
    g /= ctx.world_size
    bounds = _bounds(params.numel(), ctx.world_size)
    start, end = bounds[ctx.rank + 1]
    optimizer.step(start, params[start:end], g[start:end])


CORRECT = [padded_collectives]
WRONG = [
    (allreduce_then_broadcasts, ("bytes", "reduce-scatter", "reduce_scatter")),
    (no_average, ("average", "divide", "/ n", "mean")),
    (no_all_gather, ("all-gather", "all_gather", "stale", "other shards")),
    (floor_shards, ("tensor_split", "uneven", "numel // n")),
    (allreduce_instead_of_gather, ("bytes", "all-reduce", "all_reduce")),
    (two_all_reduces, ("bytes", "all-reduce", "all_reduce")),
    (off_by_one, ("indexerror", "out of range")),
]
