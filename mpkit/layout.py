"""Where every rank sits on the parallel grid: data (dp), pipeline (pp), context (cp) and tensor
(tp) parallel dimensions, with expert parallelism (ep) carved out of dp, in a rank order that is data.

A layout of dp·pp·cp·tp ranks gives each rank one coordinate per dimension. The **order** says
which dimension is outermost: it is a string of the four names, outermost first, and the rank is
the coordinates read as a mixed-radix number in that order, the last (innermost) dimension
changing fastest. For the default order ``"dp-pp-cp-tp"``::

    rank = ((dp_index * pp + pp_index) * cp + cp_index) * tp + tp_index

Every published order puts TP innermost (its ranks talk inside every layer, forward and backward,
so they share a node's fastest links) and CP just outside it (a K/V hop per attention). They
differ in where the pipeline and data parallelism go:

- ``"dp-pp-cp-tp"`` (preset ``"picotron"``, mpkit's default): DP outermost, as picotron's
  ``ProcessGroupManager`` grid ``arange(world).view(dp, pp, cp, tp)``. For TP 2 x PP 4 filling a
  node, the pipeline's hops stay on NVLink and the DP reduction crosses the network.
- ``"pp-dp-cp-tp"`` (presets ``"megatron"`` and ``"torchtitan"``): PP outermost. Megatron-Core
  spells it innermost first, ``order="tp-cp-ep-dp-pp"`` (megatron/core/parallel_state.py
  ``initialize_model_parallel``); torchtitan's ``ParallelDims`` builds its mesh as
  [pp, dp_replicate, dp_shard, cp, tp]. Llama 3 405B's [TP, CP, PP, DP] (Dubey et al. 2024,
  §3.3.2) is the default order read innermost first.

Any other permutation of the four names is a layout too (``Layout(order="tp-dp-pp-cp")``); the
planner prices the two published ones (``ORDERS``). The old three-name spellings ``"dp-pp-tp"``
and ``"pp-dp-tp"`` still work and mean the two presets (a ``DeprecationWarning`` says so).

**Expert parallelism** is no dimension of its own: as in Megatron-Core, whose
``initialize_model_parallel`` requires the data-parallel size to be divisible by the
expert-parallel size, the experts are split over groups of ``ep`` neighbouring dp coordinates
(``dp_index = edp_index * ep + ep_index``), which hold the same attention weights and see different
data. So ``world_size = dp * pp * cp * tp`` and ``ep`` divides ``dp``.

**Groups** (``groups(name)``): a group is the ranks whose other coordinates are equal.

- ``"dp"``, ``"pp"``, ``"cp"``, ``"tp"``: along one dimension.
- ``"ep"``: the ep neighbouring dp coordinates that split the experts (the all-to-alls).
- ``"edp"``: the expert-data-parallel group, the ranks holding the same experts (same pp, tp and
  ep coordinate; different dp blocks and cp coordinates, so different tokens): they average the
  experts' gradients, as Megatron-Core's expert-data-parallel group (which folds CP in).
- ``"dp_cp"``: dp x cp together, the ranks holding the same weights and different tokens, which
  average every other gradient (Megatron-Core's data-parallel group with CP; picotron's
  ``cp_dp_group``).

This module is torch-free, so the planner (``sim.plan``), the cost model, the runnable strategies
(``mpkit.parallel.build_mesh`` makes one ``DeviceMesh`` of it) and lab 10's exercises read the same
mapping.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from mpkit.whole import is_whole

DIMS = ("dp", "pp", "cp", "tp")  # the four dimensions, in the default order (outermost first)
DEFAULT_ORDER = "dp-pp-cp-tp"
ORDERS = ("dp-pp-cp-tp", "pp-dp-cp-tp")  # the published orders: DP outermost, PP outermost (the planner prices both)
PRESETS = {"picotron": "dp-pp-cp-tp", "megatron": "pp-dp-cp-tp", "torchtitan": "pp-dp-cp-tp"}
DEPRECATED_ORDERS = {"dp-pp-tp": "dp-pp-cp-tp", "pp-dp-tp": "pp-dp-cp-tp"}  # before cp was always a dimension
# every group as the coordinates that vary inside it ("dp_block" = dp_index // ep, "ep" = dp_index % ep)
GROUPS = {"dp": ("dp_block", "ep"), "pp": ("pp",), "cp": ("cp",), "tp": ("tp",), "ep": ("ep",),
          "edp": ("dp_block", "cp"), "dp_cp": ("dp_block", "ep", "cp")}


def normalize_order(order: str) -> str:
    """The order as four names outermost first ("dp-pp-cp-tp"), from that spelling, a preset name
    or a deprecated three-name spelling; ValueError saying what to pass for anything else."""
    if order in PRESETS:
        return PRESETS[order]
    if order in DEPRECATED_ORDERS:
        warnings.warn(f"order={order!r} is the old three-name spelling; cp is always a dimension now: write "
                      f"order={DEPRECATED_ORDERS[order]!r}", DeprecationWarning, stacklevel=3)
        return DEPRECATED_ORDERS[order]
    names = order.split("-") if isinstance(order, str) else None
    if names is None or sorted(names) != sorted(DIMS):
        presets = ", ".join(f"{name!r} ({value})" for name, value in PRESETS.items())
        raise ValueError(f"order={order!r} is unknown; pass the four dimensions dp, pp, cp, tp outermost first, "
                         f"joined by '-' (the default {DEFAULT_ORDER!r}: DP outermost; 'pp-dp-cp-tp': PP outermost), "
                         f"or a preset: {presets}")
    return order


@dataclass(frozen=True)
class Layout:
    """Sizes of the data, pipeline, context and tensor parallel dimensions (``dp * pp * cp * tp``
    ranks), the rank ``order`` (outermost first), and the expert-parallel groups carved out of
    DP (``ep`` divides ``dp``). The positional order of the arguments (dp, pp, tp, order, cp, ep)
    is the one the planner has always used."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    order: str = DEFAULT_ORDER
    cp: int = 1
    ep: int = 1
    dims: tuple = field(init=False, repr=False, compare=False)  # the dimensions outermost first, from order

    def __post_init__(self):
        for name in (*DIMS, "ep"):
            value = getattr(self, name)
            if not is_whole(value) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a whole number >= 1: how many ranks the dimension "
                                 f"has, e.g. {name}=2 (a bool is no size)")
            object.__setattr__(self, name, int(value))  # numpy's integers (a sweep) as plain ints
        object.__setattr__(self, "order", normalize_order(self.order))
        object.__setattr__(self, "dims", tuple(self.order.split("-")))
        if self.dp % self.ep:
            raise ValueError(f"ep={self.ep} does not divide dp={self.dp}: expert parallelism splits the experts over "
                             f"groups of ep data-parallel ranks (Megatron-Core's rule); choose ep dividing dp")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def shape(self) -> tuple[int, ...]:
        """Sizes in ``dims`` order: the shape of the ``DeviceMesh`` (``init_device_mesh`` makes the
        last dimension the innermost, adjacent ranks)."""
        return tuple(getattr(self, d) for d in self.dims)

    def size(self, group: str) -> int:
        """How many ranks one group of ``groups(group)`` holds."""
        parts = {"dp_block": self.dp // self.ep, "ep": self.ep, "pp": self.pp, "cp": self.cp, "tp": self.tp}
        out = 1
        for part in _group_parts(group):
            out *= parts[part]
        return out

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            names, sizes = "*".join(self.dims), "*".join(str(s) for s in self.shape)
            raise ValueError(f"{names} = {sizes} = {self.world_size} ranks, but world_size={world_size}; choose sizes "
                             f"whose product is the world size")

    def coords(self, rank: int) -> dict[str, int]:
        """``{"dp": i, "pp": j, "cp": c, "tp": k}`` of ``rank``, in ``dims`` order."""
        if not is_whole(rank) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank!r} is outside 0..{self.world_size - 1}")
        index = {}
        for d in reversed(self.dims):  # innermost first: the last dimension changes fastest
            rank, index[d] = divmod(rank, getattr(self, d))
        return {d: index[d] for d in self.dims}

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0, cp: int = 0) -> int:
        """The rank at these coordinates (the inverse of ``coords``)."""
        index, rank = {"dp": dp, "pp": pp, "tp": tp, "cp": cp}, 0
        for d in self.dims:  # outermost first
            rank = rank * getattr(self, d) + index[d]
        return rank

    def groups(self, name: str) -> list[list[int]]:
        """Every group of ``name`` ("dp", "pp", "cp", "tp", "ep", "edp", "dp_cp"; see the module
        docstring) as a sorted list of ranks, in the order of their smallest rank."""
        varying = _group_parts(name)
        out = {}
        for rank in range(self.world_size):
            parts = self._parts(rank)
            out.setdefault(tuple(v for k, v in parts.items() if k not in varying), []).append(rank)
        return list(out.values())

    def group_of(self, rank: int, name: str) -> list[int]:
        """The ranks of ``rank``'s group of ``name``."""
        varying, mine = _group_parts(name), self._parts(rank)
        key = {k: v for k, v in mine.items() if k not in varying}
        return [r for r in range(self.world_size)
                if all(v == key[k] for k, v in self._parts(r).items() if k in key)]

    def _parts(self, rank: int) -> dict[str, int]:
        c = self.coords(rank)
        return {"dp_block": c["dp"] // self.ep, "ep": c["dp"] % self.ep, "pp": c["pp"], "cp": c["cp"], "tp": c["tp"]}

    def __str__(self):
        ep = f" (ep={self.ep} inside dp)" if self.ep > 1 else ""
        return " x ".join(f"{d}={getattr(self, d)}" for d in self.dims) + ep


def _group_parts(name: str) -> tuple:
    if name not in GROUPS:
        raise ValueError(f"group {name!r} is unknown; use one of {', '.join(GROUPS)}")
    return GROUPS[name]


__all__ = ["Layout", "DIMS", "ORDERS", "PRESETS", "GROUPS", "DEFAULT_ORDER", "DEPRECATED_ORDERS", "normalize_order"]
