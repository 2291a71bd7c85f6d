"""Attempts for BucketedGradientSync(ctx, model, bucket_mb) with .finish()."""
import torch
import torch.distributed as dist


# ---------------------------------------------------------------- correct
class ForwardOrderBuckets:
    """Buckets filled in the parameters' (forward) order rather than reversed; tensors keyed by id."""

    def __init__(self, ctx, model, bucket_mb):
        self.n = ctx.world_size
        limit = bucket_mb * 2 ** 20
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets, cur, size = [], [], 0
        for p in params:
            b = p.numel() * 4
            if cur and size + b > limit:
                self.buckets.append(cur)
                cur, size = [], 0
            cur.append(p)
            size += b
        if cur:
            self.buckets.append(cur)
        self.where = {id(p): i for i, bk in enumerate(self.buckets) for p in bk}
        self._reset()
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)

    def _reset(self):
        self.count = [0] * len(self.buckets)
        self.works = []

    def _ready(self, p):
        i = self.where[id(p)]
        self.count[i] += 1
        if self.count[i] == len(self.buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.works.append((i, dist.all_reduce(flat, async_op=True), flat))

    def finish(self):
        for i, work, flat in self.works:
            work.wait()
            flat.div_(self.n)
            off = 0
            for q in self.buckets[i]:
                k = q.numel()
                q.grad.copy_(flat[off:off + k].view_as(q.grad))
                off += k
        self._reset()


class PreallocatedBufferBuckets:
    """Like real DDP: a preallocated flat buffer per bucket; each ready grad is copied into its slot."""

    def __init__(self, ctx, model, bucket_mb):
        self.n = ctx.world_size
        limit = bucket_mb * 2 ** 20
        params = [p for p in model.parameters() if p.requires_grad][::-1]
        groups, cur, size = [], [], 0
        for p in params:
            b = p.numel() * 4
            if cur and size + b > limit:
                groups.append(cur)
                cur, size = [], 0
            cur.append(p)
            size += b
        if cur:
            groups.append(cur)
        self.buckets = []
        self.slot = {}
        for bi, g in enumerate(groups):
            buf = torch.zeros(sum(p.numel() for p in g), dtype=g[0].dtype)
            off = 0
            for p in g:
                self.slot[id(p)] = (bi, off, p.numel())
                off += p.numel()
            self.buckets.append({"params": g, "buf": buf, "pending": len(g), "work": None})
        for p in params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        bi, off, k = self.slot[id(p)]
        b = self.buckets[bi]
        b["buf"][off:off + k].copy_(p.grad.reshape(-1))
        b["pending"] -= 1
        if b["pending"] == 0:
            b["work"] = dist.all_reduce(b["buf"], async_op=True)

    def finish(self):
        for b in self.buckets:
            if b["work"] is not None:
                b["work"].wait()
                b["buf"].div_(self.n)
                for p in b["params"]:
                    _, off, k = self.slot[id(p)]
                    p.grad.copy_(b["buf"][off:off + k].view_as(p.grad))
            b["pending"] = len(b["params"])
            b["work"] = None


CORRECT = [ForwardOrderBuckets, PreallocatedBufferBuckets]


# ---------------------------------------------------------------- wrong
class AllInFinish:
    """No hooks: everything is bucketed and all-reduced in finish(), after backward (no overlap)."""

    def __init__(self, ctx, model, bucket_mb):
        self.n = ctx.world_size
        self.limit = bucket_mb * 2 ** 20
        self.params = [p for p in model.parameters() if p.requires_grad][::-1]

    def finish(self):
        cur, size, buckets = [], 0, []
        for p in self.params:
            if cur and size + p.numel() * 4 > self.limit:
                buckets.append(cur)
                cur, size = [], 0
            cur.append(p)
            size += p.numel() * 4
        if cur:
            buckets.append(cur)
        for bk in buckets:
            flat = torch.cat([q.grad.reshape(-1) for q in bk])
            dist.all_reduce(flat)
            flat /= self.n
            off = 0
            for q in bk:
                q.grad.copy_(flat[off:off + q.numel()].view_as(q.grad))
                off += q.numel()


class PerParameterAllReduce:
    """One async all-reduce per parameter as soon as it is ready: no buckets at all."""

    def __init__(self, ctx, model, bucket_mb):
        self.n = ctx.world_size
        self.works = []
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        self.works.append((p, dist.all_reduce(p.grad, async_op=True)))

    def finish(self):
        for p, w in self.works:
            w.wait()
            p.grad /= self.n
        self.works = []


class NoDivide(ForwardOrderBuckets):
    """Sums but forgets to divide by the world size."""

    def finish(self):
        for i, work, flat in self.works:
            work.wait()
            off = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[off:off + q.numel()].view_as(q.grad))
                off += q.numel()
        self._reset()


class NoReset:
    """Works for the first step; never resets the ready counters / work list for the next step."""

    def __init__(self, ctx, model, bucket_mb):
        self.n = ctx.world_size
        limit = bucket_mb * 2 ** 20
        params = [p for p in model.parameters() if p.requires_grad][::-1]
        self.buckets, cur, size = [], [], 0
        for p in params:
            if cur and size + p.numel() * 4 > limit:
                self.buckets.append(cur)
                cur, size = [], 0
            cur.append(p)
            size += p.numel() * 4
        if cur:
            self.buckets.append(cur)
        self.where = {id(p): i for i, bk in enumerate(self.buckets) for p in bk}
        self.count = [0] * len(self.buckets)
        self.works = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        i = self.where[id(p)]
        self.count[i] += 1
        if self.count[i] == len(self.buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.works.append((i, dist.all_reduce(flat, async_op=True), flat))

    def finish(self):
        for i, work, flat in self.works:
            work.wait()
            flat /= self.n
            off = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[off:off + q.numel()].view_as(q.grad))
                off += q.numel()


class FrozenInBucket:
    """Puts frozen parameters in the buckets too (hooks only on trainable ones): a bucket with a frozen
    parameter never completes, so its gradients are never all-reduced."""

    def __init__(self, ctx, model, bucket_mb):
        self.n = ctx.world_size
        limit = bucket_mb * 2 ** 20
        params = list(model.parameters())[::-1]
        self.buckets, cur, size = [], [], 0
        for p in params:
            if cur and size + p.numel() * 4 > limit:
                self.buckets.append(cur)
                cur, size = [], 0
            cur.append(p)
            size += p.numel() * 4
        if cur:
            self.buckets.append(cur)
        self.where = {id(p): i for i, bk in enumerate(self.buckets) for p in bk}
        self.count = [0] * len(self.buckets)
        self.works = []
        for p in params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        i = self.where[id(p)]
        self.count[i] += 1
        if self.count[i] == len(self.buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.works.append((i, dist.all_reduce(flat, async_op=True), flat))

    def finish(self):
        for i, work, flat in self.works:
            work.wait()
            flat /= self.n
            off = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[off:off + q.numel()].view_as(q.grad))
                off += q.numel()
        self.count = [0] * len(self.buckets)
        self.works = []


class OneBigBucket(ForwardOrderBuckets):
    """Ignores bucket_mb: every parameter in one bucket."""

    def __init__(self, ctx, model, bucket_mb):
        super().__init__(ctx, model, 10 ** 9)


class BlockingInHook(ForwardOrderBuckets):
    """Buckets right, but a blocking all-reduce inside the hook (backward waits for every bucket)."""

    def _ready(self, p):
        i = self.where[id(p)]
        self.count[i] += 1
        if self.count[i] == len(self.buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            dist.all_reduce(flat)

            class Done:
                def wait(self_inner):
                    return True
            self.works.append((i, Done(), flat))


class ForgetsCopyBack(ForwardOrderBuckets):
    """Waits and divides the flat buffers, but never copies them back into p.grad (torch.cat made a copy)."""

    def finish(self):
        for i, work, flat in self.works:
            work.wait()
            flat.div_(self.n)
        self._reset()


class WaitsInHook(ForwardOrderBuckets):
    """Review X3: async_op=True, but wait()ed on right away in the hook: blocks the backward like BlockingInHook."""

    def _ready(self, p):
        i = self.where[id(p)]
        self.count[i] += 1
        if self.count[i] == len(self.buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            work = dist.all_reduce(flat, async_op=True)
            work.wait()
            self.works.append((i, work, flat))


WRONG = [
    (AllInFinish, "overlap"),
    (PerParameterAllReduce, "bucket"),
    (NoDivide, "divide"),
    (NoReset, "step"),
    (FrozenInBucket, "frozen"),
    (OneBigBucket, "bucket"),
    (BlockingInHook, "async"),
    (WaitsInHook, "overlap"),
    (ForgetsCopyBack, "copied back"),
]
