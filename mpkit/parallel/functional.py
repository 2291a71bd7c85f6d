"""Communication helpers shared by sequence, context and expert parallelism.

``all_to_all``: one differentiable all-to-all (Ulysses attention, the experts' dispatch/combine).
``all_reduce_flat``: many gradients summed in one flat all-reduce (the sequence-parallel
LayerNorm gradients, the experts' router).

``all_to_all(x, scatter_dim, gather_dim, group)`` cuts ``x`` into N equal blocks along
``scatter_dim`` (N = the group's size), sends block j to rank j, and concatenates the blocks it
receives, in rank order, along ``gather_dim``. Its backward is the same exchange with the two
dimensions swapped: every gradient block goes back to the rank its value came from (DeepSpeed
Ulysses' ``_SeqAllToAll``, Megatron's ``all_to_all`` for MoE). It is one traced
``all_to_all`` event (``torch.distributed.all_to_all_single``, equal splits) forward and one
backward, through ``mpkit.observe.active.comm()``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mpkit.observe import active


def _exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, group, name: str) -> torch.Tensor:
    n = dist.get_world_size(group)
    if n == 1:
        return x.contiguous()
    if x.shape[scatter_dim] % n:
        raise ValueError(f"all-to-all {name}: dimension {scatter_dim} of size {x.shape[scatter_dim]} cannot be cut "
                         f"into {n} equal blocks, one per rank; use a size that the group size {n} divides")
    blocks = x.movedim(scatter_dim, 0)  # block j (rows j·k..(j+1)·k of dim 0) goes to rank j
    send = blocks.reshape(n, blocks.shape[0] // n, *blocks.shape[1:]).contiguous()
    recv = torch.empty_like(send)
    active.comm().all_to_all_single(recv, send, group=group, name=name)
    received = recv.movedim(1, scatter_dim + 1)  # [n, ...x's shape with scatter_dim cut...]
    return torch.cat(received.unbind(0), dim=gather_dim)


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
    def forward(ctx, x, scatter_dim, gather_dim, group, name):
        ctx.dims, ctx.group, ctx.name = (scatter_dim, gather_dim), group, name
        return _exchange(x, scatter_dim, gather_dim, group, f"{name} forward")

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, gather_dim, scatter_dim, ctx.group, f"{ctx.name} backward"), None, None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group=None, name: str = "all-to-all"):
    """Differentiable all-to-all over ``group`` (see the module docstring); dims are non-negative."""
    return AllToAll.apply(x, scatter_dim % x.dim(), gather_dim % x.dim(), group, name)


__all__ = ["AllToAll", "all_to_all", "all_reduce_flat"]
