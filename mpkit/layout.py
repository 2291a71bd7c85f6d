"""How ranks are laid out on a data x pipeline x tensor parallel grid (3D parallelism).

Megatron-LM, torchtitan's ``ParallelDims`` and picotron's process-group grid all put tensor
parallel innermost: the ranks of one TP group are adjacent (rank r and r+1 share a node and its
fastest links), because TP communicates inside every layer, forward and backward. Around it,
mpkit follows picotron: pipeline stages next (one activation per micro-batch per stage
boundary), data parallel outermost (one gradient reduction per step, which can overlap with
backward). Megatron-LM (by default) and torchtitan put pipeline outermost instead (tp, dp, pp from the inside out); in large
runs one TP group fills a node, so DP and PP cross nodes either way. So

    rank = (dp_index * pp + pp_index) * tp + tp_index

and the run (``mpkit.parallel`` on a ``DeviceMesh``), the cost model and the planner read this
one mapping. ``order="pp-dp-tp"`` is Megatron-LM's instead (pipeline outermost):

    rank = (pp_index * dp + dp_index) * tp + tp_index

which only the cost model and the planner price (the 3d strategy runs the default): for TP 2 x
PP 4 filling a node, picotron's order keeps the pipeline on NVLink and sends DP over the network,
Megatron-LM's the reverse.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpkit.whole import is_whole

DIMS = ("dp", "pp", "tp")  # mesh dimension order: outermost first, tensor parallel innermost
ORDERS = {"dp-pp-tp": DIMS, "pp-dp-tp": ("pp", "dp", "tp")}  # rank orders, outermost first


@dataclass(frozen=True)
class Layout:
    """Sizes of the data, pipeline and tensor parallel dimensions; ``dp * pp * tp`` ranks."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    order: str = "dp-pp-tp"

    def __post_init__(self):
        for name in DIMS:
            value = getattr(self, name)
            if not is_whole(value) or value < 1:
                raise ValueError(f"{name}={value!r} must be a whole number >= 1")
            object.__setattr__(self, name, int(value))  # numpy's integers (a sweep) as plain ints
        if self.order not in ORDERS:
            raise ValueError(f"order={self.order!r} is unknown; use {' or '.join(map(repr, ORDERS))} "
                             f"(outermost dimension first)")

    @property
    def dims(self) -> tuple[str, str, str]:
        """The dimensions outermost first (``DIMS`` unless ``order`` puts the pipeline outermost)."""
        return ORDERS[self.order]

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def shape(self) -> tuple[int, int, int]:
        """Sizes in ``dims`` order, the shape of the ``DeviceMesh`` (``DIMS`` order by default)."""
        return tuple(getattr(self, d) for d in self.dims)

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise ValueError(f"dp*pp*tp = {self.dp}*{self.pp}*{self.tp} = {self.world_size} ranks, but "
                             f"world_size={world_size}; choose sizes whose product is the world size")

    def coords(self, rank: int) -> dict[str, int]:
        """``{"dp": i, "pp": j, "tp": k}`` of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank} is outside 0..{self.world_size - 1}")
        outer, middle, inner = self.dims
        rest, inner_index = divmod(rank, getattr(self, inner))
        outer_index, middle_index = divmod(rest, getattr(self, middle))
        return {d: {outer: outer_index, middle: middle_index, inner: inner_index}[d] for d in DIMS}

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        index = {"dp": dp, "pp": pp, "tp": tp}
        outer, middle, inner = self.dims
        return (index[outer] * getattr(self, middle) + index[middle]) * getattr(self, inner) + index[inner]

    def groups(self, dim: str) -> list[list[int]]:
        """The rank lists along ``dim``: every group of ranks that differ only in that coordinate."""
        if dim not in DIMS:
            raise ValueError(f"dim={dim!r} is unknown; use one of {', '.join(DIMS)}")
        out = {}
        for rank in range(self.world_size):
            key = tuple(v for d, v in self.coords(rank).items() if d != dim)
            out.setdefault(key, []).append(rank)
        return list(out.values())

    def group_of(self, rank: int, dim: str) -> list[int]:
        """The ranks of ``rank``'s group along ``dim``."""
        return next(g for g in self.groups(dim) if rank in g)

    def __str__(self):
        where = "" if self.order == "dp-pp-tp" else ", pp outermost"
        return f"dp={self.dp} x pp={self.pp} x tp={self.tp}{where}"
