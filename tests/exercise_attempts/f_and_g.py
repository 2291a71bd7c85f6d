"""Attempts for f_and_g: the object checked is the tuple (CopyToParallelRegion, ReduceFromParallelRegion)."""
import torch
import torch.distributed as dist


# ---------------------------------------------------------------- correct
class CloneCopy(torch.autograd.Function):
    """f with a clone in the forward (not a view) and an in-place all-reduce of a contiguous copy."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        g = grad.contiguous().clone()
        dist.all_reduce(g, op=dist.ReduceOp.SUM)
        return g


class CloneReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.detach().contiguous().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


def _sum_over_ranks(t):
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.stack(parts).sum(0)


class GatherSumCopy(torch.autograd.Function):
    """f whose backward sums with all_gather + stack().sum() instead of all_reduce."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        t = grad.contiguous()
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t)
        return torch.stack(parts).sum(0)


class GatherSumReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = x.contiguous()
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, t)
        return torch.stack(parts).sum(0)

    @staticmethod
    def backward(ctx, grad):
        return grad


CORRECT = [(CloneCopy, CloneReduce), (GatherSumCopy, GatherSumReduce)]


# ---------------------------------------------------------------- wrong
class NoReduceCopy(torch.autograd.Function):
    """f's backward forgets the all-reduce (identity both ways)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class InPlaceReduce(torch.autograd.Function):
    """g all-reduces its input in place and returns it (the caller's tensor is overwritten)."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class DoubleReduce(torch.autograd.Function):
    """g all-reduces in the backward too."""

    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        dist.all_reduce(g)
        return g


class AveragingCopy(torch.autograd.Function):
    """f's backward averages instead of summing."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        dist.all_reduce(g)
        return g / dist.get_world_size()


class ReduceInForwardCopy(torch.autograd.Function):
    """f all-reduces in the forward as well as the backward."""

    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        dist.all_reduce(g)
        return g


def _named(t, name):
    class T(tuple):
        pass
    o = T(t)
    o._attempt_name = name
    return o


swapped = _named((CloneReduce, CloneCopy), "swapped_f_g")
f_backward_identity = _named((NoReduceCopy, CloneReduce), "f_backward_identity")
g_in_place = _named((CloneCopy, InPlaceReduce), "g_in_place")
g_backward_reduces = _named((CloneCopy, DoubleReduce), "g_backward_reduces")
f_backward_averages = _named((AveragingCopy, CloneReduce), "f_backward_averages")
f_forward_reduces = _named((ReduceInForwardCopy, CloneReduce), "f_forward_reduces")

WRONG = [
    (swapped, "swapped"),
    (f_backward_identity, "backward"),
    (g_in_place, "in place"),
    (g_backward_reduces, "backward"),
    (f_backward_averages, "world size"),
    (f_forward_reduces, "forward"),
]
