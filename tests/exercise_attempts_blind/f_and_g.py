"""Blind attempts at f_and_g (written without the reference); each attempt is the pair (f, g)."""
import torch
import torch.distributed as dist
from torch.distributed import all_reduce


# unusual: f returns x itself (no view), all-reduce imported by name; g sums through the world ProcessGroup
class CopyReturnsInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        out = grad.contiguous().clone()
        all_reduce(out)
        return out


class ReduceThroughGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.group.WORLD.allreduce([out]).wait()
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad.clone()


# unusual: explicit op=SUM and the sums built with torch.add of an all_gather list (values the same)
class CopyGatherSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        out = grad.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out


class ReduceSumOp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=None)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


def _sum(t):
    out = t.clone()
    dist.all_reduce(out)
    return out


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _SumForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _sum(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _SumBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum(grad)


class _SumBoth(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _sum(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum(grad)


class _AverageBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum(grad) / dist.get_world_size()


class _SummedOverBatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _sum(grad.sum(0))


CORRECT = [(CopyReturnsInput, ReduceThroughGroup), (CopyGatherSum, ReduceSumOp)]
WRONG = [
    # wrong: f and g swapped (f sums in the forward, g in the backward)
    ((_SumForward, _SumBackward), ("swap", "conjugate", "the other way")),
    # wrong: f never sums its gradient (identity both ways)
    ((_Identity, _SumForward), ("f's backward", "backward of f", "sum over ranks", "never summed")),
    # wrong: g also sums in the backward (the gradient comes out world_size times too large)
    ((_SumBackward, _SumBoth), ("g's backward", "backward of g", "identity")),
    # wrong: f averages its gradient instead of summing it
    ((_AverageBackward, _SumForward), ("average", "divid", "sum, not")),
    # wrong (raises): f's backward returns a gradient of the wrong shape (summed over the batch)
    ((_SummedOverBatch, _SumForward), ("shape", "invalid gradient")),
]
