"""Attempts for expert_parallel_moe: the class ExpertParallelMoE(ctx, router, experts, num_experts, top_k,
capacity) with forward(x) and synchronize_gradients()."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


class _Exchange(torch.autograd.Function):
    """all_to_all_single on dimension 0, backward the same exchange back."""

    @staticmethod
    def forward(ctx, x):
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous())
        return out


class _ListExchange(torch.autograd.Function):
    """The list form: block j of dimension 0 to rank j."""

    @staticmethod
    def forward(ctx, x):
        n = dist.get_world_size()
        send = [t.contiguous() for t in x.chunk(n)]
        recv = [torch.empty_like(t) for t in send]
        dist.all_to_all(recv, send)
        return torch.cat(recv)

    @staticmethod
    def backward(ctx, grad):
        return _ListExchange.apply(grad)


def _slots(chosen, num_experts, capacity, token_major=False):
    """(token, choice index, expert, slot) of every kept choice, slots handed out in a Python loop."""
    t, k = chosen.shape
    order = [(i, j) for i in range(t) for j in range(k)] if token_major else [(i, j) for j in range(k) for i in range(t)]
    used, kept = [0] * num_experts, []
    for i, j in order:
        e = int(chosen[i, j])
        if used[e] < capacity:
            kept.append((i, j, e, used[e]))
        used[e] += 1
    return kept


class _Base:
    exchange = _Exchange
    token_major = False
    per_expert = False

    def __init__(self, ctx, router, experts, num_experts, top_k, capacity):
        self.ctx, self.router, self.experts = ctx, router, experts
        self.e, self.k, self.cap = num_experts, top_k, capacity

    def _capacity(self, t):
        return self.cap

    def forward(self, x):
        n, e = self.ctx.world_size, self.e
        cap = self._capacity(len(x))
        probs = F.softmax(self.router(x), dim=-1)
        weights, chosen = probs.topk(self.k, dim=-1)
        kept = _slots(chosen, e, cap, self.token_major)
        rows = [torch.zeros(x.shape[1]) for _ in range(e * cap)]
        for i, _, ex, s in kept:
            rows[ex * cap + s] = x[i]
        buffer = torch.stack(rows).view(e, cap, -1)
        arrived = self._send(buffer).view(n, e // n, cap, -1)
        outs = []
        for j, expert in enumerate(self.experts):
            outs.append(expert(arrived[:, j].reshape(n * cap, -1)).view(n, cap, -1))
        back = self._send(torch.stack(outs, 1).reshape(e, cap, -1))
        y = [torch.zeros(x.shape[1]) for _ in range(len(x))]
        for i, j, ex, s in kept:
            y[i] = y[i] + weights[i, j] * back[ex, s]
        return torch.stack(y)

    def _send(self, buffer):
        if not self.per_expert:
            return self.exchange.apply(buffer)
        n, e = self.ctx.world_size, self.e   # one exchange per local expert slot: E/N all-to-alls
        parts = [self.exchange.apply(buffer.view(n, e // n, *buffer.shape[1:])[:, j].contiguous()) for j in range(e // n)]
        return torch.stack(parts, 1).view(buffer.shape)

    def synchronize_gradients(self):
        n = self.ctx.world_size
        for p in self.experts.parameters():
            if p.grad is not None:
                p.grad.div_(n)
        flat = torch.cat([p.grad.reshape(-1) for p in self.router.parameters()])
        dist.all_reduce(flat)
        flat /= n
        offset = 0
        for p in self.router.parameters():
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


# ---------------------------------------------------------------- correct
class LoopRouting(_Base):
    """Slots and the combine in Python loops; the router's gradient averaged in one flat all-reduce."""


class OneHotCombine:
    """Dispatch and combine as one-hot matrices (GShard's einsums by hand), the list form of all_to_all."""

    def __init__(self, ctx, router, experts, num_experts, top_k, capacity):
        self.ctx, self.router, self.experts, self.e, self.k, self.cap = ctx, router, experts, num_experts, top_k, capacity

    def forward(self, x):
        n, e, cap, t = self.ctx.world_size, self.e, self.cap, len(x)
        weights, chosen = F.softmax(self.router(x), dim=-1).topk(self.k, dim=-1)
        hot = F.one_hot(chosen.t().reshape(-1), e).float()            # [k·t, e], choice-major
        place = (hot.cumsum(0) - 1) * hot                                # slot in the expert's queue
        slot_hot = F.one_hot(place.sum(1).long(), max(cap, int(place.max()) + 1))[:, :cap].float() * \
            (place.sum(1) < cap).float()[:, None]
        dispatch = torch.einsum("qe,qc->qec", hot, slot_hot)             # [k·t, e, cap]
        tokens = x.repeat(self.k, 1)
        buffer = torch.einsum("qec,qh->ech", dispatch, tokens)
        arrived = _ListExchange.apply(buffer).view(n, e // n, cap, -1)
        done = torch.stack([ex(arrived[:, j].reshape(n * cap, -1)).view(n, cap, -1) for j, ex in enumerate(self.experts)], 1)
        back = _ListExchange.apply(done.reshape(e, cap, -1))
        combined = torch.einsum("qec,ech->qh", dispatch * weights.t().reshape(-1)[:, None, None], back)
        return combined.view(self.k, t, -1).sum(0)

    def synchronize_gradients(self):
        for p in self.experts.parameters():
            p.grad = p.grad / self.ctx.world_size
        for p in self.router.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.mul_(1.0 / self.ctx.world_size)


CORRECT = [LoopRouting, OneHotCombine]


# ---------------------------------------------------------------- wrong
class ForgetsOneOverN(_Base):
    """The experts' gradients left as the all-to-all brought them (N x too large)."""

    def synchronize_gradients(self):
        n = self.ctx.world_size
        for p in self.router.parameters():
            dist.all_reduce(p.grad)
            p.grad /= n


class AllReducesExperts(_Base):
    """Treats the experts like replicated parameters: all-reduce and average."""

    def synchronize_gradients(self):
        n = self.ctx.world_size
        for p in [*self.experts.parameters(), *self.router.parameters()]:
            dist.all_reduce(p.grad)
            p.grad /= n


class RouterNotAveraged(_Base):
    """Divides the experts by N but leaves the router with this rank's gradient."""

    def synchronize_gradients(self):
        for p in self.experts.parameters():
            p.grad /= self.ctx.world_size


class NoCapacity(_Base):
    """Ignores the capacity: a buffer big enough for every token (more bytes too), nothing dropped."""

    def _capacity(self, t):
        return t


class TokenMajorSlots(_Base):
    """Hands out slots token by token (both choices of token 0, then token 1 ...) instead of first choices first."""
    token_major = True


class OneExchangePerExpert(_Base):
    """Right values, but one all-to-all per local expert in each direction (more messages than two)."""
    per_expert = True


WRONG = [
    (ForgetsOneOverN, "1/n is missing"),
    (AllReducesExperts, "expert gradients were all-reduced"),
    (RouterNotAveraged, "router's gradient is this rank's"),
    (NoCapacity, "no token was dropped"),
    (TokenMajorSlots, "every first choice"),
    (OneExchangePerExpert, "two all-to-alls per direction"),
]
