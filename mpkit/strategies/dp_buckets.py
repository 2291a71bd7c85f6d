"""What the data-parallel family (dp, ddp, zero1, fsdp) shares: the batch shard, the training
loop, the global loss, and dp's flat gradient buckets.

A bucket is one flat buffer whose slices *are* the parameters' ``.grad`` tensors (DDP calls this
``gradient_as_bucket_view``): autograd accumulates straight into the buffer, so averaging a bucket
is one collective on memory that is already contiguous — no copy in, no copy out. Buckets follow
reverse parameter order because backward produces gradients last layer first.
"""
from __future__ import annotations

import math
from functools import partial

import torch

from mpkit.models import loss_fn, make_batch
from mpkit.strategies.common import require_divisible, shard

MiB = 2**20  # DDP's bucket_cap_mb counts MiB; so does our bucket_mb


def validate_batch(cfg) -> None:
    require_divisible(cfg.batch_size, cfg.world_size, "batch_size", "world_size",
                      "every rank trains on an equal slice of the global batch")


def validate_bucket_mb(cfg) -> None:
    value = cfg.option("bucket_mb")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise ValueError(f"bucket_mb={value!r} must be a number of MiB >= 0 (0 = one all-reduce per parameter "
                         f"tensor, 25 = DDP's default)")


def local_batch(ctx, cfg, step):
    """This rank's contiguous slice of the global batch of ``step``."""
    x, y = make_batch(cfg.model, cfg.batch_size, step, cfg.seed)
    return shard(x, ctx.rank, ctx.world_size).to(ctx.device), shard(y, ctx.rank, ctx.world_size).to(ctx.device)


def train_loop(ctx, cfg, model, optimizer, *, track=(), sync_grads=None, zero_grad=None,
               after_step=None) -> list[float]:
    """Forward/backward on the local shard, then ``sync_grads()`` (communication), the optimizer
    span (``optimizer.step`` + ``zero_grad()``, default: grads set to None), then ``after_step()``. Returns the global mean loss
    per step: every shard has the same size, so the mean of the shard means is the global mean."""
    local = []
    with ctx.memory.track(*track):
        for step in range(cfg.steps):
            ctx.set_step(step)
            x, y = local_batch(ctx, cfg, step)
            with ctx.trace.span("forward"):
                loss = loss_fn(cfg.model, model(x), y)
            with ctx.trace.span("backward"):
                loss.backward()
            if sync_grads is not None:
                sync_grads()
            with ctx.trace.span("optimizer"):
                optimizer.step()
                if zero_grad is None:
                    optimizer.zero_grad(set_to_none=True)
                else:
                    zero_grad()
            if after_step is not None:
                after_step()
            local.append(loss.item())
    ctx.set_step(None)  # one all-reduce for all steps' losses, outside the timed steps
    losses = torch.tensor(local, dtype=torch.float64, device=ctx.device)
    ctx.comm.all_reduce(losses, op="avg", name="losses")
    return losses.tolist()


def plan_buckets(params, cap_bytes: int) -> list[list[torch.nn.Parameter]]:
    """Reverse parameter order, a new bucket whenever the next tensor would overflow ``cap_bytes``
    (a tensor bigger than the cap gets a bucket of its own; cap 0 = one bucket per tensor)."""
    buckets, current, size = [], [], 0
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        if current and size + nbytes > cap_bytes:
            buckets.append(current)
            current, size = [], 0
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


class GradBucket:
    def __init__(self, index, params):
        self.index = index
        self.params = params
        self.buffer, views = flat_views(params)
        for p, view in zip(params, views):
            p.grad = view  # autograd now accumulates into the bucket
        self.pending = len(params)
        self.work = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


class GradientAllReducer:
    """Averages the gradients of a replicated model across ranks, one all-reduce per bucket.

    ``overlap=False``: after backward, bucket after bucket, each a blocking all-reduce.
    ``overlap=True``: a post-accumulate-grad hook counts each bucket's gradients; when the last one
    lands, the bucket's all-reduce starts asynchronously, while autograd still computes the
    gradients of earlier layers. Buckets are launched in index order on every rank, since
    collectives must be issued in the same order everywhere; ``finish`` waits for them all.
    """

    def __init__(self, ctx, params, bucket_mb: float, overlap: bool):
        self.ctx = ctx
        self.overlap = overlap
        self.buckets = [GradBucket(i, ps) for i, ps in enumerate(plan_buckets(params, int(bucket_mb * MiB)))]
        self._next = 0
        if overlap:
            for bucket in self.buckets:
                for p in bucket.params:
                    p.register_post_accumulate_grad_hook(partial(self._grad_ready, bucket))

    @property
    def buffers(self):
        return [b.buffer for b in self.buckets]

    def _all_reduce(self, bucket, async_op):
        return self.ctx.comm.all_reduce(bucket.buffer, async_op=async_op, name=f"bucket {bucket.index}")

    def _grad_ready(self, bucket, _param):
        bucket.pending -= 1
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            ready = self.buckets[self._next]
            ready.work = self._all_reduce(ready, async_op=True)
            self._next += 1

    def finish(self):
        """After backward: every bucket summed over ranks, then divided by world size (the mean)."""
        for bucket in self.buckets:
            if not self.overlap:
                self._all_reduce(bucket, async_op=False)
            elif bucket.work is None:
                raise RuntimeError(f"bucket {bucket.index} never became ready: {bucket.pending} of its parameters "
                                   f"got no gradient in backward (overlap=True needs every parameter used)")
            else:
                bucket.work.wait()
            bucket.buffer.div_(self.ctx.world_size)

    def zero_grad(self):
        """Zero the buckets in place (never ``set_to_none``: the ``.grad`` views must stay)."""
        for bucket in self.buckets:
            bucket.buffer.zero_()
            bucket.pending = len(bucket.params)
            bucket.work = None
        self._next = 0
