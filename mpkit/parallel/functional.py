"""Communication helpers shared by sequence, context and expert parallelism.

``all_to_all``: one differentiable all-to-all (Ulysses attention, the experts' dispatch/combine).
``all_reduce_flat``: many gradients summed in one flat all-reduce (the sequence-parallel
LayerNorm gradients, the experts' router).

``all_to_all(x, scatter_dim, gather_dim, group)`` cuts ``x`` into N blocks along ``scatter_dim``
(N = the group's size; equal blocks, or ``scatter_sizes[j]`` rows for rank j), sends block j to
rank j, and concatenates the blocks it receives, in rank order, along ``gather_dim``. Its
backward is the same exchange with the two dimensions (and their sizes) swapped: every gradient
block goes back to the rank its value came from (DeepSpeed Ulysses' ``_SeqAllToAll``, Megatron's
``all_to_all`` for MoE). Uneven blocks are what DeepSpeed's Ulysses does with a head count the
group does not divide: the first H mod N ranks take one head more. It is one traced
``all_to_all`` event (``torch.distributed.all_to_all_single``, with split sizes) forward and one
backward, through ``mpkit.observe.active.comm()``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from mpkit.observe import active


def even_sizes(total: int, parts: int) -> list[int]:
    """``total`` rows over ``parts`` ranks as DeepSpeed splits uneven heads: the first
    ``total % parts`` ranks one more."""
    return [total // parts + (r < total % parts) for r in range(parts)]


def _exchange(x, scatter_dim, gather_dim, group, name, scatter_sizes, gather_sizes):
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return x.contiguous()
    blocks = x.split(scatter_sizes, dim=scatter_dim)  # block j goes to rank j
    send = torch.cat([b.reshape(-1) for b in blocks])

    def arriving(i):  # rank i's block for this rank
        shape = list(x.shape)
        shape[scatter_dim], shape[gather_dim] = scatter_sizes[me], gather_sizes[i]
        return shape
    shapes = [arriving(i) for i in range(n)]
    recv = send.new_empty(sum(math.prod(s) for s in shapes))
    active.comm().all_to_all_single(recv, send, group=group, name=name,
                                    output_split_sizes=[math.prod(s) for s in shapes],
                                    input_split_sizes=[b.numel() for b in blocks])
    return torch.cat([part.view(s) for part, s in zip(recv.split([math.prod(s) for s in shapes]), shapes)],
                     dim=gather_dim)


def _label(name: str) -> str:
    return name if "all-to-all" in name else f"all-to-all {name!r}"


def check_sizes(x, scatter_dim, n, name, scatter_sizes):
    """The block sizes along ``scatter_dim``: ``scatter_sizes`` checked, or N equal blocks."""
    size = x.shape[scatter_dim]
    if scatter_sizes is None:
        if size % n:
            raise ValueError(f"{_label(name)}: dimension {scatter_dim} of size {size} cannot be cut into {n} equal "
                             f"blocks, one per rank; use a size that the group size {n} divides, or pass "
                             f"scatter_sizes={even_sizes(size, n)} for uneven blocks")
        return [size // n] * n
    sizes = [int(s) for s in scatter_sizes]
    if len(sizes) != n or sum(sizes) != size or min(sizes) < 0:
        raise ValueError(f"{_label(name)}: scatter_sizes={list(scatter_sizes)} must give one block size per rank "
                         f"({n}), summing to dimension {scatter_dim}'s size {size}")
    return sizes


def all_reduce_flat(tensors, group=None, name: str = "grads", average: bool = False) -> None:
    """Sum (or ``average``) ``tensors`` over ``group`` in place with one all-reduce of their
    concatenation: one message instead of one per tensor (latency is paid per message)."""
    if not tensors or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    active.comm().all_reduce(flat, op="avg" if average else "sum", group=group, name=name)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


class AllToAll(torch.autograd.Function):
    """All-to-all forward, the inverse all-to-all backward."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group, name, scatter_sizes, gather_sizes):
        ctx.args = (scatter_dim, gather_dim, group, name, scatter_sizes, gather_sizes)
        return _exchange(x, scatter_dim, gather_dim, group, f"{name} forward", scatter_sizes, gather_sizes)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim, group, name, scatter_sizes, gather_sizes = ctx.args
        return (_exchange(grad, gather_dim, scatter_dim, group, f"{name} backward", gather_sizes, scatter_sizes),
                None, None, None, None, None, None)


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group=None, name: str = "all-to-all", *,
               scatter_sizes=None, gather_sizes=None):
    """Differentiable all-to-all over ``group`` (see the module docstring). ``scatter_sizes``: the
    rows of ``scatter_dim`` for each rank (default: equal); ``gather_sizes``: the size of
    ``gather_dim`` on each rank (default: all this rank's), which the backward needs after an
    uneven forward. With ``scatter_dim == gather_dim`` rows are exchanged (a dropless MoE's
    tokens): ``gather_sizes`` are then the rows each rank sends to this one."""
    scatter_dim, gather_dim = scatter_dim % x.dim(), gather_dim % x.dim()
    n = dist.get_world_size(group)
    sizes = check_sizes(x, scatter_dim, n, name, scatter_sizes)
    if gather_sizes is not None:
        gathered = [int(s) for s in gather_sizes]
    elif scatter_dim == gather_dim:  # every rank sends this one a block of this rank's size
        gathered = [sizes[dist.get_rank(group)]] * n
    else:
        gathered = [x.shape[gather_dim]] * n
    return AllToAll.apply(x, scatter_dim, gather_dim, group, name, sizes, gathered)


__all__ = ["AllToAll", "all_to_all", "all_reduce_flat", "even_sizes"]
