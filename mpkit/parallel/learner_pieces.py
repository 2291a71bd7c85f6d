"""A learner's own pieces in a real run: their gradient sync, f and g, Megatron MLP, 1F1B schedule and
ZeRO-1 step in place of mpkit's, on the mesh's sub-groups (the capstone, ``mpkit.train("3d", use=...)``).

The exercises run a learner's function in a world that IS its group: ``dist.all_reduce(t)`` there
reduces over every rank, ``ctx.rank`` is the rank in that world. In a 3d run the same function must
work unchanged on one dimension of the mesh, so each call runs inside ``group_scope(group)``:

    ctx            a ``GroupContext``: rank, world_size and comm of that group (comm's group= defaults to it)
    dist.X(...)    with no group= (or group=None) goes to that group; a root or peer (dst=, src=) is read as
                   a rank of the group, as it was in the exercise's world; dist.get_rank() / get_world_size()
                   answer for the group. Each such call is one trace event named "yours: <piece>", so the
                   timeline shows the learner's collectives beside mpkit's (a call that names its own
                   group passes through untouched).

The scope holds only for the duration of the call (for f and g: of their forward and of their backward,
which autograd runs later). Where each piece goes:

    gradient_sync      average_gradients(ctx, model) after the pipeline flush, on the dp x cp group (DataParallel's place)
    bucketed_gradient_sync  BucketedGradientSync(ctx, model, bucket_mb) built once; the step's forward and backward
                       run in the dp x cp scope (its hooks fire in backward), then finish() (no pipeline: one backward a step)
    f_and_g            (f, g) in every column / row layer of the tensor-parallel plan, on the tp group
    megatron_mlp       megatron_mlp(x, up.weight, up.bias, down.weight, down.bias, f, g) as each MLP's forward (tp)
    pipeline_schedule  schedule(rank, p, m) -> this pp rank's instruction list, run by the pipeline executor
    zero1_step         zero1_step(ctx, params, grad, optimizer) on the flat parameters of this rank (dp x cp),
                       ``optimizer.step(start, param_shard, grad_shard)`` the run's own optimizer on that shard
"""
from __future__ import annotations

import inspect
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn

from mpkit.observe import active
from mpkit.observe.comm import TracedWork, group_label, nbytes
from mpkit.parallel.checks import global_rank
from mpkit.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear

# piece name -> (the exercise it must pass, the mesh group it runs on)
PIECES = {"gradient_sync": ("average_gradients", "dp x cp"), "bucketed_gradient_sync": ("bucketed_gradients", "dp x cp"),
          "f_and_g": ("f_and_g", "tp"),
          "megatron_mlp": ("megatron_mlp", "tp"), "pipeline_schedule": ("one_f_one_b_schedule", "pp"),
          "zero1_step": ("zero1_step", "dp x cp")}
SCOPED = ("send", "recv", "isend", "irecv", "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
          "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "scatter", "gather")
ROOTS = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src", "broadcast": "src", "reduce": "dst",
         "scatter": "src", "gather": "dst"}
_KINDS = {"isend": "send", "irecv": "recv", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
          "all_to_all_single": "all_to_all"}


class _Scope:
    """Process-wide, not per thread: on a GPU autograd runs backward (a bucketed sync's hooks) in threads of its own."""
    group = None     # the group ``dist.*`` calls without one go to; None: no scope, torch as usual
    label = ""       # the piece, for the trace
    inside = False   # inside a call already (torch's own nested calls are not the learner's)


_scope = _Scope()
_installed = False


def _in_group(name, bound, group) -> None:
    """A call's group= set to the piece's ``group``, and its root or peer (``ROOTS``), a rank of that
    group, turned into the global rank torch takes."""
    bound.arguments["group"] = group
    root = ROOTS.get(name)
    if bound.arguments.get(root) is not None:
        bound.arguments[root] = global_rank(group, int(bound.arguments[root]))


def _wrap(name, original):
    signature = inspect.signature(original)

    def scoped(*args, **kwargs):
        if _scope.group is None or _scope.inside:
            return original(*args, **kwargs)
        bound = signature.bind_partial(*args, **kwargs)
        if bound.arguments.get("group") is not None:  # a group of its own (mpkit's Comm records those)
            return original(*args, **kwargs)
        group = _scope.group  # the piece's group, peers and roots as its ranks
        _in_group(name, bound, group)
        tensors = [v for v in bound.arguments.values() if isinstance(v, torch.Tensor)]
        trace, start = active.trace(), active.trace().now()
        event = dict(bytes=nbytes(tensors[0]) if tensors and name not in ("recv", "irecv") else 0,
                     name=f"yours: {_scope.label}", group=group_label(group))
        _scope.inside = True
        try:
            work = original(*bound.args, **bound.kwargs)
        finally:
            _scope.inside = False
        if not trace.enabled:
            return work
        if work is not None and hasattr(work, "wait"):
            return TracedWork(work, trace, _KINDS.get(name, name), start, **event)
        trace.record(_KINDS.get(name, name), start, trace.now(), **event)
        return work
    return scoped


def _wrap_query(original):
    def scoped(group=None):
        scoped_here = group is None and _scope.group is not None and not _scope.inside
        return original(_scope.group if scoped_here else group)
    return scoped


def _install() -> None:
    """Wrap torch.distributed's functions in this rank's process (once; they pass through outside a
    scope). Both namespaces, as the exercises' recorder does: ``dist`` and ``distributed_c10d``."""
    global _installed
    if _installed:
        return
    for name in SCOPED:
        wrapped = _wrap(name, getattr(c10d, name))
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)
    for name in ("get_rank", "get_world_size"):
        setattr(dist, name, _wrap_query(getattr(c10d, name)))
    _installed = True


@contextmanager
def group_scope(group, label: str):
    """Inside, ``dist.*`` calls without a group go to ``group`` (see the module docstring)."""
    _install()
    previous = (_scope.group, _scope.label)
    _scope.group, _scope.label = group, label
    try:
        yield
    finally:
        _scope.group, _scope.label = previous


class GroupComm:
    """``ctx.comm`` of a ``GroupContext``: mpkit's traced ``Comm`` with group= defaulting to the
    piece's group and roots and peers read as ranks of it."""

    def __init__(self, group):
        self.group = group

    def __getattr__(self, name):
        method = getattr(active.comm(), name)
        signature = inspect.signature(method)

        def call(*args, **kwargs):
            bound = signature.bind_partial(*args, **kwargs)
            if bound.arguments.get("group") is None:
                _in_group(name, bound, self.group)
            _scope.inside = True  # Comm records the event itself
            try:
                return method(*bound.args, **bound.kwargs)
            finally:
                _scope.inside = False
        return call


@dataclass
class GroupContext:
    """What a piece gets as ``ctx``: its group's rank, size and comm (as the exercise's world was)."""
    rank: int
    world_size: int
    comm: GroupComm
    group: object
    device: torch.device

    @classmethod
    def of(cls, group, device) -> "GroupContext":
        return cls(dist.get_rank(group), dist.get_world_size(group), GroupComm(group), group, device)


def _scoped_function(learner_fn, label: str) -> type:
    """An autograd Function running the learner's ``forward(ctx, x)`` and ``backward(ctx, grad)``, each
    inside the scope of the group it is applied with."""

    class Scoped(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group, counts):
            ctx.group, ctx.counts = group, counts
            counts[label] = counts.get(label, 0) + 1
            with group_scope(group, label):
                return learner_fn.forward(ctx, x)

        @staticmethod
        def backward(ctx, grad):
            with group_scope(ctx.group, label):
                out = learner_fn.backward(ctx, grad)
            return (out[0] if isinstance(out, tuple) else out), None, None
    Scoped.__name__ = f"Your{learner_fn.__name__}"
    return Scoped


@dataclass
class Pieces:
    """The learner's pieces by name (``PIECES``), passed their checks in the caller; ``calls``
    counts, in each rank, how often each ran (``RankOutput.extra["pieces"]``)."""
    gradient_sync: Callable | None = None
    bucketed_gradient_sync: type | None = None
    f_and_g: tuple | None = None
    megatron_mlp: Callable | None = None
    pipeline_schedule: Callable | None = None
    zero1_step: Callable | None = None
    calls: dict = field(default_factory=dict)

    def names(self) -> list[str]:
        return [name for name in PIECES if getattr(self, name) is not None]

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    # ---- tensor parallel: f, g and the MLP ----
    def apply_to_tensor_parallel(self, named: nn.Module, group) -> None:
        """Their f and g in every column and row layer, their MLP as every MLP's forward."""
        if self.f_and_g is not None:
            f, g = (_scoped_function(cls, "f_and_g") for cls in self.f_and_g)
            for module in named.modules():
                if isinstance(module, ColumnParallelLinear):
                    module.f = lambda x, grp, _name, f=f: f.apply(x, grp, self.calls)
                elif isinstance(module, RowParallelLinear):
                    module.g = lambda x, grp, _name, g=g: g.apply(x, grp, self.calls)
        if self.megatron_mlp is not None:
            for module in named.modules():
                up, down = getattr(module, "up", None), getattr(module, "down", None)
                if isinstance(up, ColumnParallelLinear) and isinstance(down, RowParallelLinear):
                    module.forward = types.MethodType(self._mlp_forward, module)

    def _mlp_forward(self, mlp: nn.Module, x):
        up, down = mlp.up, mlp.down
        self._count("megatron_mlp")
        with group_scope(up.group, "megatron_mlp"):
            return self.megatron_mlp(x, up.weight, up.bias, down.weight, down.bias,
                                     lambda t: up.f(t, up.group, up.name), lambda t: down.g(t, down.group, down.name))

    # ---- pipeline: the schedule ----
    def program(self, rank: int, p: int, m: int) -> list:
        self._count("pipeline_schedule")
        return list(self.pipeline_schedule(rank, p, m))

    # ---- data parallel: the gradient sync and ZeRO-1 ----
    def synchronize_gradients(self, model: nn.Module, group, device) -> None:
        self._count("gradient_sync")
        with group_scope(group, "gradient_sync"):
            self.gradient_sync(GroupContext.of(group, device), model)

    def start_bucketed(self, model: nn.Module, group, device, bucket_mb: float):
        """Their ``BucketedGradientSync`` on ``model`` (its hooks registered now, firing in every backward)."""
        with group_scope(group, "bucketed_gradient_sync"):
            return self.bucketed_gradient_sync(GroupContext.of(group, device), model, bucket_mb)

    def finish_bucketed(self, sync, group) -> None:
        self._count("bucketed_gradient_sync")
        with group_scope(group, "bucketed_gradient_sync"):
            sync.finish()

    def zero1_optimizer(self, params, optimizer_cls, defaults: dict, group, device) -> "Zero1Step":
        return Zero1Step(params, optimizer_cls, defaults, self, group, device)


class ShardOptimizer:
    """The ``optimizer`` a ``zero1_step`` gets: ``step(start, param_shard, grad_shard)`` runs the run's
    own optimizer (Adam, SGD: elementwise, so on a shard exactly as on the whole) on that shard, with
    the shard's state kept under ``start``."""

    def __init__(self, optimizer_cls, defaults: dict):
        self.cls, self.defaults, self.shards = optimizer_cls, defaults, {}

    def step(self, start, param_shard, grad_shard):
        if param_shard.shape != grad_shard.shape:
            raise ValueError(f"param_shard has shape {tuple(param_shard.shape)} but grad_shard "
                             f"{tuple(grad_shard.shape)}: pass the same elements of both")
        if int(start) not in self.shards:
            shard = nn.Parameter(param_shard.detach().clone())
            self.shards[int(start)] = (shard, self.cls([shard], **self.defaults))
        shard, optimizer = self.shards[int(start)]
        with torch.no_grad():
            shard.copy_(param_shard)
        shard.grad = grad_shard.detach().clone()
        optimizer.step()
        with torch.no_grad():
            param_shard.copy_(shard)

    def state(self) -> list:
        """The optimizer state this rank holds (its shard's only: what ZeRO-1 saves)."""
        return [opt for _, opt in self.shards.values()]


class Zero1Step:
    """The run's optimizer, ZeRO-1 by the learner: ``step()`` flattens this rank's parameters and
    gradients into one vector each, calls their ``zero1_step`` on the dp x cp group and copies the
    updated vector back."""

    def __init__(self, params, optimizer_cls, defaults, pieces: Pieces, group, device):
        self.params = [p for p in params if p.requires_grad]
        self.pieces, self.group, self.device = pieces, group, device
        self.shard_optimizer = ShardOptimizer(optimizer_cls, defaults)

    def step(self):
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params])
        self.pieces._count("zero1_step")
        with group_scope(self.group, "zero1_step"):
            self.pieces.zero1_step(GroupContext.of(self.group, self.device), flat, grad, self.shard_optimizer)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None
