"""Blind attempts at bucketed_gradients (written without the reference)."""
import torch
import torch.distributed as dist
from torch.distributed import all_reduce


class PreallocatedBuffers:
    """unusual: one preallocated flat buffer per bucket; each hook copies its gradient into its slot, and the
    full bucket goes out through ctx.comm."""

    def __init__(self, ctx, model, bucket_mb):
        self.ctx, self.cap = ctx, bucket_mb * 2 ** 20
        params = [p for p in model.parameters() if p.requires_grad][::-1]
        self.buckets, current, size = [], [], 0
        for p in params:
            if current and size + p.numel() * 4 > self.cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * 4
        if current:
            self.buckets.append(current)
        self.where = {}
        self.buffers = []
        for b, bucket in enumerate(self.buckets):
            self.buffers.append(torch.zeros(sum(p.numel() for p in bucket)))
            offset = 0
            for p in bucket:
                self.where[p] = (b, offset)
                offset += p.numel()
                p.register_post_accumulate_grad_hook(self._ready)
        self.ready = [0] * len(self.buckets)
        self.works = {}

    def _ready(self, p):
        b, offset = self.where[p]
        self.buffers[b][offset:offset + p.numel()].copy_(p.grad.reshape(-1))
        self.ready[b] += 1
        if self.ready[b] == len(self.buckets[b]):
            self.works[b] = self.ctx.comm.all_reduce(self.buffers[b], async_op=True)

    def finish(self):
        for b, work in self.works.items():
            work.wait()
            buf = self.buffers[b] / self.ctx.world_size
            for p in self.buckets[b]:
                _, offset = self.where[p]
                p.grad.copy_(buf[offset:offset + p.numel()].view_as(p.grad))
        self.ready = [0] * len(self.buckets)
        self.works = {}


class BucketsInArrivalOrder:
    """unusual: buckets are formed on the fly in the order the hooks fire (not planned in __init__); a bucket
    is sent when the next gradient would overflow it, the last one as soon as every gradient has arrived."""

    def __init__(self, ctx, model, bucket_mb):
        self.world = ctx.world_size
        self.cap = bucket_mb * 2 ** 20
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._arrived)
        self._reset()

    def _reset(self):
        self.pending, self.pending_bytes, self.seen, self.sent = [], 0, 0, []

    def _flush(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.pending])
        self.sent.append((list(self.pending), flat, all_reduce(flat, async_op=True)))
        self.pending, self.pending_bytes = [], 0

    def _arrived(self, p):
        nbytes = p.grad.numel() * p.grad.element_size()
        if self.pending and self.pending_bytes + nbytes > self.cap:
            self._flush()
        self.pending.append(p)
        self.pending_bytes += nbytes
        self.seen += 1
        if self.seen == len(self.params):
            self._flush()

    def finish(self):
        for params, flat, work in self.sent:
            work.wait()
            flat.div_(self.world)
            for piece, p in zip(flat.split([q.numel() for q in params]), params):
                p.grad.copy_(piece.view_as(p.grad))
        self._reset()


class _Planned:
    """the usual plan (reverse order, at most bucket_mb each); the wrong ones below change one thing."""

    WAIT_IN_HOOK = False
    DIVIDE = True
    RESET = True

    def __init__(self, ctx, model, bucket_mb):
        self.world = ctx.world_size
        cap = bucket_mb * 2 ** 20
        self.buckets, current, size = [], [], 0
        for p in self.trainable(model)[::-1]:
            if current and size + p.numel() * 4 > cap:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * 4
        if current:
            self.buckets.append(current)
        self.bucket_of = {p: b for b, bucket in enumerate(self.buckets) for p in bucket}
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(self.hook)
        self.count = [0] * len(self.buckets)
        self.works = []

    def trainable(self, model):
        return [p for p in model.parameters() if p.requires_grad]

    def hook(self, p):
        b = self.bucket_of[p]
        self.count[b] += 1
        if self.count[b] == len(self.buckets[b]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[b]])
            work = dist.all_reduce(flat, async_op=True)
            if self.WAIT_IN_HOOK:
                work.wait()
            self.works.append((b, flat, work))

    def finish(self):
        for b, flat, work in self.works:
            work.wait()
            if self.DIVIDE:
                flat /= self.world
            for piece, q in zip(flat.split([q.numel() for q in self.buckets[b]]), self.buckets[b]):
                q.grad.copy_(piece.view_as(q.grad))
        if self.RESET:
            self.count = [0] * len(self.buckets)
            self.works = []


# wrong (no overlap): waits on each all-reduce inside the hook, blocking backward
class WaitsInHook(_Planned):
    WAIT_IN_HOOK = True


# wrong: sums, never divides by world_size
class NeverDivides(_Planned):
    DIVIDE = False


# wrong: forgets to reset the counters and works for the next step
class NeverResets(_Planned):
    RESET = False


# wrong: registers hooks on frozen parameters too, whose hook never fires, so their bucket never goes out
class HooksFrozenToo(_Planned):
    def trainable(self, model):
        return list(model.parameters())


# wrong (no overlap): no hooks; all-reduces everything in finish(), after backward
class AllInFinish:
    def __init__(self, ctx, model, bucket_mb):
        self.world = ctx.world_size
        self.params = [p for p in model.parameters() if p.requires_grad]

    def finish(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        dist.all_reduce(flat)
        flat /= self.world
        for piece, p in zip(flat.split([p.numel() for p in self.params]), self.params):
            p.grad.copy_(piece.view_as(p.grad))


# wrong (wasteful): ignores bucket_mb, one bucket holding every gradient (sent only at the end of backward)
class OneBigBucket(_Planned):
    def __init__(self, ctx, model, bucket_mb):
        super().__init__(ctx, model, 1e9)


# wrong (raises): finish takes the model as an argument, but the exercise calls sync.finish()
class FinishTakesModel(_Planned):
    def finish(self, model):
        super().finish()


CORRECT = [PreallocatedBuffers, BucketsInArrivalOrder]
WRONG = [
    (WaitsInHook, ("overlap", "wait", "block")),
    (NeverDivides, ("world_size", "world size", "divid")),
    (NeverResets, ("reset", "next step", "second step", "step 2")),
    (HooksFrozenToo, ("frozen", "requires_grad", "never fire")),
    (AllInFinish, ("overlap", "hook", "during backward", "after backward")),
    (OneBigBucket, ("bucket_mb", "bucket size", "too big", "larger than", "one bucket")),
    (FinishTakesModel, ("signature", "finish()", "argument")),
]
