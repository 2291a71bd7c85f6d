"""Attempts for DynamicLossScaler(ctx, init_scale, growth_factor, backoff_factor, growth_interval):
scale / step / update / get_scale with GradScaler's rules, the overflow agreed by every rank with
one small collective per step."""
import math

import torch
import torch.distributed as dist


def _grads(optimizer):
    return [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]


class _Base:
    def __init__(self, ctx, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.s, self.gf, self.bf, self.gi = float(init_scale), growth_factor, backoff_factor, growth_interval
        self.good, self.bad = 0, False

    def scale(self, loss):
        return loss * self.s

    def update(self):
        if self.bad:
            self.s *= self.bf
            self.good = 0
        else:
            self.good += 1
            if self.good >= self.gi:
                self.s *= self.gf
                self.good = 0

    def get_scale(self):
        return self.s


# ---------------------------------------------------------------- correct
class SumOfIntFlags(_Base):
    """An int64 flag summed over ranks; unscale by multiplying with the inverse."""
    def step(self, optimizer):
        grads = _grads(optimizer)
        inv = 1.0 / self.s
        bad = 0
        for g in grads:
            g.mul_(inv)
            bad |= int(not bool(torch.isfinite(g).all()))
        flag = torch.tensor([bad], dtype=torch.int64)
        dist.all_reduce(flag)
        self.bad = flag.item() > 0
        if not self.bad:
            optimizer.step()


class GatheredFlags(_Base):
    """Every rank's flag gathered (one all_gather of one element each), then any()."""
    def step(self, optimizer):
        grads = _grads(optimizer)
        for g in grads:
            g.div_(self.s)
        mine = torch.tensor([float(any(torch.isnan(g).any() or torch.isinf(g).any() for g in grads))])
        flags = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(flags, mine)
        self.bad = any(f.item() for f in flags)
        if not self.bad:
            optimizer.step()


class CountsStepsSinceOverflow:
    """Another bookkeeping: the scale is recomputed from the steps since the last overflow."""
    def __init__(self, ctx, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.value, self.growth, self.backoff, self.every = init_scale, growth_factor, backoff_factor, growth_interval
        self.since, self.found = 0, False

    def scale(self, loss):
        return self.value * loss

    def step(self, optimizer):
        total = torch.zeros(1)
        for g in _grads(optimizer):
            g /= self.value
            total += g.float().sum()   # inf or NaN anywhere makes the sum non-finite
        dist.all_reduce(total)
        self.found = not math.isfinite(total.item())
        if not self.found:
            optimizer.step()

    def update(self):
        if self.found:
            self.value, self.since = self.value * self.backoff, 0
            return
        self.since += 1
        if self.since % self.every == 0:
            self.value *= self.growth

    def get_scale(self):
        return float(self.value)


CORRECT = [SumOfIntFlags, GatheredFlags, CountsStepsSinceOverflow]


# ---------------------------------------------------------------- wrong
class DecidesAlone(_Base):
    """Each rank looks at its own gradients only."""
    def step(self, optimizer):
        grads = _grads(optimizer)
        for g in grads:
            g.div_(self.s)
        self.bad = any(not torch.isfinite(g).all() for g in grads)
        if not self.bad:
            optimizer.step()


class NeverUnscales(_Base):
    """Agrees on the overflow but steps on the scaled gradients."""
    def step(self, optimizer):
        grads = _grads(optimizer)
        flag = torch.tensor([float(any(not torch.isfinite(g).all() for g in grads))])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.bad = bool(flag.item())
        if not self.bad:
            optimizer.step()


class CountNotReset(_Base):
    """The count of good steps is not reset after an overflow."""
    def step(self, optimizer):
        SumOfIntFlags.step(self, optimizer)

    def update(self):
        if self.bad:
            self.s *= self.bf
        else:
            self.good += 1
            if self.good == self.gi:
                self.s *= self.gf
                self.good = 0


class StepsAnyway(_Base):
    """Backs off on an overflow but still calls optimizer.step()."""
    def step(self, optimizer):
        SumOfIntFlags.step(self, optimizer)
        if self.bad:
            optimizer.step()


class FlagPerParameter(_Base):
    """Correct, but one all-reduce per gradient tensor: more collectives than one flag."""
    def step(self, optimizer):
        bad = False
        for g in _grads(optimizer):
            g.div_(self.s)
            flag = torch.tensor([float(not torch.isfinite(g).all())])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            bad = bad or bool(flag.item())
        self.bad = bad
        if not bad:
            optimizer.step()


class AllReducesTheGradients(_Base):
    """Correct, but all-reduces a copy of every gradient to look for inf: bytes for a bit."""
    def step(self, optimizer):
        grads = _grads(optimizer)
        for g in grads:
            g.div_(self.s)
        copy = torch.cat([g.reshape(-1) for g in grads]).abs()
        dist.all_reduce(copy, op=dist.ReduceOp.MAX)
        self.bad = not bool(torch.isfinite(copy).all())
        if not self.bad:
            optimizer.step()


class GrowsEveryStep(_Base):
    """Doubles after every good step, ignoring growth_interval."""
    def step(self, optimizer):
        SumOfIntFlags.step(self, optimizer)

    def update(self):
        self.s = self.s * self.bf if self.bad else self.s * self.gf


WRONG = [
    (DecidesAlone, "decided from its own"),
    (NeverUnscales, "unscale"),
    (CountNotReset, "count again from 0"),
    (StepsAnyway, "skip optimizer.step()"),
    (FlagPerParameter, "one found_inf"),
    (AllReducesTheGradients, "one found_inf"),
    (GrowsEveryStep, "growth_interval good steps"),
]
