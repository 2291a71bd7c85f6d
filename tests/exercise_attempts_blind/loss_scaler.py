"""Blind attempts (blind-b) at loss_scaler: written from the stub and hints only."""
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp, all_reduce


def _grads(optimizer):
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


# correct, unusual: agreement by `from torch.distributed import all_reduce` on a summed count of non-finite grads
class SumOfBadRanks:
    def __init__(self, ctx, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.s, self.up, self.down, self.every = float(init_scale), growth_factor, backoff_factor, growth_interval
        self.good, self.found = 0, False

    def scale(self, loss):
        return loss * self.s

    def step(self, optimizer):
        bad = torch.zeros(1)
        for g in _grads(optimizer):
            g.div_(self.s)
            bad += (~torch.isfinite(g)).any().float()
        all_reduce(bad, op=ReduceOp.SUM)
        self.found = bad.item() > 0
        if not self.found:
            optimizer.step()

    def update(self):
        if self.found:
            self.s *= self.down
            self.good = 0
            return
        self.good += 1
        if self.good == self.every:
            self.s *= self.up
            self.good = 0

    def get_scale(self):
        return self.s


# correct, unusual: agreement by an all-gather of one flag per rank (N elements), state kept as a tensor
class GatheredFlags:
    def __init__(self, ctx, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.ctx = ctx
        self.s = torch.tensor(float(init_scale), dtype=torch.float64)
        self.up, self.down, self.every = growth_factor, backoff_factor, growth_interval
        self.good, self.found = 0, False

    def scale(self, loss):
        return loss * self.s.item()

    def step(self, optimizer):
        grads = _grads(optimizer)
        torch._foreach_div_(grads, self.s.item()) if grads else None
        flag = torch.tensor([0.0 if all(torch.isfinite(g).all() for g in grads) else 1.0])
        flags = torch.empty(self.ctx.world_size)
        dist.all_gather_into_tensor(flags, flag)
        self.found = bool(flags.max() > 0)
        if not self.found:
            optimizer.step()

    def update(self):
        self.good = 0 if self.found else self.good + 1
        if self.found:
            self.s *= self.down
        elif self.good >= self.every:
            self.s *= self.up
            self.good = 0

    def get_scale(self):
        return float(self.s)


# correct, unusual: the ProcessGroup object's own allreduce (dist.group.WORLD.allreduce([flag]).wait())
class ProcessGroupAllreduce(SumOfBadRanks):
    def step(self, optimizer):
        grads = _grads(optimizer)
        for g in grads:
            g.div_(self.s)
        flag = torch.tensor([float(any(not torch.isfinite(g).all() for g in grads))])
        dist.group.WORLD.allreduce([flag]).wait()
        self.found = flag.item() > 0
        if not self.found:
            optimizer.step()


class _Base(SumOfBadRanks):
    def _agree(self, found):
        flag = torch.tensor([float(found)])
        dist.all_reduce(flag, op=ReduceOp.MAX)
        return bool(flag.item())

    def step(self, optimizer):
        grads = _grads(optimizer)
        for g in grads:
            g.div_(self.s)
        self.found = self._agree(any(not torch.isfinite(g).all() for g in grads))
        if not self.found:
            optimizer.step()


# mistake: each rank decides on its own overflow, no agreement, so the ranks step differently
class NoAgreement(_Base):
    def _agree(self, found):
        return found


# mistake (values right, wasteful): one all-reduce per parameter instead of one flag per step
class OneCollectivePerParameter(_Base):
    def step(self, optimizer):
        found = False
        for g in _grads(optimizer):
            g.div_(self.s)
            flag = torch.tensor([float(not torch.isfinite(g).all())])
            dist.all_reduce(flag, op=ReduceOp.MAX)
            found = found or flag.item() > 0
        self.found = found
        if not found:
            optimizer.step()


# mistake: never resets the count after growing, so it grows every step after the first interval
class NoCountReset(_Base):
    def update(self):
        if self.found:
            self.s *= self.down
            self.good = 0
        else:
            self.good += 1
            if self.good >= self.every:
                self.s *= self.up


# mistake: grows one step late (after growth_interval + 1 good steps: `>` instead of `==`)
class GrowsOneLate(_Base):
    def update(self):
        if self.found:
            self.s *= self.down
            self.good = 0
            return
        self.good += 1
        if self.good > self.every:
            self.s *= self.up
            self.good = 0


# mistake: forgets to unscale the gradients before the step
class NoUnscale(_Base):
    def step(self, optimizer):
        grads = _grads(optimizer)
        self.found = self._agree(any(not torch.isfinite(g).all() for g in grads))
        if not self.found:
            optimizer.step()


# mistake: steps even after an overflow (only the scale is backed off)
class StepsOnOverflow(_Base):
    def step(self, optimizer):
        grads = _grads(optimizer)
        for g in grads:
            g.div_(self.s)
        self.found = self._agree(any(not torch.isfinite(g).all() for g in grads))
        optimizer.step()


# mistake (raises): update takes found_inf as an argument (wrong signature)
class UpdateTakesFlag(_Base):
    def update(self, found_inf):
        self.found = found_inf
        super().update()


CORRECT = [SumOfBadRanks, GatheredFlags, ProcessGroupAllreduce]
WRONG = [
    (NoAgreement, ("agree", "every rank", "all ranks", "one rank")),
    (OneCollectivePerParameter, ("one collective", "collectives", "per parameter", "one flag")),
    (NoCountReset, ("count", "reset", "growth_interval")),
    (GrowsOneLate, ("growth_interval", "in a row", "one step late", "off by one")),
    (NoUnscale, ("unscale", "divide")),
    (StepsOnOverflow, ("skip", "overflow")),
    (UpdateTakesFlag, ("argument", "typeerror", "positional")),
]
