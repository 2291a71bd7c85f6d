"""A module and its optimizer as the single model's state: every tensor under the single model's
name and global shape, holding only this rank's chunks (views of the live tensors).

``model.<name>`` for parameters and persistent buffers, ``optim.<name>.<key>`` for the optimizer
state of parameter ``<name>`` (Adam's ``exp_avg``/``exp_avg_sq`` shaped like the parameter, its
0-d ``step``). The same dictionary serves saving (DCP reads the chunks) and loading (DCP writes
into them), so a layout is described once.

Names: ``DataParallel``/DDP wrap the model as ``.module`` (dropped); a ``Pipeline`` holds stages
whose layers keep their index in the sequence that was cut (``Stage.layer_ids``, under ``prefix``,
e.g. ``"layers."`` for the built-in models); ``expert_parallel`` keeps experts ``first..`` under
their own index. Placement: a tensor-parallel layer's weight (and a column layer's bias) keeps
``indices[rank]`` along its split dimension; an FSDP2 parameter is a DTensor (DCP knows its
shard); anything else is replicated (each replica offers the whole tensor, DCP writes it once).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from mpkit.parallel.checkpoint.chunks import Sharded, chunks_of
from mpkit.parallel.data_parallel import DataParallel
from mpkit.parallel.expert_parallel import ExpertParallelMoE
from mpkit.parallel.pipeline import Pipeline
from mpkit.parallel.pipeline.split import Stage
from mpkit.parallel.sharded_optimizer import ShardedOptimizer
from mpkit.parallel.tensor_parallel import _ShardedLinear


@dataclass
class Placed:
    """A live tensor of this rank, the global shape of the single model's tensor and, per
    dimension, the global index of each local index (None: the whole dimension, as is)."""

    tensor: torch.Tensor
    shape: tuple
    maps: list | None = None

    def chunks(self, local=None, flat=None):
        """``local`` (default: the tensor itself, or a state tensor shaped like it) as what DCP
        saves: a DTensor as is, else a ``Sharded``. ``flat``: see ``chunks_of``."""
        local = self.tensor if local is None else local
        if isinstance(local, DTensor):
            return local
        return Sharded(self.shape, chunks_of(local, self.maps, flat))


def placements(module: nn.Module, prefix: str = "") -> dict[str, Placed]:
    """{the single model's name: Placed} for every parameter and persistent buffer this rank holds
    (a tied tensor once, under its first name)."""
    out, seen = {}, set()
    for name, owner, attr, tensor in _walk(module, prefix):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        out[name] = _place(owner, attr, tensor)
    return out


def _walk(module: nn.Module, prefix: str):
    """(name in the single model, owning module, attribute, tensor) in registration order."""
    if isinstance(module, (DataParallel, nn.parallel.DistributedDataParallel)):
        yield from _walk(module.module, prefix)
        return
    if isinstance(module, Pipeline):
        for s, stage in module.stages.items():
            yield from (_walk(stage, prefix) if isinstance(stage, Stage) else _walk(stage, f"{prefix}{s}."))
        return
    if isinstance(module, Stage):
        for layer_id, layer in zip(module.layer_ids, module):
            yield from _walk(layer, f"{prefix}{layer_id}.")
        return
    for attr, p in module._parameters.items():
        if p is not None:
            yield prefix + attr, module, attr, p
    for attr, b in module._buffers.items():
        if b is not None and attr not in module._non_persistent_buffers_set:
            yield prefix + attr, module, attr, b
    for attr, child in module._modules.items():
        if child is None:
            continue
        if isinstance(module, ExpertParallelMoE) and attr == "experts":  # this rank's experts first..first+E/N-1
            for i, expert in enumerate(child):
                yield from _walk(expert, f"{prefix}experts.{module.first + i}.")
        else:
            yield from _walk(child, f"{prefix}{attr}.")


def _place(owner: nn.Module, attr: str, tensor: torch.Tensor) -> Placed:
    if isinstance(owner, _ShardedLinear) and owner.sharded(attr):
        dim = owner.dim if attr == "weight" else 0
        maps = [None] * tensor.dim()
        maps[dim] = owner.indices[owner.rank]
        return Placed(tensor, tuple(owner.full_shapes[attr]), maps)
    return Placed(tensor, tuple(tensor.shape))


def model_state(placed: dict[str, Placed]) -> dict:
    return {f"model.{name}": p.chunks() for name, p in placed.items()}


def optimizer_state(optimizer, placed: dict[str, Placed]) -> dict:
    """``optim.<name>.<key>`` for every state tensor of ``optimizer`` (a torch optimizer over the
    placed parameters, or a ``ShardedOptimizer``: its flat slice mapped back onto them)."""
    names = {id(p.tensor): name for name, p in placed.items()}
    out = {}
    if isinstance(optimizer, ShardedOptimizer):
        for shard in optimizer.shards:
            state = optimizer.inner.state.get(shard.shard) if shard is not None else None
            if not state:
                continue
            for p, _, param_slice, shard_slice in shard.overlaps():
                name = _name_of(names, p)
                for key, value in state.items():
                    if _is_scalar(value):
                        out[f"optim.{name}.{key}"] = value
                    else:
                        _check_shaped(value, shard.shard, name, key)
                        flat = (param_slice.start, param_slice.stop, value[shard_slice])
                        out[f"optim.{name}.{key}"] = placed[name].chunks(p, flat)
        return out
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                continue
            name = _name_of(names, p)
            for key, value in state.items():
                if _is_scalar(value):
                    out[f"optim.{name}.{key}"] = value
                else:
                    _check_shaped(value, p, name, key)
                    out[f"optim.{name}.{key}"] = placed[name].chunks(value)
    return out


def optimizer_params(optimizer) -> list:
    """The parameters whose state the optimizer keeps, as the model holds them."""
    if isinstance(optimizer, ShardedOptimizer):
        return [p for shard in optimizer.shards if shard is not None for p in shard.params]
    return [p for group in optimizer.param_groups for p in group["params"]]


def _name_of(names: dict, p) -> str:
    try:
        return names[id(p)]
    except KeyError:
        raise ValueError(f"the optimizer holds a parameter of shape {tuple(p.shape)} that the module does not: pass "
                         f"the module whose parameters the optimizer updates") from None


def _is_scalar(value) -> bool:
    return torch.is_tensor(value) and value.dim() == 0


def _check_shaped(value, like, name: str, key: str) -> None:
    if not torch.is_tensor(value) or value.shape != like.shape:
        what = f"shape {tuple(value.shape)}" if torch.is_tensor(value) else type(value).__name__
        raise TypeError(f"optimizer state {key!r} of {name!r} is a {what}, neither shaped like its parameter "
                        f"{tuple(like.shape)} nor a 0-d tensor; checkpoints hold elementwise optimizer state "
                        f"(SGD, Adam, AdamW, RMSprop, ...)")
