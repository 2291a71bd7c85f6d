"""Blind attempts (blind-b) at expert_parallel_moe: written from the stub and hints only."""
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnnf
import torch.nn.functional as F


class _AllToAll(torch.autograd.Function):
    """Equal blocks along dimension 0: the reverse exchange is the same exchange."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad)


def _route(x, router, e, k, cap, choice_major=True, keep_equal_cap=False, renormalise=False, topk_first=False):
    """(expert, slot, token, weight) of the kept (token, choice) pairs."""
    logits = router(x)
    if topk_first:
        top, idx = logits.topk(k, dim=-1)
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, top)
    probs = F.softmax(logits, dim=-1)
    w, chosen = probs.topk(k, dim=-1)                       # [t, k]
    if renormalise:
        w = w / w.sum(-1, keepdim=True)
    t = x.shape[0]
    if choice_major:
        ex, tok, wt = chosen.t().reshape(-1), torch.arange(t).repeat(k), w.t().reshape(-1)
    else:
        ex, tok, wt = chosen.reshape(-1), torch.arange(t).repeat_interleave(k), w.reshape(-1)
    hot = F.one_hot(ex, e)
    slot = (hot.cumsum(0) * hot).sum(-1) - 1
    keep = slot <= cap if keep_equal_cap else slot < cap
    return ex[keep], slot[keep], tok[keep], wt[keep]


class _Base:
    def __init__(self, ctx, router, experts, num_experts, top_k, capacity):
        self.ctx, self.router, self.experts = ctx, router, experts
        self.e, self.k, self.cap = num_experts, top_k, capacity
        self.n = ctx.world_size
        self.route_kw = {}

    def _send(self, buf):
        return _AllToAll.apply(buf)

    def _run_experts(self, got):
        # got: [N, E/N, cap, h] — row i came from rank i
        n, per, cap, h = got.shape
        return torch.stack([self.experts[j](got[:, j].reshape(n * cap, h)).view(n, cap, h) for j in range(per)], 1)

    def forward(self, x):
        h = x.shape[-1]
        ex, slot, tok, wt = _route(x, self.router, self.e, self.k, self.cap, **self.route_kw)
        buf = x.new_zeros(self.e, self.cap, h).index_put((ex, slot), x[tok])
        got = self._send(buf).view(self.n, self.e // self.n, self.cap, h)
        back = _AllToAll.apply(self._run_experts(got)).view(self.e, self.cap, h)
        return x.new_zeros(x.shape).index_add(0, tok, back[ex, slot] * wt[:, None])

    def _expert_grads(self):
        return [p.grad for p in self.experts.parameters() if p.grad is not None]

    def synchronize_gradients(self):
        for g in self._expert_grads():
            g.div_(self.n)
        for p in self.router.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(self.n)


# correct, unusual: an autograd Function around all_to_all_single, router grads flattened into ONE all-reduce
class OneFlatRouterAllReduce(_Base):
    def synchronize_gradients(self):
        for g in self._expert_grads():
            g.div_(self.n)
        params = [p for p in self.router.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= self.n
        i = 0
        for p in params:
            p.grad.copy_(flat[i:i + p.numel()].view_as(p))
            i += p.numel()


# correct, unusual: torch's differentiable dnnf.all_to_all_single, slots by a Python loop, ctx.comm avg
class TorchNnAllToAll(_Base):
    def forward(self, x):
        t, h = x.shape
        w, chosen = F.softmax(self.router(x), dim=-1).topk(self.k, dim=-1)
        used, kept = [0] * self.e, []
        for c in range(self.k):
            for i in range(t):
                e = int(chosen[i, c])
                if used[e] < self.cap:
                    kept.append((i, c, e, used[e]))
                used[e] += 1
        tok = torch.tensor([a[0] for a in kept], dtype=torch.long)
        ch = torch.tensor([a[1] for a in kept], dtype=torch.long)
        ex = torch.tensor([a[2] for a in kept], dtype=torch.long)
        sl = torch.tensor([a[3] for a in kept], dtype=torch.long)
        buf = x.new_zeros(self.e, self.cap, h).index_put((ex, sl), x[tok])
        got = dnnf.all_to_all_single(torch.empty_like(buf), buf.contiguous()).view(self.n, self.e // self.n, self.cap, h)
        done = self._run_experts(got).contiguous()
        back = dnnf.all_to_all_single(torch.empty_like(done), done).view(self.e, self.cap, h)
        return x.new_zeros(x.shape).index_add(0, tok, back[ex, sl] * w[tok, ch][:, None])

    def synchronize_gradients(self):
        for g in self._expert_grads():
            g.div_(self.n)
        for p in self.router.parameters():
            if p.grad is not None:
                self.ctx.comm.all_reduce(p.grad, op="avg")


# mistake: expert gradients not divided by N (they already sum every rank's loss)
class ExpertsNotDivided(_Base):
    def synchronize_gradients(self):
        for p in self.router.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(self.n)


# mistake: the router's gradient is never all-reduced (each rank keeps its own)
class RouterNotReduced(_Base):
    def synchronize_gradients(self):
        for g in self._expert_grads():
            g.div_(self.n)
        for p in self.router.parameters():
            if p.grad is not None:
                p.grad.div_(self.n)


# mistake: slots given token-major (token 0's second choice before token 1's first)
class TokenMajorSlots(_Base):
    def __init__(self, *a):
        super().__init__(*a)
        self.route_kw = {"choice_major": False}


# mistake: the chosen probabilities renormalised to sum to 1 (mpkit's MoE does not)
class Renormalised(_Base):
    def __init__(self, *a):
        super().__init__(*a)
        self.route_kw = {"renormalise": True}


# mistake: top-k of the logits first, softmax over only the k chosen (Mixtral's order), not softmax over all E
class TopkThenSoftmax(_Base):
    def __init__(self, *a):
        super().__init__(*a)
        self.route_kw = {"topk_first": True}


# mistake (values right, wasteful): dispatch by all-gathering every rank's whole buffer
class AllGatherDispatch(_Base):
    def _send(self, buf):
        r, per = self.ctx.rank, self.e // self.n
        every = torch.stack(dnnf.all_gather(buf.contiguous()))          # [N, E, cap, h]
        mine = every[:, r * per:(r + 1) * per]                          # [N, E/N, cap, h]
        return mine.reshape(self.e, self.cap, -1)


# mistake (raises): keeps slot == capacity too, an index past the buffer
class OffByOneCapacity(_Base):
    def __init__(self, *a):
        super().__init__(*a)
        self.route_kw = {"keep_equal_cap": True}


CORRECT = [OneFlatRouterAllReduce, TorchNnAllToAll]
WRONG = [
    (ExpertsNotDivided, ("1/n", "÷ n", "divide", "divided")),
    (RouterNotReduced, ("router", "all-reduce")),
    (TokenMajorSlots, ("first choice", "choice-major", "choices", "second choice")),
    (Renormalised, ("renormal", "sum to 1", "normalis", "normaliz")),
    (TopkThenSoftmax, ("softmax", "all e", "every expert", "probabilit")),
    (AllGatherDispatch, ("all-gather", "all_gather", "bytes")),
    (OffByOneCapacity, ("capacity", "out of bounds", "index")),
]
