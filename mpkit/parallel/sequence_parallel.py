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
that of a reduce-scatter an all-gather.

In the code: ``sequence_parallel(module, plan)`` builds the layers of ``tensor_parallel`` as
``SequenceParallelColumnLinear`` (all-gather, matmul) and ``SequenceParallelRowLinear`` (matmul,
reduce-scatter); ``all_reduce_sequence_parallel_gradients`` sums the partial gradients; then the
autograd functions, the helpers they share, and the checks. ``parallel/mappings.py`` gives the
autograd functions Megatron's names.

Tensor parallelism splits the matmuls but leaves every rank a full copy of the activations
*between* them: the LayerNorms, dropouts and residual adds see the whole [s, b, h] tensor on every
rank (the 10·s·b·h of s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes per layer: Korthikanti §4.1's two
LayerNorm inputs, two dropout masks and the inputs of the QKV and first MLP matmuls). Those regions
work token by token, so sequence parallelism splits them along the sequence instead. The all-reduce that ended
each TP region becomes its two halves:

- ``gather_from_sequence_parallel_region`` (all-gather along the sequence forward, reduce-scatter of
  the gradient backward) in front of a column-parallel layer: the matmul needs every token.
- ``reduce_scatter_to_sequence_parallel_region`` (reduce-scatter forward, all-gather backward) after
  a row-parallel layer: each rank keeps the full sum of its own tokens only.

Same bytes as the all-reduce (an all-reduce *is* a reduce-scatter then an all-gather), but every
activation between the TP regions is now 1/t per rank: s·b·h·(34/t + 5·a·s/(h·t)) per layer. The
column layer keeps only its sequence shard of the input for the weight gradient and all-gathers it
again in backward (Megatron does the same), else the gathered input would be stored whole.

Parameters inside the sequence-parallel region (LayerNorm weights, row-parallel biases) see only
this rank's tokens, so their gradients are partial sums: ``sequence_parallel`` marks them and
``all_reduce_sequence_parallel_gradients`` sums them over the group after backward (Megatron's
``sequence_parallel`` attribute and its all-reduce of "layernorm grads"). An optimizer step on
marked gradients never summed is refused (each rank would step on its own tokens' gradient), and
so is a second sum after one backward (it would multiply them by t).

The sequence dimension is the first, as Megatron lays activations out ([s, b, h]); ``seq_dim=1``
for [b, s, h]. ``scatter_to_sequence_parallel_region`` / ``gather_from_sequence_parallel_region(...,
tensor_parallel_output_grad=False)`` enter and leave the region (after an embedding, before a
replicated head). A region's input must have the same shape on every rank: one small all-gather
per forward checks it (gloo aborts the process on collectives of different sizes).
"""
from __future__ import annotations

import functools
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from mpkit.observe import active
from mpkit.parallel.checks import check_same_shape
from mpkit.parallel.functional import all_reduce_flat
from mpkit.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear, plan_targets, tensor_parallel


def sequence_parallel(module: nn.Module, plan: dict, group=None, *, seq_dim: int = 0, rank=None,
                      world_size=None) -> nn.Module:
    """``tensor_parallel(module, plan)`` with Megatron sequence parallelism, in place; returns ``module``.

    ``module`` is the sequence-parallel region: its input and output are this rank's shard of the
    sequence along ``seq_dim`` (0 for Megatron's [seq, batch, hidden], 1 for [batch, seq, hidden]).
    Column layers all-gather their input, row layers reduce-scatter their output; every other
    parameter of ``module`` (LayerNorms, row biases) is marked ``param.sequence_parallel = True``
    for ``all_reduce_sequence_parallel_gradients``. Everything between the column and row layers
    must work per token or per head (as for TP); attention sees the whole sequence, since it runs
    between the gather and the reduce-scatter.
    """
    targets = plan_targets(module, plan)
    if any(split.gather_output for split in targets.values()):
        raise ValueError("sequence_parallel: a column layer with gather_output=True leaves the region whole; "
                         "inside a sequence-parallel region every column layer pairs with a row layer")
    layers = {style: functools.partial(cls, seq_dim=seq_dim) for style, cls in
              (("column", SequenceParallelColumnLinear), ("row", SequenceParallelRowLinear))}
    tensor_parallel(module, plan, group, rank=rank, world_size=world_size, layers=layers)
    sharded = {id(module.get_submodule(name).weight) for name in targets}
    sharded |= {id(module.get_submodule(n).bias) for n, s in targets.items()
                if s.style == "column" and module.get_submodule(n).bias is not None}
    _watch_optimizer_steps()
    for p in module.parameters():
        if id(p) not in sharded and not getattr(p, "sequence_parallel", False):
            p.sequence_parallel = True
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(_UNREDUCED.add)
    if dist.is_initialized():  # a live group (not a plan built without one)
        module.register_forward_pre_hook(functools.partial(_check_region_input, group=group))
    return module


def sequence_parallel_parameters(module: nn.Module) -> list:
    return [p for p in module.parameters() if getattr(p, "sequence_parallel", False)]


def all_reduce_sequence_parallel_gradients(module: nn.Module, group=None) -> None:
    """Sum the gradients of ``module``'s marked parameters over ``group``: each rank's gradient
    covers its own tokens only. One flat all-reduce (call after backward, before the optimizer;
    once per step, however many backwards accumulated into the gradients)."""
    grads = [p for p in sequence_parallel_parameters(module) if p.grad is not None]
    if grads and not any(_UNREDUCED.has(p) for p in grads):
        raise RuntimeError("all_reduce_sequence_parallel_gradients called twice after one backward: its gradients "
                           "are already the sum over the group, and summing again would multiply them by the group "
                           "size; call it once per step, after the last backward")
    all_reduce_flat([p.grad for p in grads], group, "sp layernorm/bias grads")
    for p in grads:
        _UNREDUCED.discard(p)


class SequenceParallelColumnLinear(ColumnParallelLinear):
    """A column-parallel layer whose input is this rank's sequence shard: all-gather, matmul."""

    def __init__(self, *args, seq_dim: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.seq_dim = seq_dim

    def forward(self, x):
        return _GatheredLinear.apply(x, self.weight, self.bias, self.seq_dim, self.group, self.name)


class SequenceParallelRowLinear(RowParallelLinear):
    """A row-parallel layer whose output is reduce-scattered into this rank's sequence shard; the
    bias is added to the shard (its gradient is then partial: see the module docstring)."""

    def __init__(self, *args, seq_dim: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.seq_dim = seq_dim

    def forward(self, x):
        y = ReduceScatterToSequenceParallelRegion.apply(F.linear(x, self.weight), self.seq_dim, self.group, self.name)
        return y + self.bias if self.bias is not None else y


class ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Keep this rank's shard along ``dim`` forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, dim, group, name):
        ctx.args = (dim, group, name)
        return split(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        dim, group, name = ctx.args
        return gather(grad, dim, group, f"sp scatter backward {name}"), None, None, None


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather along ``dim`` forward. Backward: reduce-scatter when the gathered tensor feeds a
    tensor-parallel layer (each rank's gradient is a partial sum over its slice of the weight;
    Megatron's ``tensor_parallel_output_grad=True``), or just this rank's shard when it feeds
    replicated layers (``False``: every rank already holds the same whole gradient)."""

    @staticmethod
    def forward(ctx, x, dim, group, name, tensor_parallel_output_grad):
        ctx.args = (dim, group, name, tensor_parallel_output_grad)
        return gather(x, dim, group, f"sp all-gather forward {name}")

    @staticmethod
    def backward(ctx, grad):
        dim, group, name, reduce = ctx.args
        out = reduce_scatter(grad, dim, group, f"sp reduce-scatter backward {name}") if reduce else split(grad, dim, group)
        return out, None, None, None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter along ``dim`` forward (the first half of the TP all-reduce), all-gather backward."""

    @staticmethod
    def forward(ctx, x, dim, group, name):
        ctx.args = (dim, group, name)
        return reduce_scatter(x, dim, group, f"sp reduce-scatter forward {name}")

    @staticmethod
    def backward(ctx, grad):
        dim, group, name = ctx.args
        return gather(grad, dim, group, f"sp all-gather backward {name}"), None, None, None


class _GatheredLinear(torch.autograd.Function):
    """All-gather the sequence shard, then ``F.linear``; saves only the shard and all-gathers it
    again in backward for the weight gradient (Megatron's
    ``LinearWithGradAccumulationAndAsyncCommunication`` with sequence parallelism)."""

    @staticmethod
    def forward(ctx, x, weight, bias, dim, group, name):
        ctx.save_for_backward(x, weight)
        ctx.args, ctx.has_bias = (dim, group, name), bias is not None
        return F.linear(gather(x, dim, group, f"sp all-gather forward {name}"), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dim, group, name = ctx.args
        # under autocast the forward's matmul ran in bf16/fp16 (grad's dtype) on fp32 saved tensors:
        # the backward's matmuls in that dtype too, each gradient returned in its input's dtype
        full = gather(x, dim, group, f"sp all-gather again backward {name}").to(grad.dtype)
        grad_input = reduce_scatter(grad @ weight.to(grad.dtype), dim, group, f"sp reduce-scatter backward {name}")
        grad_weight = grad.reshape(-1, grad.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0).to(weight.dtype) if ctx.has_bias else None
        return grad_input.to(x.dtype), grad_weight.to(weight.dtype), grad_bias, None, None, None


def gather(x, dim, group, name):
    """All ranks' shards of ``x`` concatenated along ``dim`` (rank order)."""
    n = dist.get_world_size(group)
    if n == 1:
        return x
    moved = x.movedim(dim, 0).contiguous()
    out = moved.new_empty((n * moved.shape[0], *moved.shape[1:]))
    active.comm().all_gather_into_tensor(out, moved, group=group, name=name)
    return out.movedim(0, dim)


def reduce_scatter(x, dim, group, name):
    """This rank's shard along ``dim`` of the sum of every rank's ``x``."""
    n = dist.get_world_size(group)
    if n == 1:
        return x
    check_divides(x, dim, n)
    moved = x.movedim(dim, 0).contiguous()
    out = moved.new_empty((moved.shape[0] // n, *moved.shape[1:]))
    active.comm().reduce_scatter_tensor(out, moved, group=group, name=name)
    return out.movedim(0, dim)


def split(x, dim, group):
    """This rank's shard of ``x`` along ``dim`` (block ``rank`` of the group's size)."""
    n = dist.get_world_size(group)
    check_divides(x, dim, n)
    return x.chunk(n, dim)[dist.get_rank(group)].contiguous()


def check_divides(x, dim, n):
    if x.shape[dim] % n:
        raise ValueError(f"sequence parallel: dimension {dim % x.dim()} of size {x.shape[dim]} cannot be cut into {n} "
                         f"equal shards; use a size (sequence length) the group size {n} divides")


# ---- the checks: one shape for the region on every rank, gradients summed once per step ----

def _check_region_input(module, args, group):
    if args and torch.is_tensor(args[0]):
        check_same_shape(args[0], group, "sequence_parallel region input",
                         "give every rank of the group an equal shard of the same sequence (its collectives exchange "
                         "blocks of one size; gloo aborts on another)")


class _Pending:
    """Marked parameters whose gradient grew since ``all_reduce_sequence_parallel_gradients`` last
    ran (by id, holding them weakly)."""

    def __init__(self):
        self.params = weakref.WeakValueDictionary()

    def add(self, p):
        self.params[id(p)] = p

    def discard(self, p):
        self.params.pop(id(p), None)

    def has(self, p) -> bool:
        return self.params.get(id(p)) is p

    def __bool__(self):
        return len(self.params) > 0


_UNREDUCED = _Pending()


def _step_before_sum(optimizer, args, kwargs) -> None:
    """A global optimizer step pre-hook (registered by the first ``sequence_parallel`` call, as torch's
    own profiler registers its hooks: every optimizer a learner builds is covered): refuse a step on
    sequence-parallel gradients never summed over the group. One empty test per step when nothing is
    pending."""
    if not _UNREDUCED:
        return
    if any(_UNREDUCED.has(p) for group in optimizer.param_groups for p in group["params"]):
        raise RuntimeError("optimizer.step() before all_reduce_sequence_parallel_gradients(module, group): the "
                           "LayerNorm and row-bias gradients of the sequence-parallel region are still this rank's "
                           "own tokens' (a partial sum), so each rank would step differently. Call "
                           "all_reduce_sequence_parallel_gradients(module, group) after backward, before "
                           "optimizer.step()")


@functools.cache
def _watch_optimizer_steps():
    """Register :func:`_step_before_sum` once, when sequence parallelism is first used (importing
    mpkit.parallel touches no optimizer)."""
    return register_optimizer_step_pre_hook(_step_before_sum)

__all__ = ["sequence_parallel", "all_reduce_sequence_parallel_gradients", "sequence_parallel_parameters",
           "SequenceParallelColumnLinear", "SequenceParallelRowLinear", "ScatterToSequenceParallelRegion",
           "GatherFromSequenceParallelRegion", "ReduceScatterToSequenceParallelRegion", "gather", "split",
           "reduce_scatter"]
