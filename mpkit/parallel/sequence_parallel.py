"""Megatron sequence parallelism (Korthikanti et al. 2022) on top of ``tensor_parallel``.

The mechanism in ~20 lines (a block ``x + down(act(up(norm(x))))`` on N ranks, each holding its
own slice of the sequence; the code below adds the backward of each collective, other sequence
dims, the marking of the partial gradients and the checks)::

    def all_gather_seq(x):                                # [b, s/N, h] -> [b, s, h]: every token
        out = x.new_empty((N * len(x), *x.shape[1:]))     # rank j's block: rows j·b .. (j+1)·b-1
        dist.all_gather_into_tensor(out, x.contiguous())
        return torch.cat(out.chunk(N), dim=1)

    def reduce_scatter_seq(y):                            # [b, s, h] partial sums -> [b, s/N, h]
        send = torch.cat(y.chunk(N, dim=1))               # block j: rank j's tokens
        out = send.new_empty((len(y), *send.shape[1:]))
        dist.reduce_scatter_tensor(out, send)             # the full sum, of this rank's tokens only
        return out

    rows = torch.arange(up.out_features).chunk(N)[r]      # as in tensor parallelism
    up_w, up_b, down_w = up.weight[rows], up.bias[rows], down.weight[:, rows]

    def block(x_local):                                   # this rank's tokens in, its tokens out
        h = norm(x_local)                                 # per token: on s/N tokens only
        h = act(F.linear(all_gather_seq(h), up_w, up_b))  # column layer: needs every token
        y = reduce_scatter_seq(F.linear(h, down_w))       # row layer: sum, keep this rank's tokens
        return x_local + y + down.bias                    # residual and bias on s/N tokens

Backward runs each collective's conjugate: the gradient of an all-gather is a reduce-scatter and
that of a reduce-scatter an all-gather. In the code: ``sequence_parallel(module, plan)`` turns the
layers of ``tensor_parallel`` into ``SequenceParallelColumnLinear`` (all-gather, matmul) and
``SequenceParallelRowLinear`` (matmul, reduce-scatter); ``all_reduce_sequence_parallel_gradients``
sums the partial gradients; then the autograd functions and the helpers they share.

Tensor parallelism splits the matmuls but leaves every rank a full copy of the activations
*between* them: the LayerNorms, dropouts and residual adds see the whole [b, s, h] tensor on every
rank (the 10·s·b·h of s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes per layer). Those regions work token by
token, so sequence parallelism splits them along the sequence instead. The all-reduce that ended
each TP region becomes its two halves:

- ``gather_from_sequence_parallel_region`` (all-gather along the sequence forward, reduce-scatter of
  the gradient backward) in front of a column-parallel layer: the matmul needs every token.
- ``ReduceScatterToSequenceParallelRegion`` (reduce-scatter forward, all-gather backward) after
  a row-parallel layer: each rank keeps the full sum of its own tokens only.

Same bytes as the all-reduce (an all-reduce *is* a reduce-scatter then an all-gather), but every
activation between the TP regions is now 1/t per rank: s·b·h·(34/t + 5·a·s/(h·t)) per layer. The
column layer keeps only its sequence shard of the input for the weight gradient and all-gathers it
again in backward (Megatron does the same), else the gathered input would be stored whole.

Parameters inside the sequence-parallel region (LayerNorm weights, row-parallel biases) see only
this rank's tokens, so their gradients are partial sums: ``sequence_parallel`` marks them and
``all_reduce_sequence_parallel_gradients`` sums them over the group after backward (Megatron's
``sequence_parallel`` attribute and its all-reduce of "layernorm grads").

``scatter_to_sequence_parallel_region`` / ``gather_from_sequence_parallel_region(..., to_full=True)``
enter and leave the region (after an embedding, before a replicated head).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mpkit.observe import active
from mpkit.parallel.functional import all_reduce_flat
from mpkit.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear, plan_targets, tensor_parallel


def sequence_parallel(module: nn.Module, plan: dict, group=None, *, seq_dim: int = 1, rank=None,
                      world_size=None) -> nn.Module:
    """``tensor_parallel(module, plan)`` with Megatron sequence parallelism, in place; returns ``module``.

    ``module`` is the sequence-parallel region: its input and output are this rank's shard of the
    sequence along ``seq_dim`` (1 for [batch, seq, hidden]). Column layers all-gather their input,
    row layers reduce-scatter their output; every other parameter of ``module`` (LayerNorms, row
    biases) is marked ``param.sequence_parallel = True`` for ``all_reduce_sequence_parallel_gradients``.
    Everything between the column and row layers must work per token or per head (as for TP);
    attention sees the whole sequence, since it runs between the gather and the reduce-scatter.
    """
    targets = plan_targets(module, plan)
    if any(split.gather_output for split in targets.values()):
        raise ValueError("sequence_parallel: a column layer with gather_output=True leaves the region whole; "
                         "inside a sequence-parallel region every column layer pairs with a row layer")
    tensor_parallel(module, plan, group, rank=rank, world_size=world_size)
    for name in targets:
        layer = module.get_submodule(name)
        layer.__class__ = _SP_CLASSES[type(layer)]  # same slices, sequence-parallel communication
        layer.seq_dim = seq_dim
    sharded = {id(p) for name in targets for p in (module.get_submodule(name).weight,)}
    sharded |= {id(module.get_submodule(n).bias) for n, s in targets.items()
                if s.style == "column" and module.get_submodule(n).bias is not None}
    for p in module.parameters():
        if id(p) not in sharded:
            p.sequence_parallel = True
    return module


def sequence_parallel_parameters(module: nn.Module) -> list:
    return [p for p in module.parameters() if getattr(p, "sequence_parallel", False)]


def all_reduce_sequence_parallel_gradients(module: nn.Module, group=None) -> None:
    """Sum the gradients of ``module``'s marked parameters over ``group``: each rank's gradient
    covers its own tokens only. One flat all-reduce (call after backward, before the optimizer)."""
    all_reduce_flat([p.grad for p in sequence_parallel_parameters(module) if p.grad is not None], group,
                    "sp layernorm/bias grads")


def scatter_to_sequence_parallel_region(x, group=None, seq_dim: int = 1, name: str = "input"):
    """Enter the region: this rank's shard of the sequence (backward: all-gather)."""
    return ScatterToSequenceParallelRegion.apply(x, seq_dim, group, name)


def gather_from_sequence_parallel_region(x, group=None, seq_dim: int = 1, name: str = "output", to_full: bool = True):
    """Leave the region: the whole sequence on every rank (backward: this rank's shard of the
    gradient, ``to_full=True``, for replicated layers after it; reduce-scatter for a TP layer)."""
    return GatherFromSequenceParallelRegion.apply(x, seq_dim, group, name, to_full)


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """A column-parallel layer whose input is this rank's sequence shard: all-gather, matmul."""

    seq_dim = 1

    def forward(self, x):
        return _GatheredLinear.apply(x, self.weight, self.bias, self.seq_dim, self.group, self.name)


class SequenceParallelRowLinear(RowParallelLinear):
    """A row-parallel layer whose output is reduce-scattered into this rank's sequence shard; the
    bias is added to the shard (its gradient is then partial: see the module docstring)."""

    seq_dim = 1

    def forward(self, x):
        y = ReduceScatterToSequenceParallelRegion.apply(F.linear(x, self.weight), self.seq_dim, self.group, self.name)
        return y + self.bias if self.bias is not None else y


_SP_CLASSES = {ColumnParallelLinear: SequenceParallelColumnLinear, RowParallelLinear: SequenceParallelRowLinear}


class ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Keep this rank's shard of the sequence forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, dim, group, name):
        ctx.args = (dim, group, name)
        return _split(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        dim, group, name = ctx.args
        return _gather(grad, dim, group, f"sp scatter backward {name}"), None, None, None


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather along the sequence forward. Backward: reduce-scatter when the gathered tensor
    feeds a tensor-parallel layer (each rank's gradient is a partial sum over its slice of the
    weight), or just this rank's shard when it feeds replicated layers (``to_full``: every rank
    already holds the same whole gradient)."""

    @staticmethod
    def forward(ctx, x, dim, group, name, to_full):
        ctx.args = (dim, group, name, to_full)
        return _gather(x, dim, group, f"sp all-gather forward {name}")

    @staticmethod
    def backward(ctx, grad):
        dim, group, name, to_full = ctx.args
        out = _split(grad, dim, group) if to_full else _reduce_scatter(grad, dim, group,
                                                                        f"sp reduce-scatter backward {name}")
        return out, None, None, None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter along the sequence forward (the first half of the TP all-reduce),
    all-gather backward."""

    @staticmethod
    def forward(ctx, x, dim, group, name):
        ctx.args = (dim, group, name)
        return _reduce_scatter(x, dim, group, f"sp reduce-scatter forward {name}")

    @staticmethod
    def backward(ctx, grad):
        dim, group, name = ctx.args
        return _gather(grad, dim, group, f"sp all-gather backward {name}"), None, None, None


class _GatheredLinear(torch.autograd.Function):
    """All-gather the sequence shard, then ``F.linear``; saves only the shard and all-gathers it
    again in backward for the weight gradient (Megatron's
    ``LinearWithGradAccumulationAndAsyncCommunication`` with sequence parallelism)."""

    @staticmethod
    def forward(ctx, x, weight, bias, dim, group, name):
        ctx.save_for_backward(x, weight)
        ctx.args, ctx.has_bias = (dim, group, name), bias is not None
        return F.linear(_gather(x, dim, group, f"sp all-gather forward {name}"), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dim, group, name = ctx.args
        # under autocast the forward's matmul ran in bf16/fp16 (grad's dtype) on fp32 saved tensors:
        # the backward's matmuls in that dtype too, each gradient returned in its input's dtype
        full = _gather(x, dim, group, f"sp all-gather again backward {name}").to(grad.dtype)
        grad_input = _reduce_scatter(grad @ weight.to(grad.dtype), dim, group, f"sp reduce-scatter backward {name}")
        grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0).to(weight.dtype) if ctx.has_bias else None
        return grad_input.to(x.dtype), grad_weight.to(weight.dtype), grad_bias, None, None, None


def _gather(x, dim, group, name):
    """All ranks' shards of ``x`` concatenated along ``dim`` (rank order)."""
    n = dist.get_world_size(group)
    if n == 1:
        return x
    moved = x.movedim(dim, 0).contiguous()
    out = moved.new_empty((n * moved.shape[0], *moved.shape[1:]))
    active.comm().all_gather_into_tensor(out, moved, group=group, name=name)
    return out.movedim(0, dim)


def _reduce_scatter(x, dim, group, name):
    """This rank's shard along ``dim`` of the sum of every rank's ``x``."""
    n = dist.get_world_size(group)
    if n == 1:
        return x
    _check_divides(x, dim, n)
    moved = x.movedim(dim, 0).contiguous()
    out = moved.new_empty((moved.shape[0] // n, *moved.shape[1:]))
    active.comm().reduce_scatter_tensor(out, moved, group=group, name=name)
    return out.movedim(0, dim)


def _split(x, dim, group):
    n = dist.get_world_size(group)
    _check_divides(x, dim, n)
    return x.chunk(n, dim)[dist.get_rank(group)].contiguous()


def _check_divides(x, dim, n):
    if x.shape[dim] % n:
        raise ValueError(f"sequence parallel: a sequence of {x.shape[dim]} tokens cannot be cut into {n} equal "
                         f"shards; use a sequence length the tp size {n} divides")


__all__ = ["sequence_parallel", "all_reduce_sequence_parallel_gradients", "sequence_parallel_parameters",
           "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
           "SequenceParallelColumnLinear", "SequenceParallelRowLinear"]
