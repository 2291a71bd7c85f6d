"""Megatron-LM tensor-parallel building blocks: two communication functions and two layers.

The whole trick of Megatron's MLP/attention split is two conjugate operators (Shoeybi et al. 2019):

- ``f`` = ``CopyToParallelRegion``: identity forward, all-reduce backward. It sits in front of a
  column-parallel layer: every rank reads the same input, so the input's gradient is the SUM of
  the partial gradients each rank's slice of the weight contributes.
- ``g`` = ``ReduceFromParallelRegion``: all-reduce forward, identity backward. It sits after a
  row-parallel layer: each rank holds a partial sum of the output; the sum is the real output,
  and its gradient is the same on every rank, so it passes through unchanged.

A column-parallel layer followed by a row-parallel one therefore costs one all-reduce forward (g)
and one backward (f), whatever lies between them, as long as it is elementwise (ReLU, GeLU) or
independent per attention head. Each all-reduce goes through ``ctx.comm`` so it appears in the
trace; the functions take the ``Comm`` as an argument because an autograd function has no other
way to reach it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CopyToParallelRegion(torch.autograd.Function):
    """f: identity forward, all-reduce (sum) of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, comm, name):
        ctx.comm, ctx.name = comm, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        ctx.comm.all_reduce(grad, name=f"f backward {ctx.name}")
        return grad, None, None


class ReduceFromParallelRegion(torch.autograd.Function):
    """g: all-reduce (sum) of the partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm, name):
        out = x.contiguous().clone()  # all_reduce is in place; never modify an autograd input
        comm.all_reduce(out, name=f"g forward {name}")
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def copy_to_parallel_region(x, comm, name=""):
    return CopyToParallelRegion.apply(x, comm, name)


def reduce_from_parallel_region(x, comm, name=""):
    return ReduceFromParallelRegion.apply(x, comm, name)


class _ShardedLinear(nn.Module):
    """A slice of a full ``nn.Linear``: the rows (column-parallel) or input columns (row-parallel)
    listed in ``indices[rank]``. Keeping every rank's index list lets ``gather`` put the shards
    back into the full layer's layout."""

    dim: int  # the weight dimension that is split: 0 = output features, 1 = input features

    def __init__(self, full: nn.Linear, indices: list[torch.Tensor], rank: int, comm, name: str):
        super().__init__()
        self.indices, self.rank, self.comm, self.name = indices, rank, comm, name
        own = indices[rank]
        self.weight = nn.Parameter(full.weight.detach().index_select(self.dim, own))
        self.full_shapes = {"weight": tuple(full.weight.shape)}
        if full.bias is not None:
            bias = full.bias.detach()
            self.bias = nn.Parameter(bias.index_select(0, own) if self.dim == 0 else bias.clone())
            self.full_shapes["bias"] = tuple(bias.shape)
        else:
            self.bias = None

    def sharded(self, param_name: str) -> bool:
        return param_name == "weight" or self.dim == 0

    def gather(self, param_name: str) -> torch.Tensor:
        """The full tensor of ``weight``/``bias`` in the single model's layout (a collective)."""
        local = getattr(self, param_name).detach()
        if not self.sharded(param_name):
            return local.clone()
        shards = [torch.empty_like(local) for _ in self.indices]
        self.comm.all_gather(shards, local.contiguous(), name=f"gather {self.name}.{param_name}")
        full = torch.empty(self.full_shapes[param_name], dtype=local.dtype, device=local.device)
        dim = self.dim if param_name == "weight" else 0
        for idx, shard in zip(self.indices, shards):
            full.index_copy_(dim, idx.to(full.device), shard)
        return full


class ColumnParallelLinear(_ShardedLinear):
    """Y_i = X · A_iᵀ + b_i: this rank's output features. Input goes through f first."""

    dim = 0

    def forward(self, x):
        return F.linear(copy_to_parallel_region(x, self.comm, self.name), self.weight, self.bias)


class RowParallelLinear(_ShardedLinear):
    """Y = g(Σ_i X_i · A_iᵀ) + b: this rank's input features; the bias is added once, after
    the reduce (adding it on every rank would count it world_size times)."""

    dim = 1

    def forward(self, x):
        y = reduce_from_parallel_region(F.linear(x, self.weight), self.comm, self.name)
        return y + self.bias if self.bias is not None else y


def contiguous_split(size: int, parts: int) -> list[torch.Tensor]:
    """Rank r owns indices [r·size/parts, (r+1)·size/parts)."""
    return list(torch.arange(size).chunk(parts))


def head_split(hidden: int, parts: int) -> list[torch.Tensor]:
    """Rows of the fused qkv weight (3·hidden, hidden) that belong to each rank's heads.

    The model views qkv's output as (3, heads, head_dim): row ``j·hidden + h·head_dim + d`` is
    part j (q, k or v) of head h. Rank r owns heads [r·heads/parts, (r+1)·heads/parts), i.e.
    the same block of rows inside each of the q, k and v thirds; taken in this order, its local
    output views as (3, heads/parts, head_dim) just like the full one.
    """
    per_rank = hidden // parts
    return [torch.cat([j * hidden + r * per_rank + torch.arange(per_rank) for j in range(3)])
            for r in range(parts)]
