"""Attempts for sequence_parallel_mappings: the pair (GatherFromSequenceParallelRegion,
ReduceScatterToSequenceParallelRegion), the sequence on dimension 0."""
import torch
import torch.distributed as dist
from f_and_g import _named  # a tuple subclass that carries the attempt's name


def _gather_list(t):
    """All-gather along dimension 0 with the list form and a cat."""
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=0)


def _scatter_list(t):
    """Reduce-scatter along dimension 0 with the list form."""
    pieces = [p.contiguous() for p in t.chunk(dist.get_world_size(), dim=0)]
    out = torch.empty_like(pieces[0])
    dist.reduce_scatter(out, pieces)
    return out


def _ring_gather(t):
    """All-gather by hand: N-1 hops around the ring, (N-1)/N of the gathered bytes."""
    n, r = dist.get_world_size(), dist.get_rank()
    slots = list(torch.empty((n, *t.shape), dtype=t.dtype).unbind(0))
    slots[r].copy_(t)
    for k in range(n - 1):
        incoming = torch.empty_like(t)
        works = [dist.isend(slots[(r - k) % n].contiguous(), (r + 1) % n), dist.irecv(incoming, (r - 1) % n)]
        for w in works:
            w.wait()
        slots[(r - k - 1) % n].copy_(incoming)
    return torch.cat(slots, dim=0)


# ---------------------------------------------------------------- correct
class ListGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _gather_list(x)

    @staticmethod
    def backward(ctx, grad):
        return _scatter_list(grad)


class ListScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _scatter_list(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_list(grad)


class RingGather(torch.autograd.Function):
    """The gather by hand on a ring, its backward with the tensor collective."""

    @staticmethod
    def forward(ctx, x):
        return _ring_gather(x)

    @staticmethod
    def backward(ctx, grad):
        out = torch.empty_like(grad.chunk(dist.get_world_size())[0])
        dist.reduce_scatter_tensor(out, grad.contiguous())
        return out


CORRECT = [(ListGather, ListScatter), (RingGather, ListScatter)]


# ---------------------------------------------------------------- wrong
class SlicingGather(torch.autograd.Function):
    """Backward keeps this rank's slice of the gradient (tensor_parallel_output_grad=False)."""

    @staticmethod
    def forward(ctx, x):
        return _gather_list(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size())[dist.get_rank()].clone()


class AllReduceScatter(torch.autograd.Function):
    """Right values, but the forward all-reduces the whole tensor and slices: 1.5x the pair's bytes."""

    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y.chunk(dist.get_world_size())[dist.get_rank()].clone()

    @staticmethod
    def backward(ctx, grad):
        return _gather_list(grad)


class NoSumScatter(torch.autograd.Function):
    """Keeps this rank's rows of its own partial sum: nothing is added up."""

    @staticmethod
    def forward(ctx, x):
        return x.chunk(dist.get_world_size())[dist.get_rank()].clone()

    @staticmethod
    def backward(ctx, grad):
        return _gather_list(grad)


class AveragingScatter(torch.autograd.Function):
    """Reduce-scatter, then divides by the world size."""

    @staticmethod
    def forward(ctx, x):
        return _scatter_list(x) / dist.get_world_size()

    @staticmethod
    def backward(ctx, grad):
        return _gather_list(grad) / dist.get_world_size()


class FullGradGather(torch.autograd.Function):
    """Backward returns the whole [s, b, h] gradient unreduced (wrong shape for its input)."""

    @staticmethod
    def forward(ctx, x):
        return _gather_list(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class ZeroPadGather(torch.autograd.Function):
    """Right values, but gathers by all-reducing a zero-filled [s, b, h] buffer: twice an all-gather's bytes."""

    @staticmethod
    def forward(ctx, x):
        n, r = dist.get_world_size(), dist.get_rank()
        buf = x.new_zeros((n * x.shape[0], *x.shape[1:]))
        buf[r * x.shape[0]:(r + 1) * x.shape[0]] = x
        dist.all_reduce(buf)
        return buf

    @staticmethod
    def backward(ctx, grad):
        return _scatter_list(grad)


gather_backward_slices = _named((SlicingGather, ListScatter), "gather_backward_slices")
all_reduce_then_slice = _named((ListGather, AllReduceScatter), "all_reduce_then_slice")
scatter_without_sum = _named((ListGather, NoSumScatter), "scatter_without_sum")
scatter_averages = _named((ListGather, AveragingScatter), "scatter_averages")
gather_backward_full = _named((FullGradGather, ListScatter), "gather_backward_full")
gather_by_zero_padded_all_reduce = _named((ZeroPadGather, ListScatter), "gather_by_zero_padded_all_reduce")

WRONG = [
    (gather_backward_slices, "did not reduce-scatter the gradient"),
    (all_reduce_then_slice, "all-reduce already sends"),
    (scatter_without_sum, "without summing"),
    (scatter_averages, "average, not the sum"),
    (gather_backward_full, "reduce-scatter the [s, b, h] gradient"),
    (gather_by_zero_padded_all_reduce, "all-reduce already sends"),
]
