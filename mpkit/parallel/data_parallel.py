"""Data parallel from scratch, on any ``nn.Module``: every rank holds the whole model, trains on its
own slice of the batch, and averaging the gradients makes every rank take the step one big device
would take on the whole batch.

The mechanism in ~20 lines (``DataParallel`` below, without its checks and edge cases)::

    for t in [*model.parameters(), *model.buffers()]:       # 1. the replicas start equal
        dist.broadcast(t.data, src=0)
    buckets = [SimpleNamespace(params=ps)                    # 2. reverse order: backward's order
               for ps in plan_buckets(params, 25 * MiB)]
    bucket_of = {p: b for b in buckets for p in b.params}
    for b in buckets:                                         #    one flat buffer per bucket,
        b.flat, views = flat_views(b.params)                  #    the .grad are views of it
        for p, view in zip(b.params, views):
            p.grad = view
        b.pending = len(b.params)

    def grad_ready(p):                                        # 3. after autograd wrote p.grad
        b = bucket_of[p]
        b.pending -= 1
        if b.pending == 0:                                    # 4. the bucket is complete: all-reduce
            b.work = dist.all_reduce(b.flat, async_op=True)  #    it while backward goes on
    for p in params:
        p.register_post_accumulate_grad_hook(grad_ready)

    loss_fn(model(x_local), y_local).backward()              # each rank its slice of the batch
    for b in buckets:                                         # 5. finish_gradient_synchronization()
        b.work.wait()
        b.flat /= world_size                                  # 6. the sum becomes the average
    optimizer.step()                                          # the same step on every rank

Read ``DataParallel`` in that order: ``__init__`` (1, 2), ``forward``, ``_grad_ready`` (3) and
``_launch_ready_buckets`` (4), ``finish_gradient_synchronization`` (5, 6). What real models and
real training loops add comes after, each behind a named method:

- the replicas are checked to be the same model before the broadcast (``mpkit.parallel.checks``);
  buffers (BatchNorm's running statistics) are broadcast again, as in DDP, at the start of each
  forward that follows a forward run with gradients enabled outside ``no_sync()`` (and of the
  first), and not at all with ``broadcast_buffers=False`` (``_sync_buffers_if_due``); all of it
  coalesced, one broadcast per dtype (DDP's ``_broadcast_coalesced``);
- buckets of at most ``bucket_mb`` MiB (DDP's ``bucket_cap_mb``), the first at most
  ``first_bucket_mb`` (1 MiB) so the first all-reduce starts early, one dtype each
  (``mpkit.parallel.buckets``); they launch in index order, the same on every rank, since
  collectives are matched by their order; ``overlap=False`` launches them all in
  ``finish_gradient_synchronization()``;
- ``zero_grad(set_to_none=True)`` (torch's default) drops the ``.grad`` views: the hook copies the
  fresh gradient into its slice and points ``.grad`` back at it (``_adopt``);
- frozen parameters are left alone (no hook, no bytes); shared (tied) parameters appear once and
  are reduced once; gradient accumulation goes through ``no_sync()`` as in DDP;
- a parameter that gets no gradient in a step is an error that names it, as in DDP, unless
  ``find_unused_parameters=True``: then one small extra all-reduce per step tells every rank which
  parameters were used anywhere, those used somewhere are averaged (zeros where unused), and those
  used nowhere keep the ``.grad`` they had (None after ``zero_grad()``), so the optimizer skips
  them exactly as it would on one device (``_zero_unused_slices``, ``_restore_unused_everywhere``);
- misuse raises and says what to do: a second backward into an all-reduced bucket, a forward or an
  ``optimizer.step()`` before ``finish_gradient_synchronization()``, finishing twice or inside
  ``no_sync()``. The early ``optimizer.step()`` is caught by a global optimizer-step pre-hook
  (``torch.optim.optimizer.register_optimizer_step_pre_hook``), the hook torch's own profiler and
  ``MemTracker`` register: the one place that sees every optimizer's step without the caller
  handing theirs to ``DataParallel``.
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from mpkit.observe import active
from mpkit.parallel.buckets import (DEFAULT_BUCKET_MB, FIRST_BUCKET_MB, MiB, bucket_caps, check_bucket_mb, flat_views,
                                    plan_buckets)
from mpkit.parallel.checks import broadcast_module, check_same_model, require_process_group, trainable_parameters


class DataParallel(nn.Module):
    """``module`` replicated on every rank of ``group`` (default: the whole world), gradients
    averaged with bucketed all-reduces. Use it like ``DistributedDataParallel``::

        dp = DataParallel(model, bucket_mb=25.0, overlap=True)
        loss_fn(dp(x_local), y_local).backward()
        dp.finish_gradient_synchronization()
        optimizer.step(); optimizer.zero_grad()

    Inside ``mpkit.launch`` every all-reduce is a traced event (bucket sizes, overlap with the
    backward in the timeline); in any other process group it just runs.

    ``broadcast_buffers`` (DDP's, a bool, default True): the buffers (BatchNorm's running
    statistics) come from the group's first rank at construction and at the start of a forward
    exactly when DDP's would: the first forward, and every forward that follows one run with
    gradients enabled outside ``no_sync()`` (train or eval mode alike: DDP looks at
    ``torch.is_grad_enabled()``, not ``module.training``). A forward under ``torch.no_grad()`` or
    inside ``no_sync()`` still syncs when due, but the forward after it does not. So every replica
    normalises with the same statistics at eval time; each rank still normalises a training
    batch with its own slice's statistics, as in DDP (``nn.SyncBatchNorm`` computes them over
    the whole batch). The buffers go coalesced, one broadcast per dtype (DDP's
    ``_broadcast_coalesced``), however many BatchNorm layers there are. ``False`` leaves buffers
    rank-local, at construction too (DDP's ``broadcast_buffers=False``, torch 2.13). A model
    without buffers sends nothing.
    """

    def __init__(self, module: nn.Module, bucket_mb: float = DEFAULT_BUCKET_MB, overlap: bool = True, group=None,
                 find_unused_parameters: bool = False, first_bucket_mb: float = FIRST_BUCKET_MB,
                 broadcast_buffers: bool = True):
        super().__init__()
        _check_options(module, overlap, broadcast_buffers)
        require_process_group("DataParallel")
        self.module, self.group, self.overlap = module, group, overlap
        self.bucket_mb = check_bucket_mb(bucket_mb)
        self.first_bucket_mb = check_bucket_mb(first_bucket_mb, "first_bucket_mb")
        self.find_unused_parameters = bool(find_unused_parameters)
        self.broadcast_buffers = broadcast_buffers and any(True for _ in module.buffers())
        self.world_size = dist.get_world_size(group)
        params = trainable_parameters(module, "DataParallel")
        names = {p: n for n, p in module.named_parameters() if p.requires_grad}
        # 1. the replicas start equal: first checked to be the same model, or the broadcast mixes values
        check_same_model(module, group, "DataParallel", buffers=broadcast_buffers)
        broadcast_module(module, group, buffers=self.broadcast_buffers)
        # 2. the buckets, reverse parameter order, one flat buffer each
        plan = plan_buckets(params, *bucket_caps(self.bucket_mb, self.first_bucket_mb))
        self.buckets = [_Bucket(i, ps, [names[p] for p in ps]) for i, ps in enumerate(plan)]
        self._slot = {p: (b, k) for b in self.buckets for k, p in enumerate(b.params)}  # bucket, place in it
        self._sync = True  # False inside no_sync()
        self._buffers_due = True  # DDP's require_forward_param_sync: set by the previous forward
        self._new_step()
        self._file_buckets_as_gradients()
        # 3. a hook per parameter (autograd's documented post-accumulate-grad hook), and a guard against
        # optimizer steps on unsynchronised gradients
        for p in params:
            p.register_post_accumulate_grad_hook(partial(DataParallel._grad_ready, self))
        _guard_optimizer_steps()

    def forward(self, *args, **kwargs):
        self._refuse_unsynchronised_forward()
        self._sync_buffers_if_due()
        self._step.finished = False
        return self.module(*args, **kwargs)

    def _grad_ready(self, p) -> None:
        """3. Autograd's post-accumulate-grad hook: ``p.grad`` is final for this backward."""
        bucket, _ = self._slot[p]
        self._refuse_late_gradient(p, bucket)
        self._adopt(p)
        step = self._step
        step.used.add(p)
        step.finished = False
        if not self._sync or p in step.counted:  # inside no_sync(): accumulate locally, send nothing
            return
        if not step.counted:  # this step's first counted gradient: from now on a finish() is owed
            _AWAITING.add(self)
        step.counted.add(p)
        step.pending[bucket.index] -= 1
        if self.overlap:
            self._launch_ready_buckets()

    def _launch_ready_buckets(self) -> None:
        """4. All-reduce every complete bucket, in index order: the same order on every rank, since
        collectives are matched by their order (a later bucket complete first waits its turn)."""
        step = self._step
        while step.next_bucket < len(self.buckets) and step.pending[step.next_bucket] == 0:
            self._launch(self.buckets[step.next_bucket])

    def _launch(self, bucket) -> None:
        self._step.works[bucket.index] = active.comm().all_reduce(bucket.buffer, group=self.group, async_op=True,
                                                                  name=f"bucket {bucket.index}")
        self._step.next_bucket = bucket.index + 1

    def finish_gradient_synchronization(self) -> None:
        """5, 6. Wait until every bucket is averaged over the group; call before ``optimizer.step()``."""
        self._check_finish_call()
        unused = [p for b in self.buckets for p in b.params if p not in self._step.used]
        kept = self._zero_unused_slices(unused)
        for bucket, work in zip(self.buckets, self._step.works):
            if work is None:  # overlap=False, or a bucket some parameter of never completed
                self._launch(bucket)
        for bucket, work in zip(self.buckets, self._step.works):
            work.wait()
            bucket.buffer.div_(self.world_size)
        self._restore_unused_everywhere(kept)
        self._new_step(finished=True)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no communication) inside; the next backward outside syncs.

        Here the backward hooks read the flag, so wrapping the backward is enough. torch's DDP
        decides in the *forward* whether the next backward syncs: its ``no_sync()`` must wrap the
        forward too, or that backward all-reduces anyway. Wrapping both works with either."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    @property
    def buffers_for_tracking(self):
        """The bucket buffers, for ``ctx.memory.track`` (they hold the gradients)."""
        return [b.buffer for b in self.buckets]

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{b.nbytes / MiB:.3g}" for b in self.buckets)
        return f"world_size={self.world_size}, buckets MiB=[{sizes}], overlap={self.overlap}"

    # ---- one step's bookkeeping ----
    def _new_step(self, finished: bool = False) -> None:
        self._step = _Step([len(b.params) for b in self.buckets], [None] * len(self.buckets), finished=finished)
        _AWAITING.discard(self)

    def _adopt(self, p) -> None:
        """Make ``p.grad`` the bucket slice again (after ``zero_grad(set_to_none=True)``)."""
        bucket, k = self._slot[p]
        view = bucket.views[k]
        if p.grad is not view:
            if p.grad is None:
                view.zero_()
            else:
                view.copy_(p.grad)
            p.grad = view

    def _name(self, p) -> str:
        bucket, k = self._slot[p]
        return bucket.names[k]

    # ---- buffers ----
    def _sync_buffers_if_due(self) -> None:
        """Broadcast the buffers before this forward exactly when DDP would.

        torch 2.13 DDP: _pre_forward syncs buffers when _check_sync_bufs_pre_fwd(), i.e.
        will_sync_module_buffers() = require_forward_param_sync and forward_sync_buffers and the
        module has buffers; _post_forward sets require_forward_param_sync = torch.is_grad_enabled()
        and require_backward_grad_sync (False inside no_sync()). module.training plays no part:
        an eval forward after a training one syncs too, and a forward inside no_sync(), under
        torch.no_grad() or in eval mode with grad enabled decides only whether the *next* one does."""
        if self.broadcast_buffers and self._buffers_due:
            broadcast_module(self.module, self.group, parameters=False)
        self._buffers_due = torch.is_grad_enabled() and self._sync

    # ---- parameters without a gradient this step ----
    def _zero_unused_slices(self, unused) -> dict:
        """The slices no backward wrote this step must not add stale values to the sum: zero them
        (an error naming them unless ``find_unused_parameters``); returns each one's old ``.grad``."""
        if unused and not self.find_unused_parameters:
            names = ", ".join(repr(self._name(p)) for p in unused[:5])
            raise RuntimeError(f"parameter(s) {names}{' ...' if len(unused) > 5 else ''} got no gradient this step "
                               f"(not used to compute the loss). Pass DataParallel(..., find_unused_parameters=True) "
                               f"(mpkit.train('dp', ..., find_unused_parameters=True)), as torch DDP asks, or "
                               f"freeze them with requires_grad_(False)")
        kept = {}
        for p in unused:
            kept[p] = p.grad
            self._adopt(p)  # a None .grad becomes its zeroed slice
        return kept

    def _restore_unused_everywhere(self, kept: dict) -> None:
        """A parameter no rank used keeps the ``.grad`` it had, as on one device (the optimizer
        skips a None). Runs after every bucket, as DDP's bitmap: ranks that used different branches
        launched some buckets in backward and the rest in finish, but all in index order; a mask
        between them would meet another rank's bucket (gloo: "collective mismatch"; NCCL: a hang or
        wrong sums)."""
        if not self.find_unused_parameters:
            return
        for p in self._used_nowhere():
            p.grad = kept[p]

    def _used_nowhere(self) -> set:
        """Parameters used by no rank this step: one all-reduce of a 0/1 mask over all parameters."""
        params = [p for b in self.buckets for p in b.params]
        mask = torch.tensor([p in self._step.used for p in params], dtype=torch.float32, device=params[0].device)
        active.comm().all_reduce(mask, group=self.group, name="used-parameter mask")
        return {p for p, used in zip(params, mask.tolist()) if not used}

    # ---- misuse ----
    def _refuse_unsynchronised_forward(self) -> None:
        if self._step.counted:
            raise RuntimeError("the last backward's gradients were never synchronised: call "
                               "finish_gradient_synchronization() after backward, before optimizer.step()")

    def _refuse_late_gradient(self, p, bucket) -> None:
        if self._step.works[bucket.index] is not None:
            raise RuntimeError(f"parameter {self._name(p)!r} got a gradient after its bucket was all-reduced: "
                               f"call backward once per step, and use no_sync() to accumulate")

    def _check_finish_call(self) -> None:
        if not self._sync:
            raise RuntimeError("finish_gradient_synchronization() inside no_sync(): leave the no_sync() block "
                               "and run the last backward first")
        if self._step.finished:
            raise RuntimeError("finish_gradient_synchronization() called twice after one backward: the gradients "
                               "are already averaged; call it once per step, after backward and before "
                               "optimizer.step()")

    # ---- memory tracking ----
    def _file_buckets_as_gradients(self) -> None:
        """The bucket buffers hold gradients from the start: tell the rank's memory tracker (a no-op
        outside ``mpkit.launch``), or their bytes count as "other" until a backward writes them."""
        active.memory().file_gradients(*self.buffers_for_tracking)


@dataclass
class _Step:
    """One step's bookkeeping, made afresh by each ``finish_gradient_synchronization()``."""

    pending: list[int]  # gradients each bucket still waits for in the synchronising backward
    works: list  # each bucket's all-reduce once launched, else None
    next_bucket: int = 0  # buckets launch in index order on every rank
    used: set = field(default_factory=set)  # parameters whose gradient arrived (inside no_sync() too)
    counted: set = field(default_factory=set)  # ... in the synchronising backward: they complete buckets
    finished: bool = False  # finish_... made this step and no forward or gradient came since


class _Bucket:
    """A group of parameters reduced as one flat tensor."""

    def __init__(self, index, params, names):
        self.index = index
        self.params = params
        self.names = names
        # The views become the parameters' .grad when their first gradient arrives (``_adopt``):
        # until then .grad stays None, as on one device, so an optimizer skips what never got one.
        self.buffer, self.views = flat_views(p.detach() for p in params)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def _check_options(module, overlap, broadcast_buffers) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"DataParallel wraps an nn.Module; got {type(module).__name__}")
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap={overlap!r} must be True (all-reduce buckets during backward) or False "
                         f"(after backward, in finish_gradient_synchronization)")
    if not isinstance(broadcast_buffers, bool):
        raise ValueError(f"broadcast_buffers={broadcast_buffers!r} must be True (buffers from the group's first "
                         f"rank at construction and before forwards, as DDP) or False (buffers stay rank-local)")


# ---- optimizer steps before finish_gradient_synchronization() ----
_AWAITING = weakref.WeakSet()  # DataParallels whose last backward is not yet synchronised
_guarded = False


def _guard_optimizer_steps() -> None:
    global _guarded
    if not _guarded:
        register_optimizer_step_pre_hook(_step_too_early)
        _guarded = True


def _step_too_early(optimizer, args, kwargs) -> None:
    """A global optimizer step pre-hook: refuse a step on gradients still being all-reduced (or
    never reduced) by a ``DataParallel`` whose ``finish_gradient_synchronization()`` was skipped.
    Costs one empty-set test per step when nothing is pending."""
    if not _AWAITING:
        return
    params = {p for group in optimizer.param_groups for p in group["params"]}
    for dp in list(_AWAITING):
        if not params.isdisjoint(dp._slot):
            raise RuntimeError("optimizer.step() before DataParallel.finish_gradient_synchronization(): this "
                               "step's gradients are still this rank's own (their all-reduce in flight or not "
                               "started), so each rank would step differently. Call "
                               "dp.finish_gradient_synchronization() after backward, before optimizer.step()")
