"""Blind attempts (blind-b) at sequence_parallel_mappings: written from the stub and hints only."""
import torch
import torch.distributed as dist
from torch.distributed import all_reduce


def _gather_list(x):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=0)


def _reduce_scatter_list(x):
    n = dist.get_world_size()
    out = torch.empty_like(x.chunk(n, dim=0)[0])
    dist.reduce_scatter(out, [c.contiguous() for c in x.chunk(n, dim=0)])
    return out


def _gather_tensor(x):
    x = x.contiguous()
    out = x.new_empty((dist.get_world_size() * x.shape[0],) + tuple(x.shape[1:]))
    dist.all_gather_into_tensor(out, x)
    return out


def _reduce_scatter_all_to_all(x):
    n = dist.get_world_size()
    x = x.contiguous()
    got = torch.empty_like(x)
    dist.all_to_all_single(got, x)
    return got.view((n, x.shape[0] // n) + tuple(x.shape[1:])).sum(0)


def _allreduce_slice(x):
    full = x.clone().contiguous()
    dist.all_reduce(full)
    return full.chunk(dist.get_world_size(), dim=0)[dist.get_rank()].contiguous()


def _pair(gather_fwd, gather_bwd, rs_fwd, rs_bwd, name):
    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return gather_fwd(x)

        @staticmethod
        def backward(ctx, grad):
            return gather_bwd(grad)

    class ReduceScatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return rs_fwd(x)

        @staticmethod
        def backward(ctx, grad):
            return rs_bwd(grad)

    Gather.__name__, ReduceScatter.__name__ = "Gather_" + name, "ReduceScatter_" + name
    return Gather, ReduceScatter


# correct, unusual: list collectives (all_gather into a list + cat, reduce_scatter over chunks)
lists = _pair(_gather_list, _reduce_scatter_list, _reduce_scatter_list, _gather_list, "lists")

# correct, unusual: reduce-scatter as one all_to_all_single and a local sum (same bytes), all_gather_into_tensor
all_to_all = _pair(_gather_tensor, _reduce_scatter_all_to_all, _reduce_scatter_all_to_all, _gather_tensor, "a2a")


def _allreduce_slice_imported(x):
    full = x.clone().contiguous()
    all_reduce(full)
    return full.chunk(dist.get_world_size(), dim=0)[dist.get_rank()].contiguous()


# mistake (values right, wasteful): all-reduce + slice again, via `from torch.distributed import all_reduce`
allreduce_slice_imported = _pair(_gather_tensor, _allreduce_slice_imported, _allreduce_slice_imported, _gather_tensor,
                                 "allreduce_imported")


def _own_slice(grad):
    return grad.chunk(dist.get_world_size(), dim=0)[dist.get_rank()].contiguous()


# mistake: Gather's backward keeps only this rank's slice of the gradient, no sum over the ranks
slice_backward = _pair(_gather_tensor, _own_slice, _reduce_scatter_all_to_all, _gather_tensor, "slice")

# mistake (values right, wasteful): reduce-scatters done as all-reduce + slice (twice the bytes)
allreduce_slice = _pair(_gather_tensor, _allreduce_slice, _allreduce_slice, _gather_tensor, "allreduce")


def _mean_reduce_scatter(grad):
    return _reduce_scatter_list(grad) / dist.get_world_size()


# mistake: Gather's backward averages the ranks' partial gradients instead of summing them
mean_backward = _pair(_gather_tensor, _mean_reduce_scatter, _reduce_scatter_list, _gather_tensor, "mean")


def _gather_dim1(x):
    return torch.cat(_gather_list(x).chunk(dist.get_world_size(), dim=0), dim=1)


# mistake: gathers along the batch (dimension 1) instead of the sequence (dimension 0)
gather_dim1 = _pair(_gather_dim1, _reduce_scatter_list, _reduce_scatter_list, _gather_list, "dim1")

# mistake (raises): ReduceScatter's backward returns the [s/N, b, h] gradient as it is (no all-gather): wrong shape
no_gather_backward = _pair(_gather_tensor, _reduce_scatter_list, _reduce_scatter_list, lambda g: g, "nogather")

CORRECT = [lists, all_to_all]
WRONG = [
    (slice_backward, ("reduce-scatter", "partial", "sum over", "conjugate")),
    (allreduce_slice, ("bytes", "all-reduce", "all_reduce")),
    (allreduce_slice_imported, ("bytes", "all-reduce", "all_reduce")),
    (mean_backward, ("summed", "average", "divide", "mean")),
    (gather_dim1, ("dimension 0", "dim=0", "dim 0", "sequence dimension")),
    (no_gather_backward, ("shape", "all-gather", "conjugate")),
]
