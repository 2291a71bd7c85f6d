"""One ``DeviceMesh`` for every parallelism of a run, and its process groups by name.

The mechanism in ~15 lines (``layout``: a ``mpkit.parallel.Layout``, the rank grid as data)::

    mesh = init_device_mesh("cpu", layout.shape, mesh_dim_names=layout.dims)  # e.g. ("dp", "pp", "cp", "tp")
    tp_group = mesh.get_group("tp")          # the ranks that differ only in their tp coordinate
    dp_group = mesh.get_group("dp")          # ... only in dp: they average gradients
    for ranks in layout.groups("dp_cp"):     # a group across two dimensions: dp x cp together
        group = dist.new_group(ranks)        # every rank creates every group, in the same order
        if rank in ranks:
            dp_cp_group = group

``init_device_mesh`` lays the ranks out as ``Layout`` does (the last dimension innermost), so the
mesh's "tp" groups are ``layout.groups("tp")``. Three groups span more than one dimension or part
of one, and are made from the layout's rank lists:

- ``"dp_cp"``: dp x cp, the ranks that hold the same weights and see different tokens (gradient
  averaging with context parallelism; Megatron-Core's data-parallel group with CP);
- ``"ep"``: ep neighbouring dp coordinates, which split the experts (their all-to-alls);
- ``"edp"``: the ranks holding the same experts (they average the experts' gradients).

Each group's ``group_desc`` is ``"mesh_<name>"``: the trace reads it to label every collective with
its dimension (``mpkit.observe.comm.group_label``). A dimension spanning the whole world would
reuse the default group (described "default_pg"), so it gets a group of its own; a group that
equals another by its ranks reuses it (dp_cp is the dp group when cp = 1), and a group of one
rank is any group of one rank. ``Mesh.submesh(name)`` is a 1-D ``DeviceMesh`` of a group, what
``fully_shard`` takes.
"""
from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from mpkit.layout import GROUPS, Layout
from mpkit.parallel.checks import require_process_group

COMPOSITE = {"dp_cp": ("dp", "cp"), "edp": ("dp", "cp", "dp_cp"), "ep": ()}  # name: groups it may reuse


class Mesh:
    """This rank on a ``Layout``: the ``DeviceMesh`` (its dimensions named as ``layout.dims``),
    this rank's coordinates, and its process group of every name in ``mpkit.layout.GROUPS``."""

    def __init__(self, layout: Layout, device_mesh: DeviceMesh, groups: dict, rank: int):
        self.layout, self.device_mesh, self.rank = layout, device_mesh, rank
        self._groups = groups
        self.coords = layout.coords(rank)

    def group(self, name: str):
        """This rank's process group of ``name`` ("dp", "pp", "cp", "tp", "ep", "edp", "dp_cp")."""
        if name not in self._groups:
            raise ValueError(f"group {name!r} is unknown; use one of {', '.join(GROUPS)}")
        return self._groups[name]

    def size(self, name: str) -> int:
        return self.layout.size(name)

    def ranks(self, name: str) -> list[int]:
        """The global ranks of this rank's group of ``name``."""
        return self.layout.group_of(self.rank, name)

    def submesh(self, name: str) -> DeviceMesh:
        """A 1-D ``DeviceMesh`` over this rank's group of ``name`` (``fully_shard(mesh=...)``)."""
        return DeviceMesh.from_group(self.group(name), self.device_mesh.device_type, mesh=self.ranks(name),
                                     mesh_dim_names=(name,))

    def __repr__(self):
        return f"Mesh({self.layout}; rank {self.rank} at {self.coords})"


def build_mesh(layout: Layout, device_type: str = "cpu") -> Mesh:
    """The ``Mesh`` of ``layout`` on this rank. Every rank of the world calls it, with the same
    layout (it creates process groups, which every rank creates in the same order)."""
    require_process_group("build_mesh")
    world, rank = dist.get_world_size(), dist.get_rank()
    layout.check_world(world)
    device_mesh = init_device_mesh(device_type, layout.shape, mesh_dim_names=layout.dims)
    groups, by_ranks = {}, {}
    for dim in layout.dims:
        group = device_mesh.get_group(dim)
        if dist.get_world_size(group) == world > 1:  # the default group: no name of its own
            group = dist.new_group(list(range(world)), group_desc=f"mesh_{dim}")
        groups[dim] = group
        by_ranks.setdefault(_key(layout, dim), group)
    for name, reusable in COMPOSITE.items():
        key = _key(layout, name)
        same = next((groups[other] for other in reusable if _key(layout, other) == key), None)
        if same is None and layout.size(name) == 1:
            same = by_ranks.get(key)  # a group of one rank: any of them
        groups[name] = same if same is not None else _new_groups(layout, name, rank)
        by_ranks.setdefault(key, groups[name])
    return Mesh(layout, device_mesh, groups, rank)


def _key(layout: Layout, name: str) -> tuple:
    return tuple(map(tuple, layout.groups(name)))


def _new_groups(layout: Layout, name: str, rank: int):
    """Every group of ``name``, created on every rank in the same order; this rank's one."""
    mine = None
    for ranks in layout.groups(name):
        group = dist.new_group(ranks, group_desc=f"mesh_{name}")
        mine = group if rank in ranks else mine
    return mine


__all__ = ["Mesh", "build_mesh"]
