"""Data parallel from scratch, on any ``nn.Module``: every rank holds the whole model, trains on its
own slice of the batch, and averaging the gradients makes every rank take the step one big device
would take on the whole batch.

The mechanics, in order:

1. at construction every parameter and buffer is broadcast from the group's first rank, so the
   replicas start identical whatever each rank's seed did (one coalesced broadcast per dtype, as
   DDP's ``_broadcast_coalesced``); buffers are broadcast again, as in DDP, at the start of each
   forward that follows a forward run with gradients enabled outside ``no_sync()`` (and of the
   first), and not at all with ``broadcast_buffers=False``;
2. each rank runs forward/backward on its slice;
3. gradients are all-reduced and divided by the group size, packed in flat *buckets* of at most
   ``bucket_mb`` MiB (fewer, larger messages: latency is paid per message; DDP's
   ``bucket_cap_mb``, counted as ``bucket_mb * 1024 * 1024`` bytes). Buckets follow reverse
   parameter order because backward produces gradients last layer first; as in DDP, the first
   bucket holds at most ``first_bucket_mb`` (1 MiB), so the first all-reduce starts early. With ``overlap=True`` a
   post-accumulate-grad hook counts each bucket's gradients and starts its all-reduce the moment
   the last one lands, while autograd still computes earlier layers; with ``overlap=False`` the
   all-reduces run in ``finish_gradient_synchronization()``;
4. ``finish_gradient_synchronization()`` waits for them (call it once, before ``optimizer.step()``:
   a step of an optimizer that holds this model's parameters raises before it, a second call
   raises too), and every rank then takes the same optimizer step.

A bucket is one flat buffer whose slices *are* the parameters' ``.grad`` tensors (DDP's
``gradient_as_bucket_view``), so autograd accumulates straight into it. ``zero_grad(set_to_none=True)``
(torch's default) drops those views; the hook then copies the fresh gradient into its slice and
points ``.grad`` back at it, so both kinds of ``zero_grad`` work.

What real models bring: frozen parameters are left alone (no hook, no bytes); shared (tied)
parameters appear once and are reduced once; gradient accumulation goes through ``no_sync()`` as
in DDP. A parameter that gets no gradient in a step is an error that names it, as in DDP, unless
``find_unused_parameters=True``: then one small extra all-reduce per step tells every rank which
parameters were used anywhere, those used somewhere are averaged (zeros where unused), and those
used nowhere keep the ``.grad`` they had (None after ``zero_grad()``), so the optimizer skips them
exactly as it would on one device.
"""
from __future__ import annotations

import math
import weakref
from contextlib import contextmanager
from functools import partial

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch import nn

from mpkit.observe import active
from mpkit.whole import is_number

MiB = 2**20  # DDP's bucket_cap_mb counts MiB (bucket_cap_mb * 1024 * 1024 bytes); so does bucket_mb
DEFAULT_BUCKET_MB = 25.0  # DDP's default bucket_cap_mb
FIRST_BUCKET_MB = 1.0  # DDP caps its first bucket at 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)


def bucket_caps(bucket_mb: float, first_bucket_mb: float = FIRST_BUCKET_MB) -> tuple[int, int]:
    """(bytes cap of every bucket, of the first one) for ``plan_buckets``: the first is never larger."""
    return int(bucket_mb * MiB), int(min(first_bucket_mb, bucket_mb) * MiB)


def check_bucket_mb(bucket_mb, name="bucket_mb") -> float:
    if not is_number(bucket_mb) or not 0 <= bucket_mb < math.inf:
        raise ValueError(f"{name}={bucket_mb!r} must be a number of MiB >= 0 (0 = one all-reduce per parameter "
                         f"tensor, 25 = DDP's default)")
    return float(bucket_mb)


def plan_buckets(params, cap_bytes: int, first_cap: int | None = None) -> list[list]:
    """The bucket plan: reverse parameter order, a new bucket whenever the next tensor would
    overflow ``cap_bytes`` (a tensor bigger than the cap gets a bucket of its own; cap 0 = one
    bucket per tensor) or has another dtype (a bucket is one flat tensor: a bf16 model's fp32
    norms go apart, as in DDP). ``first_cap``: a smaller cap for the first bucket (torch DDP's
    1 MiB, so communication starts early). Works on meta tensors too, so the cost model prices
    the very buckets a run reduces."""
    buckets, current, size = [], [], 0
    cap = cap_bytes if first_cap is None else first_cap
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        if current and (size + nbytes > cap or p.dtype != current[0].dtype):
            buckets.append(current)
            current, size, cap = [], 0, cap_bytes
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def flat_views(tensors, numel=None):
    """One zeroed flat buffer of ``numel`` (default: their total) elements and a view shaped like
    each tensor, back to back; the tail past their total is padding."""
    tensors = list(tensors)
    total = sum(t.numel() for t in tensors)
    flat = torch.zeros(total if numel is None else numel, dtype=tensors[0].dtype, device=tensors[0].device)
    views, offset = [], 0
    for t in tensors:
        views.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return flat, views


def trainable_parameters(module: nn.Module, what: str) -> list[nn.Parameter]:
    """The parameters that need a gradient, each once; a clear error when there are none."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{what}: the module has no trainable parameters (every parameter has "
                         f"requires_grad=False); there is nothing to synchronise")
    return params


def require_process_group(what: str) -> None:
    if not dist.is_initialized():
        raise RuntimeError(f"{what} needs a process group: run inside mpkit.launch, torchrun, or after "
                           f"torch.distributed.init_process_group(...)")


def group_ranks(group):
    """(this rank in ``group``, the group's size, the global rank of its first member)."""
    return dist.get_rank(group), dist.get_world_size(group), dist.get_global_rank(group or dist.group.WORLD, 0)


_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)  # same on every rank


def _param_record(name: str, p: torch.Tensor) -> list[int]:
    """What DDP compares of a parameter, and its dtype and name: [dtype, ndim, *sizes, *strides, len, *name]."""
    encoded = name.encode()
    return [_DTYPES.index(p.dtype), p.dim(), *p.shape, *p.stride(), len(encoded), *encoded]


def _decode_records(flat: list[int], count: int) -> list[tuple]:
    records, i = [], 0
    for _ in range(count):
        dtype, ndim = _DTYPES[flat[i]], flat[i + 1]
        shape, stride = tuple(flat[i + 2:i + 2 + ndim]), tuple(flat[i + 2 + ndim:i + 2 + 2 * ndim])
        i += 2 + 2 * ndim
        name = bytes(flat[i + 1:i + 1 + flat[i]]).decode()
        records.append((name, shape, stride, dtype))
        i += 1 + flat[i]
    return records


def check_same_model(module: nn.Module, group, what: str, buffers: bool = False) -> None:
    """Every rank's replica must have the same parameters, in the same order and under the same
    names: a rank that built another model (a size read from its rank, layers of one shape
    assigned in another order) would receive the first rank's values into mismatched tensors, or
    into other layers, silently. DDP's check at construction (torch 2.13
    ``_verify_param_shape_across_processes`` -> ``dist._verify_params_across_processes``) compares
    the parameter count, then each parameter's sizes and strides with rank 0's; buffers are not
    compared. Here buffers are, with ``buffers=True`` (``broadcast_buffers=True``: broadcast
    coalesced, a mismatch would mix values across buffers; with False they may differ). Here the
    dtypes too (DDP does not: a float64 replica would receive float32 bytes), every parameter (the
    frozen ones are broadcast as well; DDP checks those that require grad), and the error is
    raised on every rank (DDP's only on the rank that differs, while the others wait) and names
    the rank and the parameter. Two small untraced all-gathers (record lengths, then the records)."""
    named = list(module.named_parameters())
    if buffers:  # they will be broadcast coalesced: a mismatch would mix values across buffers silently
        named += [(f"buffer {name}", b) for name, b in module.named_buffers()]
    check_same_tensors(named, group, what)


def check_same_tensors(named: list, group, what: str) -> None:
    """``check_same_model``'s comparison of any ``[(name, tensor), ...]`` across the group's ranks
    (a ``ShardedOptimizer``'s parameters, which need not come from one module)."""
    device = named[0][1].device if named else torch.device("cpu")
    mine = [x for name, p in named for x in _param_record(name, p)]
    world = dist.get_world_size(group)
    sizes = [torch.empty(2, dtype=torch.int64, device=device) for _ in range(world)]
    with active.quiet():
        active.comm().all_gather(sizes, torch.tensor([len(named), len(mine)], dtype=torch.int64, device=device),
                                 group=group)
        counts, lengths = zip(*(s.tolist() for s in sizes))
        padded = torch.zeros(max(lengths), dtype=torch.int64, device=device)
        padded[:len(mine)] = torch.tensor(mine, dtype=torch.int64)
        every = [torch.empty_like(padded) for _ in range(world)]
        active.comm().all_gather(every, padded, group=group)
    replicas = [_decode_records(t.tolist(), n) for t, n in zip(every, counts)]
    hint = "; build the same model on every rank (same sizes, same dtype, same seed)"

    def described(record, other):
        _, shape, stride, dtype = record
        text = f"shape {shape}, dtype {str(dtype).removeprefix('torch.')}"
        return text + (f", strides {stride}" if shape == other[1] and stride != other[2] else "")

    first = replicas[0]
    for rank, theirs in enumerate(replicas[1:], 1):
        for ours, their in zip(first, theirs):
            if ours[1:] != their[1:]:
                there = "" if ours[0] == their[0] else f" (there named {ours[0]!r})"
                raise ValueError(f"{what}: the replicas differ: parameter {their[0]!r} has {described(their, ours)} "
                                 f"on group rank {rank}, but {described(ours, their)} on group rank 0{there}{hint}")
        for k, (ours, their) in enumerate(zip(first, theirs)):
            # same shapes, another name in this place: layers registered in another order (or another
            # model of the same shapes); rank 0's values would land in other layers of this rank
            if ours[0] != their[0]:
                raise ValueError(f"{what}: the replicas differ: parameter tensor {k} is {their[0]!r} on group rank "
                                 f"{rank} but {ours[0]!r} on group rank 0 (same shape): the ranks registered their "
                                 f"layers in another order or under other names, so each would train another "
                                 f"function; build the model with the same code on every rank, assigning its "
                                 f"submodules in the same order")
        if len(theirs) != len(first):
            more, less, extra = (rank, 0, theirs) if len(theirs) > len(first) else (0, rank, first)
            name = extra[min(len(first), len(theirs))][0]
            raise ValueError(f"{what}: the replicas differ: group rank {rank} has {len(theirs)} parameter tensors, "
                             f"group rank 0 has {len(first)}: group rank {more}'s parameter {name!r} has no "
                             f"counterpart on group rank {less}{hint}")


def broadcast_module(module: nn.Module, group=None, parameters: bool = True, buffers: bool = True) -> None:
    """Every parameter and buffer of ``module`` from the group's first rank (replicas start equal);
    ``parameters=False``: just the buffers (BatchNorm's running statistics, before a forward).
    Coalesced as DDP's ``_broadcast_coalesced``: one broadcast per dtype (per 250 MiB), however
    many tensors the module has (``Comm.broadcast_coalesced``)."""
    tensors = [*(module.parameters() if parameters else ()), *(module.buffers() if buffers else ())]
    if not tensors:
        return
    what = "parameters and buffers" if parameters and buffers else "parameters" if parameters else "buffers"
    with torch.no_grad():
        active.comm().broadcast_coalesced([t.detach() for t in tensors], src=group_ranks(group)[2], group=group,
                                          name=what)


_AWAITING = weakref.WeakSet()  # DataParallels whose last backward is not yet synchronised
_hooked = False


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


def _hook_optimizers() -> None:
    global _hooked
    if not _hooked:
        register_optimizer_step_pre_hook(_step_too_early)
        _hooked = True


class _Bucket:
    def __init__(self, index, params, names):
        self.index = index
        self.params = params
        self.names = names
        # The views become the parameters' .grad when their first gradient arrives (``_adopt``):
        # until then .grad stays None, as on one device, so an optimizer skips what never got one.
        self.buffer, self.views = flat_views(p.detach() for p in params)
        self.work = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


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
        if not isinstance(module, nn.Module):
            raise TypeError(f"DataParallel wraps an nn.Module; got {type(module).__name__}")
        if not isinstance(overlap, bool):
            raise ValueError(f"overlap={overlap!r} must be True (all-reduce buckets during backward) or False "
                             f"(after backward, in finish_gradient_synchronization)")
        if not isinstance(broadcast_buffers, bool):
            raise ValueError(f"broadcast_buffers={broadcast_buffers!r} must be True (buffers from the group's first "
                            f"rank at construction and before forwards, as DDP) or False (buffers stay rank-local)")
        require_process_group("DataParallel")
        self.module = module
        self.bucket_mb = check_bucket_mb(bucket_mb)
        self.first_bucket_mb = check_bucket_mb(first_bucket_mb, "first_bucket_mb")
        self.overlap = overlap
        self.group = group
        self.find_unused_parameters = bool(find_unused_parameters)
        self.broadcast_buffers = broadcast_buffers and any(True for _ in module.buffers())
        self._buffers_due = True  # DDP's require_forward_param_sync: set by the previous forward
        self.world_size = dist.get_world_size(group)
        params = trainable_parameters(module, "DataParallel")
        names = {p: n for n, p in module.named_parameters() if p.requires_grad}
        check_same_model(module, group, "DataParallel", buffers=broadcast_buffers)
        broadcast_module(module, group, buffers=self.broadcast_buffers)
        self.buckets = [_Bucket(i, ps, [names[p] for p in ps])
                        for i, ps in enumerate(plan_buckets(params, *bucket_caps(self.bucket_mb, self.first_bucket_mb)))]
        self._slot = {p: (b, k) for b in self.buckets for k, p in enumerate(b.params)}
        active.memory().file_gradients(*self.buffers_for_tracking)  # gradients from the start, not "other"
        self._sync = True
        self._finished = False  # finish_... ran and no forward or gradient came since
        self._reset()
        for p in params:
            p.register_post_accumulate_grad_hook(partial(DataParallel._grad_ready, self))
        _hook_optimizers()

    def forward(self, *args, **kwargs):
        if self._awaiting_finish:
            raise RuntimeError("the last backward's gradients were never synchronised: call "
                               "finish_gradient_synchronization() after backward, before optimizer.step()")
        # torch 2.13 DDP: _pre_forward syncs buffers when _check_sync_bufs_pre_fwd(), i.e.
        # will_sync_module_buffers() = require_forward_param_sync and forward_sync_buffers and the
        # module has buffers; _post_forward sets require_forward_param_sync = torch.is_grad_enabled()
        # and require_backward_grad_sync (False inside no_sync()). module.training plays no part:
        # an eval forward after a training one syncs too, and a forward inside no_sync(), under
        # torch.no_grad() or in eval mode with grad enabled decides only whether the *next* one does.
        if self.broadcast_buffers and self._buffers_due:
            broadcast_module(self.module, self.group, parameters=False)
        self._buffers_due = torch.is_grad_enabled() and self._sync
        self._finished = False
        return self.module(*args, **kwargs)

    def _name(self, p) -> str:
        bucket, k = self._slot[p]
        return bucket.names[k]

    # ---- bookkeeping of one step ----
    def _reset(self):
        self._used = set()      # parameters whose gradient arrived since the last synchronisation
        self._counted = set()   # ... in the synchronising backward (outside no_sync): they complete buckets
        self._awaiting_finish = False  # a backward outside no_sync() ran; finish_... comes next
        _AWAITING.discard(self)
        self._pending = [len(b.params) for b in self.buckets]
        self._next = 0          # buckets are launched in index order on every rank
        for bucket in self.buckets:
            bucket.work = None

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

    def _grad_ready(self, p) -> None:
        bucket, _ = self._slot[p]
        if bucket.work is not None:
            raise RuntimeError(f"parameter {self._name(p)!r} got a gradient after its bucket was all-reduced: "
                               f"call backward once per step, and use no_sync() to accumulate")
        self._adopt(p)
        self._used.add(p)
        self._finished = False
        if not self._sync or p in self._counted:
            return
        self._awaiting_finish = True
        _AWAITING.add(self)
        self._counted.add(p)
        self._pending[bucket.index] -= 1
        if self.overlap:
            while self._next < len(self.buckets) and self._pending[self._next] == 0:
                self._launch(self.buckets[self._next])

    def _launch(self, bucket) -> None:
        bucket.work = active.comm().all_reduce(bucket.buffer, group=self.group, async_op=True,
                                               name=f"bucket {bucket.index}")
        self._next = bucket.index + 1

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

    def _unused(self):
        return [(b, p) for b in self.buckets for p in b.params if p not in self._used]

    def _global_use(self, unused) -> set:
        """Parameters used by no rank this step: one all-reduce of a 0/1 mask over all parameters."""
        params = [p for b in self.buckets for p in b.params]
        mask = torch.tensor([p in self._used for p in params], dtype=torch.float32, device=params[0].device)
        active.comm().all_reduce(mask, group=self.group, name="used-parameter mask")
        return {p for p, used in zip(params, mask.tolist()) if not used}

    def finish_gradient_synchronization(self) -> None:
        """Wait until every bucket is averaged over the group; call before ``optimizer.step()``."""
        if not self._sync:
            raise RuntimeError("finish_gradient_synchronization() inside no_sync(): leave the no_sync() block "
                               "and run the last backward first")
        if self._finished:
            raise RuntimeError("finish_gradient_synchronization() called twice after one backward: the gradients "
                               "are already averaged; call it once per step, after backward and before "
                               "optimizer.step()")
        unused = self._unused()
        if unused and not self.find_unused_parameters:
            names = ", ".join(repr(self._name(p)) for _, p in unused[:5])
            raise RuntimeError(f"parameter(s) {names}{' ...' if len(unused) > 5 else ''} got no gradient this step "
                               f"(not used to compute the loss). Pass DataParallel(..., find_unused_parameters=True) "
                               f"(mpkit.train('dp', ..., find_unused_parameters=True)), as torch DDP asks, or "
                               f"freeze them with requires_grad_(False)")
        kept = {}
        for _, p in unused:  # a slice nobody wrote this step: its stale values must not be summed
            kept[p] = p.grad
            self._adopt(p)
            if kept[p] is None:
                self._slot[p][0].views[self._slot[p][1]].zero_()
        for bucket in self.buckets:
            if bucket.work is None:
                self._launch(bucket)
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.buffer.div_(self.world_size)
        # After every bucket, as DDP's bitmap: ranks that used different branches launched some
        # buckets in backward and the rest here, but all in index order; a mask between them would
        # meet another rank's bucket (gloo: "collective mismatch"; NCCL: a hang or wrong sums).
        nowhere = self._global_use(unused) if self.find_unused_parameters else set()
        for p in nowhere:  # used by no rank: the optimizer must see what one device would have
            p.grad = kept[p]
        self._reset()
        self._finished = True

    @property
    def buffers_for_tracking(self):
        """The bucket buffers, for ``ctx.memory.track`` (they hold the gradients)."""
        return [b.buffer for b in self.buckets]

    def extra_repr(self) -> str:
        sizes = ", ".join(f"{b.nbytes / MiB:.3g}" for b in self.buckets)
        return f"world_size={self.world_size}, buckets MiB=[{sizes}], overlap={self.overlap}"
