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

Context parallelism (``cp``: each sequence split over cp ranks) sits just outside TP in every
published order: Megatron-Core's default ``order="tp-cp-ep-dp-pp"`` (innermost first,
megatron/core/parallel_state.py ``initialize_model_parallel``) and Llama 3 405B's [TP, CP, PP, DP]
(Dubey et al. 2024, §3.3.2, Figure 5) differ only in where PP and DP go, so a cp > 1 layout keeps
``order`` and adds the cp dimension between tp and the rest ("dp-pp-cp-tp" or "pp-dp-cp-tp").
Expert parallelism (``ep``) is no dimension of its own: as in Megatron-Core, whose
``initialize_model_parallel`` requires the data-parallel size to be divisible by the expert-parallel
size, the experts are split over groups of ``ep`` neighbouring DP ranks, which still hold the same
attention weights and see different data. So ``world_size = dp * pp * cp * tp``, and ``ep``
divides ``dp``. Only the planner prices ``Layout(cp=...)``: the runnable ``3d`` strategy keeps its
grid dp x pp x tp and folds cp into dp (``Layout(dp=dp * cp, ...)``, the cp ranks between dp and
pp), so its CP groups are cp neighbouring dp coordinates, not the ranks just outside TP.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpkit.whole import is_whole

DIMS = ("dp", "pp", "tp")  # mesh dimension order: outermost first, tensor parallel innermost
ORDERS = {"dp-pp-tp": DIMS, "pp-dp-tp": ("pp", "dp", "tp")}  # rank orders, outermost first
CP = "cp"  # the context-parallel dimension, just outside TP in either order (when cp > 1)


@dataclass(frozen=True)
class Layout:
    """Sizes of the data, pipeline, context and tensor parallel dimensions, ``dp * pp * cp * tp``
    ranks, and the expert-parallel groups carved out of DP (``ep`` divides ``dp``)."""

    dp: int = 1
    pp: int = 1
    tp: int = 1
    order: str = "dp-pp-tp"
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in (*DIMS, CP, "ep"):
            value = getattr(self, name)
            if not is_whole(value) or value < 1:
                raise ValueError(f"{name}={value!r} must be a whole number >= 1")
            object.__setattr__(self, name, int(value))  # numpy's integers (a sweep) as plain ints
        if self.order not in ORDERS:
            raise ValueError(f"order={self.order!r} is unknown; use {' or '.join(map(repr, ORDERS))} "
                             f"(outermost dimension first)")
        if self.dp % self.ep:
            raise ValueError(f"ep={self.ep} does not divide dp={self.dp}: expert parallelism splits the experts over "
                             f"groups of ep data-parallel ranks (Megatron-Core's rule); choose ep dividing dp")

    @property
    def dims(self) -> tuple[str, ...]:
        """The dimensions outermost first (``DIMS`` unless ``order`` puts the pipeline outermost;
        "cp" just outside "tp" when cp > 1)."""
        outer = ORDERS[self.order]
        return outer if self.cp == 1 else (*outer[:-1], CP, outer[-1])

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def shape(self) -> tuple[int, ...]:
        """Sizes in ``dims`` order, the shape of the ``DeviceMesh`` (``DIMS`` order by default)."""
        return tuple(getattr(self, d) for d in self.dims)

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            cp = f"*{self.cp}" if self.cp > 1 else ""
            raise ValueError(f"dp*pp*{'cp*' if cp else ''}tp = {self.dp}*{self.pp}{cp}*{self.tp} = {self.world_size} "
                             f"ranks, but world_size={world_size}; choose sizes whose product is the world size")

    def coords(self, rank: int) -> dict[str, int]:
        """``{"dp": i, "pp": j, "tp": k}`` of ``rank`` (and "cp" when cp > 1)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank} is outside 0..{self.world_size - 1}")
        index = {}
        for d in reversed(self.dims):  # innermost first
            rank, index[d] = divmod(rank, getattr(self, d))
        return {d: index[d] for d in (*DIMS, CP) if d in index}

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0, cp: int = 0) -> int:
        index, rank = {"dp": dp, "pp": pp, "tp": tp, CP: cp}, 0
        for d in self.dims:  # outermost first
            rank = rank * getattr(self, d) + index[d]
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """The rank lists along ``dim``: every group of ranks that differ only in that coordinate."""
        if dim not in self.dims:
            raise ValueError(f"dim={dim!r} is unknown; use one of {', '.join(self.dims)}")
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
        cp = f" x cp={self.cp}" if self.cp > 1 else ""
        ep = f" (ep={self.ep} of dp)" if self.ep > 1 else ""
        return f"dp={self.dp} x pp={self.pp}{cp} x tp={self.tp}{where}{ep}"
