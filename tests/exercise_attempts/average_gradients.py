"""Attempts for average_gradients(ctx, model)."""
import torch
import torch.distributed as dist


# ---------------------------------------------------------------- correct
def coalesced_one_allreduce(ctx, model):
    """Flatten every grad into one buffer, one all-reduce, copy back."""
    ps = [p for p in model.parameters() if p.grad is not None]
    if not ps:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in ps])
    dist.all_reduce(flat)
    flat /= ctx.world_size
    off = 0
    for p in ps:
        n = p.grad.numel()
        p.grad.copy_(flat[off:off + n].view_as(p.grad))
        off += n


def predivide_reverse_order(ctx, model):
    """Divide first, then sum; walk the parameters backwards."""
    for p in reversed(list(model.parameters())):
        if p.grad is None:
            continue
        p.grad.mul_(1.0 / ctx.world_size)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


CORRECT = [coalesced_one_allreduce, predivide_reverse_order]


# ---------------------------------------------------------------- wrong
def no_divide(ctx, model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def divide_twice(ctx, model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size
            p.grad /= ctx.world_size


def reduce_twice(ctx, model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size


def not_in_place(ctx, model):
    """Averages a copy and throws it away."""
    for p in model.parameters():
        if p.grad is not None:
            g = p.grad.clone()
            dist.all_reduce(g)
            g /= ctx.world_size


def crashes_on_frozen(ctx, model):
    """Forgets that frozen parameters have grad None."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= ctx.world_size


def divide_by_local_count(ctx, model):
    """Divides by the number of parameters instead of the world size."""
    ps = [p for p in model.parameters() if p.grad is not None]
    for p in ps:
        dist.all_reduce(p.grad)
        p.grad /= len(ps)


def rebinds_grad(ctx, model):
    """p.grad = p.grad / N after the all-reduce: a new tensor, not in place (borderline: the optimizer would
    still see the average)."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad = p.grad / ctx.world_size


def async_without_wait(ctx, model):
    """Starts async all-reduces and divides without waiting for them."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, async_op=True)
            p.grad /= ctx.world_size


def infinite_loop(ctx, model):
    """A while loop over the parameters that never advances."""
    ps = list(model.parameters())
    i = 0
    while i < len(ps):
        p = ps[i]
        if p.grad is None:
            continue           # forgot i += 1 here
        dist.all_reduce(p.grad)
        p.grad /= ctx.world_size
        i += 1


WRONG = [
    (no_divide, "divide"),
    (divide_twice, "twice"),
    (reduce_twice, "reduction too many"),
    (not_in_place, "in place"),
    (crashes_on_frozen, "none"),
    (divide_by_local_count, "world size"),
    (async_without_wait, "wait"),
    (infinite_loop, "loop"),
]

CORRECT += [rebinds_grad]  # rebinding p.grad to the average is correct too (optimizers read p.grad)
