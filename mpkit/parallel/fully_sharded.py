"""ZeRO-3 / FSDP with torch's own ``fully_shard`` (FSDP2), every collective traced.

mpkit does not re-implement FSDP: ``fully_shard(unit, mesh=...)`` turns each unit's parameters
into DTensors sharded along dim 0 over the mesh (padding dim 0 to a multiple of N: rank r holds
rows [r·c, (r+1)·c), c = ceil(d0/N)); before a unit's forward (and again before its backward)
its parameters are all-gathered, used and freed; after its backward the gradients are
reduce-scattered, so each rank keeps only its shard, averaged over the mesh. The root unit owns
whatever no unit holds and drives the lazy initialisation.

Units: each layer of a stack (the built-in models' ``layers``, an ``nn.Sequential``'s children, a
pipeline stage's layers), or each top-level child of another model; a layer without parameters is
no unit, and neither are children that share a parameter (tied weights: FSDP2 refuses a
parameter in two units, so those stay with the root, which gathers the shared tensor once).

Tracing: FSDP2's public ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` let us issue its
collectives ourselves, so each one is logged as an event with its bytes and its group's name: an
async all-gather ends when its Work's future completes, a blocking reduce-scatter when the call
returns. Not traced: the all-gathers that ``DTensor.full_tensor()`` does to report full parameters.

With hand-written tensor parallelism (``ColumnParallelLinear``/``RowParallelLinear``, whose slices
are plain tensors, not DTensors) FSDP shards each slice over the data-parallel mesh like any
other parameter: the TP collectives run inside the unit's forward on the gathered slices. With a
pipeline every micro-batch's forward gathers and its backward reduce-scatters (gradients
accumulate in the shards); torch's ``PipelineStage`` instead defers the reduce-scatter to the last
micro-batch (``set_requires_gradient_sync``), m times fewer bytes for the same result.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from mpkit.observe import active
from mpkit.observe.comm import group_label, nbytes


def shard_fully(units: dict, root: nn.Module, mesh) -> nn.Module:
    """``fully_shard`` every unit of ``units`` ({name: module}) and then ``root`` over the 1-D
    ``mesh``, each unit's collectives traced under its name. Returns ``root``."""
    for name, unit in units.items():
        fully_shard(unit, mesh=mesh)
        unit.set_custom_all_gather(TracedAllGather(name))
        unit.set_custom_reduce_scatter(TracedReduceScatter(name))
    fully_shard(root, mesh=mesh)
    return root


def units_of(children: dict) -> dict:
    """{name: child} of the children that become FSDP units: those holding parameters, except
    children that share a parameter with another (see the module docstring)."""
    children = {name: child for name, child in children.items() if any(True for _ in child.parameters())}
    holders = {}  # id(parameter) -> the children holding it
    for name, child in children.items():
        for param in child.parameters():
            holders.setdefault(id(param), set()).add(name)
    tied = {name for names in holders.values() if len(names) > 1 for name in names}
    return {name: child for name, child in children.items() if name not in tied}


def _log(kind, start, work, size, name, group):
    trace = active.trace()

    def record(_fut=None):
        trace.record(kind, start, trace.now(), bytes=size, name=name, group=group_label(group))

    if work is None:
        record()
    else:
        work.get_future().then(record)
    return work


class _Traced:
    """What FSDP2's ``set_custom_all_gather``/``set_custom_reduce_scatter`` take: ``allocate`` and a
    call issuing the collective. Ours issue FSDP2's own ops and log each as one event."""

    def __init__(self, name):
        self.name = name

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)


class TracedAllGather(_Traced):
    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        start = active.trace().now()
        work = dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        return _log("all_gather", start, work, nbytes(output_tensor), self.name, group)


class TracedReduceScatter(_Traced):
    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        start = active.trace().now()
        work = dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        return _log("reduce_scatter", start, work, nbytes(input_tensor), self.name, group)


__all__ = ["shard_fully", "units_of"]
