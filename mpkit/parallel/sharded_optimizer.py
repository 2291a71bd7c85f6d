"""ZeRO stage 1 as a real ``torch.optim.Optimizer``: each rank keeps the optimizer state of only its
1/N of the parameters.

The mechanism in ~20 lines (``ShardedOptimizer`` below, without its checks and edge cases)::

    # once: every group's trainable parameters in one flat buffer, padded to N equal slices,
    # each parameter a view of it; this rank's slice is the inner optimizer's only parameter
    k = ceil(numel / N)
    flat, views = flat_views(params, k * N)
    for p, view in zip(params, views):
        view.copy_(p.detach())
        p.data = view
    flat_grad, grad_views = flat_views(params, k * N)     # (average_gradients=True) .grad are views
    for p, view in zip(params, grad_views):
        p.grad = view
    mine = nn.Parameter(flat[r * k:(r + 1) * k])
    inner = torch.optim.AdamW([mine])                       # state for 1/N of the parameters

    def step():
        mine.grad = torch.empty(k)
        dist.reduce_scatter_tensor(mine.grad, flat_grad)   # 1. slice r of the summed gradient
        mine.grad /= N                                       #    ... averaged
        inner.step()                                         # 2. update this rank's slice only
        dist.all_gather_into_tensor(flat, mine.detach())     # 3. every slice back to every rank

Read ``ShardedOptimizer`` in that order: ``__init__`` (the layout, in ``_GroupShard``), ``step``,
then its three phases ``reduce_scatter_gradients``, ``update_shard``, ``all_gather_parameters``.

Parameters and gradients stay replicated (every rank runs the full forward/backward on its batch
slice); the optimizer is what gets sharded. Rank r owns slice r, and its inner optimizer (any
elementwise ``torch.optim`` class: Adam, AdamW, SGD, ...) sees that slice as one tensor. A step is

1. (``average_gradients=True``) reduce-scatter the flat gradient: rank r receives the sum of
   slice r only, (N-1)/N·S bytes; otherwise the gradients were already averaged (``DataParallel``
   or DDP before it) and rank r just reads its slice;
2. the inner optimizer on slice r alone (Adam's two moments are 8Ψ/N bytes instead of 8Ψ);
3. all-gather the updated slices back into every rank's flat parameters ((N-1)/N·S bytes).

With the reduce-scatter that is the 2(N-1)/N·S of one all-reduce: ZeRO-1 saves memory at no extra
traffic, where the backend reduce-scatters as a ring does (NCCL). gloo all-reduces the whole tensor
and keeps slice r, so on gloo a step sends 1.5 times one all-reduce (``mpkit.costmodel.cpu.ring_steps``).
Flat equal slices (not whole tensors balanced greedily, as torch's ``ZeroRedundancyOptimizer``
does) make the state exactly ceil(Ψ/N) elements per rank plus one step counter. Elementwise
optimizers do the same math on a slice as on whole tensors; optimizers that look at a whole tensor
at once (Adafactor's factored moments, LBFGS) do not, and are refused.

What real training adds comes after the three phases, each behind a named method: the replicas
are compared before the first step (``_check_replicas``, ``broadcast_parameters``); gradients are
clipped on the average (``clip_grad_norm_``); frozen parameters are never sharded or touched. With
``average_gradients=False`` a parameter with no gradient in a step keeps its value and optimizer
state, as the optimizer would skip it on one device (``_gather_local_grads``, ``_skip``); with
``average_gradients=True`` the reduce-scatter needs every trainable parameter's gradient, so a
missing one is a ``RuntimeError`` that names it and says what to use. (The slice has one step
counter: a parameter that gets gradients only in *some* steps sees Adam's bias correction of the
slice's count, not its own; a warning says so the first time that happens, once per optimizer,
naming how many parameters and the first few: ``_warn_bias_correction_once``.)
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as dist
from torch import nn

from mpkit.errors import MpkitWarning
from mpkit.observe import active
from mpkit.parallel.buckets import flat_views
from mpkit.parallel.checks import (broadcast_module, check_same_model, check_same_tensors, global_rank,
                                   require_process_group)

# Optimizers whose update of an element depends on other elements of the same tensor.
NOT_ELEMENTWISE = ("LBFGS", "SparseAdam", "Adafactor")


def shard_numel(numel: int, world_size: int) -> int:
    """Elements per rank of a flat buffer of ``numel`` elements padded to a multiple of ``world_size``."""
    return math.ceil(numel / world_size)


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer_cls`` (e.g. ``torch.optim.AdamW``) with its state sharded over ``group``.

    ``params``: parameters or parameter groups, as any optimizer takes them; ``**defaults``: the
    inner optimizer's arguments (``lr=1e-3, weight_decay=0.1``). ``average_gradients=False``: the
    gradients are already averaged across the group (``DataParallel``/DDP before it);
    ``True``: ``step()`` averages them itself with a reduce-scatter (use it *instead of*
    ``DataParallel``'s all-reduce; then call ``broadcast_parameters()`` once so replicas start
    equal). ``step()`` = ``reduce_scatter_gradients()`` (when averaging) + ``update_shard()`` +
    ``all_gather_parameters()``; the phases are public so a timeline can show each. Clip
    gradients with ``opt.clip_grad_norm_(max_norm)``, not torch's function on the model's
    parameters (with ``average_gradients=True`` those hold this rank's gradient, not the average).
    """

    def __init__(self, params, optimizer_cls, group=None, average_gradients: bool = False, **defaults):
        _check_optimizer_cls(optimizer_cls)
        require_process_group("ShardedOptimizer")
        self.group = group
        self.average_gradients = bool(average_gradients)
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._initialising = True
        super().__init__(params, defaults)
        self._initialising = False
        self.shards = []  # one per parameter group: its flat buffers and this rank's slice (None: all frozen)
        inner_groups = []
        for g in self.param_groups:
            trainable = [p for p in g["params"] if p.requires_grad]
            if not trainable:
                self.shards.append(None)
                continue
            _check_one_dtype(trainable, len(self.shards))
            names = [f"group {len(self.shards)} param {i}" for i in range(len(trainable))]
            shard = _GroupShard(trainable, names, self.rank, self.world_size, self.average_gradients)
            self.shards.append(shard)
            inner_groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": [shard.shard]})
        if not inner_groups:
            raise ValueError("ShardedOptimizer: no trainable parameters (every parameter has requires_grad=False)")
        self.inner = optimizer_cls(inner_groups, **defaults)
        for g, inner in zip((g for g, s in zip(self.param_groups, self.shards) if s is not None),
                            self.inner.param_groups):
            g.update({k: v for k, v in inner.items() if k != "params"})  # the inner class's own defaults too
        self._had_grad = {}  # parameter -> whether it had a gradient at the last step
        self._warned_bias_correction = False
        self._reduced = False  # clip_grad_norm_ reduce-scattered this step's gradients already
        self._replicas_checked = False  # broadcast_parameters() or the first reduce-scatter compared them

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("ShardedOptimizer.step() takes no closure: compute the loss and call backward first")
        if self.average_gradients and not self._reduced:
            self.reduce_scatter_gradients()
        self._reduced = False
        self.update_shard()
        self.all_gather_parameters()

    # ---- the three phases of a step ----
    def reduce_scatter_gradients(self) -> None:
        """1. Rank r receives the group average of gradient slice r (``average_gradients=True`` only)."""
        if not self.average_gradients:
            raise RuntimeError("reduce_scatter_gradients() is for ShardedOptimizer(average_gradients=True); here "
                               "the gradients are averaged before the optimizer (DataParallel)")
        if not self._replicas_checked:
            self._check_replicas()
        for shard in self.shards:
            if shard is None:
                continue
            _refuse_missing_gradients(shard.adopt_gradients())
            active.comm().reduce_scatter_tensor(shard.shard.grad, shard.grads, group=self.group, name="grads")
            shard.shard.grad.div_(self.world_size)

    @torch.no_grad()
    def update_shard(self) -> None:
        """2. The inner optimizer's step on this rank's slices only."""
        self._sync_hyperparameters()
        restore, regained = [], []  # regained: names whose gradient came back this step
        for shard in self.shards:
            if shard is not None and not self.average_gradients:
                skip, came_back = self._gather_local_grads(shard)
                regained += came_back
                restore += self._skip(shard, skip)
        self._warn_bias_correction_once(regained)
        self.inner.step()
        for tensor, skip, values in restore:  # what had no gradient keeps its values and state
            tensor[skip] = values
        for shard in self.shards:
            if shard is not None and shard.shard.grad is None:
                shard.shard.grad = shard.flat.new_zeros(shard.shard_numel)

    def all_gather_parameters(self) -> None:
        """3. Every rank's updated slice into every rank's parameters (in place)."""
        for shard in self.shards:
            if shard is not None:
                active.comm().all_gather_into_tensor(shard.flat, shard.shard.detach(), group=self.group,
                                                     name="params")

    # ---- what a training loop also calls ----
    def broadcast_parameters(self, module: nn.Module | None = None) -> None:
        """Make every replica start from the group's first rank (``module``: its buffers too).

        The replicas are compared first (``check_same_model``): broadcast coalesced or as flat
        buffers, a parameter of another shape or order on one rank would take values across
        parameter boundaries silently."""
        what = "ShardedOptimizer.broadcast_parameters"
        self._replicas_checked = True
        if module is not None:
            check_same_model(module, self.group, what, buffers=True)
            broadcast_module(module, self.group)
            return
        check_same_tensors(self._named(), self.group, what)
        comm, src = active.comm(), global_rank(self.group, 0)
        for shard in self.shards:
            if shard is not None:
                comm.broadcast(shard.flat, src=src, group=self.group, name="initial weights")

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` of the gradient the step will use; returns its total norm.

        With ``average_gradients=True`` the model's ``.grad`` are this rank's own, not the group
        average, so torch's function on ``model.parameters()`` would clip the wrong gradient, on
        every rank differently. Here the reduce-scatter runs first (``step()`` then skips it), the
        norm of the whole averaged gradient comes from every rank's slice (one all-reduce of a
        scalar; the padding is zero) and this rank scales its slice. With ``average_gradients=False``
        the ``.grad`` already are the average: this is torch's function on them."""
        if not self.average_gradients:
            return torch.nn.utils.clip_grad_norm_([p for s in self.shards if s is not None for p in s.params], max_norm)
        if not self._reduced:
            self.reduce_scatter_gradients()
            self._reduced = True
        grads = [s.shard.grad for s in self.shards if s is not None]
        total = torch.stack([g.float().pow(2).sum() for g in grads]).sum()
        active.comm().all_reduce(total, group=self.group, name="gradient norm")
        total = total.sqrt()
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)  # torch's clip_coef_clamped
        for g in grads:
            g.mul_(scale.to(g.dtype))
        return total

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._reduced = False  # a step's gradients thrown away: the next step reduces its own
        super().zero_grad(set_to_none)

    @property
    def shard_parameters(self) -> list[nn.Parameter]:
        """This rank's slices (one per parameter group with trainable parameters): what the inner
        optimizer steps and keeps state for."""
        return [s.shard for s in self.shards if s is not None]

    def name_parameters(self, module: nn.Module) -> None:
        """Use ``module``'s parameter names in messages (instead of "group 0 param 3")."""
        names = {p: n for n, p in module.named_parameters()}
        for shard in self.shards:
            if shard is not None:
                shard.names = [names.get(p, old) for p, old in zip(shard.params, shard.names)]

    def add_param_group(self, param_group):
        if not self._initialising:
            raise NotImplementedError("ShardedOptimizer cannot add parameter groups after construction (the flat "
                                      "shards are laid out once); build a new ShardedOptimizer with every group")
        super().add_param_group(param_group)

    # ---- replicas that must agree ----
    def _named(self) -> list:
        return [(name, p) for shard in self.shards if shard is not None for name, p in zip(shard.names, shard.params)]

    def _check_replicas(self) -> None:
        """Once, before the first reduce-scatter when ``broadcast_parameters()`` never ran: the
        replicas must have the same parameters (another shape would give the reduce-scatter
        another size on one rank: gloo aborts the process) and the same values (else each rank's
        gradient was taken at another point and the step averages them as if not). Two small
        all-gathers of the layout and one of two checksums per group, untraced."""
        self._replicas_checked = True
        what = "ShardedOptimizer(average_gradients=True)"
        check_same_tensors(self._named(), self.group, what)
        flats = [s.flat[:s.numel].detach().double() for s in self.shards if s is not None]
        mine = torch.stack([x for f in flats for x in (f.sum(), (f * torch.arange(1, f.numel() + 1, dtype=f.dtype,
                                                                                  device=f.device)).sum())])
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        with active.quiet():
            active.comm().all_gather(every, mine, group=self.group)
        differ = [r for r, theirs in enumerate(every) if not torch.equal(theirs, every[0])]
        if differ:
            raise ValueError(f"{what}: the replicas start from different values (group rank {differ[0]} differs from "
                             f"group rank 0), so each rank's gradient belongs to another model; call "
                             f"opt.broadcast_parameters(model) once before training (or build the model from one "
                             f"seed on every rank)")

    # ---- parameters without a gradient this step (average_gradients=False) ----
    def _gather_local_grads(self, shard):
        """Copy this rank's slice of the (already averaged) gradients; return the mask of shard
        elements whose parameter has no gradient (None when every one has) and the names of the
        parameters whose gradient came back after steps without one."""
        skip, regained = None, []
        for p, name, param_slice, shard_slice in shard.overlaps():
            has = p.grad is not None
            if self._had_grad.get(p, has) != has and has:
                regained.append(name)
            self._had_grad[p] = has
            if has:
                shard.shard.grad[shard_slice] = p.grad.detach().reshape(-1)[param_slice]
            else:
                if skip is None:
                    skip = torch.zeros(shard.shard_numel, dtype=torch.bool, device=shard.flat.device)
                skip[shard_slice] = True
                shard.shard.grad[shard_slice] = 0
        return skip, regained  # (padding elements stay 0: a zero gradient and zero state never move them)

    def _skip(self, shard, skip) -> list:
        """Elements with no gradient must not move: a slice with none at all is skipped by the
        optimizer (``grad=None``); otherwise [(tensor, mask, saved values)] of the slice's values and
        per-element state there, to put back after the step."""
        if skip is None:
            return []
        if skip.all():
            shard.shard.grad = None
            return []
        tensors = [shard.shard.data]
        state = self.inner.state.get(shard.shard, {})
        tensors += [v for v in state.values() if torch.is_tensor(v) and v.shape == shard.shard.shape]
        return [(t, skip, t[skip].clone()) for t in tensors] if skip.any() else []

    def _warn_bias_correction_once(self, regained: list) -> None:
        if not regained or self._warned_bias_correction:  # once per optimizer, not per parameter
            return
        self._warned_bias_correction = True
        more = len(regained) - 3
        names = ", ".join(map(repr, regained[:3])) + (f" and {more} more" if more > 0 else "")
        warnings.warn(f"{len(regained)} parameter(s) of this rank's slice ({names}) "
                      f"have a gradient again after steps without one: the slice's single step counter kept "
                      f"counting, so Adam-like bias correction differs from one device's (warned once per "
                      f"optimizer)", MpkitWarning, stacklevel=4)

    def _sync_hyperparameters(self) -> None:
        """Learning-rate schedulers change ``self.param_groups``; the inner optimizer follows."""
        inner = iter(self.inner.param_groups)
        for g, shard in zip(self.param_groups, self.shards):
            if shard is not None:
                next(inner).update({k: v for k, v in g.items() if k != "params"})

    # ---- checkpoints ----
    def _layout(self) -> dict:
        return {"world_size": self.world_size, "rank": self.rank,
                "numels": [None if s is None else s.numel for s in self.shards]}

    def state_dict(self) -> dict:
        """This rank's shard of the optimizer state plus the layout it belongs to: save one per rank,
        load each into the same rank of a world laid out the same way.

        torch's ``ZeroRedundancyOptimizer`` saves one whole file instead: every rank calls
        ``consolidate_state_dict(to=0)`` (a collective that gathers the shards), then rank 0 alone
        calls ``state_dict()``; to resume, every rank loads that whole dict and keeps its share."""
        return {"inner": self.inner.state_dict(), "layout": self._layout(),
                "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]}

    def load_state_dict(self, state_dict: dict) -> None:
        if not isinstance(state_dict, dict) or "inner" not in state_dict or "layout" not in state_dict:
            raise ValueError("not a ShardedOptimizer state_dict (expected the keys 'inner' and 'layout')")
        if state_dict["layout"] != self._layout():
            raise ValueError(f"this state_dict was saved for layout {state_dict['layout']}, but this optimizer is "
                             f"{self._layout()}: load each rank's file into the same rank of the same world, with the "
                             f"same parameters")
        self.inner.load_state_dict(state_dict["inner"])
        for g, saved in zip(self.param_groups, state_dict["param_groups"]):
            g.update(saved)
        self._sync_hyperparameters()

    def __repr__(self):
        sizes = [s.shard_numel for s in self.shards if s is not None]
        return (f"ShardedOptimizer({type(self.inner).__name__}, rank {self.rank} of {self.world_size}, "
                f"slice elements per group {sizes}, average_gradients={self.average_gradients})")


class _GroupShard:
    """One parameter group's flat buffers and this rank's slice of them."""

    def __init__(self, params, names, rank, world_size, average_gradients):
        self.params, self.names = params, names
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = shard_numel(self.numel, world_size)
        self.lo = rank * self.shard_numel
        self.hi = self.lo + self.shard_numel
        padded = self.shard_numel * world_size
        self.flat, views = flat_views((p.detach() for p in params), padded)
        for p, view in zip(params, views):
            view.copy_(p.detach())
            p.data = view  # the all-gather writes straight into the model's parameters
        self.offsets = []
        offset = 0
        for p in params:
            self.offsets.append(offset)
            offset += p.numel()
        self.grads = self.grad_views = None
        self.unreached = set()
        if average_gradients:  # the reduce-scatter's input: the model's .grad are views of it
            self.grads, self.grad_views = flat_views((p.detach() for p in params), padded)
            for p, view in zip(params, self.grad_views):
                p.grad = view
            # A view set here is not a gradient yet (on one device p.grad is None until a backward
            # reaches p): until autograd accumulates into it, the parameter counts as having none.
            self.unreached = unreached = set(range(len(params)))  # the hooks hold this set, not the shard
            for index, p in enumerate(params):
                p.register_post_accumulate_grad_hook(lambda _, index=index: unreached.discard(index))
        # This rank's slice as the inner optimizer's only parameter: a view, so it updates the model.
        self.shard = nn.Parameter(self.flat[self.lo:self.hi])
        self.shard.grad = self.flat.new_zeros(self.shard_numel)

    @property
    def padding(self) -> int:
        return self.flat.numel() - self.numel

    def adopt_gradients(self) -> list[str]:
        """Point every ``.grad`` back at its view of the flat gradient (after
        ``zero_grad(set_to_none=True)``, copying the fresh one in); the names of the parameters
        that have no gradient this step."""
        missing = []
        for index, (p, name, view) in enumerate(zip(self.params, self.names, self.grad_views)):
            if p.grad is None or (p.grad is view and index in self.unreached):
                missing.append(name)
            elif p.grad is not view:  # after zero_grad(set_to_none=True): a fresh tensor
                view.copy_(p.grad)
                p.grad = view
        return missing

    def overlaps(self):
        """(param, name, slice of the param's flat elements, slice of the shard) for every parameter
        that has elements in this rank's slice."""
        for p, name, start in zip(self.params, self.names, self.offsets):
            lo, hi = max(start, self.lo), min(start + p.numel(), self.hi)
            if lo < hi:
                yield p, name, slice(lo - start, hi - start), slice(lo - self.lo, hi - self.lo)


def _check_optimizer_cls(optimizer_cls) -> None:
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
        raise TypeError(f"optimizer_cls must be a torch.optim.Optimizer class such as torch.optim.AdamW; "
                        f"got {optimizer_cls!r}")
    if optimizer_cls.__name__ in NOT_ELEMENTWISE or issubclass(optimizer_cls, ShardedOptimizer):
        raise ValueError(f"{optimizer_cls.__name__} updates a tensor as a whole, so a flat slice of it would "
                         f"change the math; ShardedOptimizer needs an elementwise optimizer "
                         f"(SGD, Adam, AdamW, RMSprop, Adagrad, ...)")


def _check_one_dtype(trainable, index: int) -> None:
    """One flat buffer per group: mixed dtypes would all be cast to the first one's."""
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in trainable})
    if len(dtypes) > 1:
        raise ValueError(f"parameter group {index} mixes dtypes ({', '.join(dtypes)}); "
                         f"ShardedOptimizer keeps a group in one flat buffer of one dtype: give each dtype its "
                         f"own parameter group, e.g. [{{'params': bf16_params}}, {{'params': fp32_params}}]")


def _refuse_missing_gradients(missing: list[str]) -> None:
    if missing:
        raise RuntimeError(f"parameter(s) {', '.join(map(repr, missing[:5]))} have no gradient this step; "
                           f"ShardedOptimizer(average_gradients=True) reduces every trainable parameter. "
                           f"Freeze unused parameters, or average with DataParallel(find_unused_parameters="
                           f"True) and use ShardedOptimizer(average_gradients=False)")
