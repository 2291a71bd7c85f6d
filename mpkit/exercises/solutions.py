"""Reference solutions, written as a learner would: what the tests fill into the labs' stubs and
into nbgrader's solution regions. They ship with the package (as the quiz keys do) but never
appear in a student's notebook."""
import ast
import inspect
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpkit.parallel.pipeline.schedules import (Backward, BackwardInput, BackwardWeight, Forward, OptimizerStep,
                                               RecvAct, RecvGrad, SendAct, SendGrad)


def ring_reduce_scatter(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    chunks = tensor.detach().clone().reshape(-1).tensor_split(n)
    for k in range(n - 1):
        send, into = chunks[(r - k - 1) % n], chunks[(r - k - 2) % n]
        incoming = torch.empty_like(into)
        works = [dist.isend(send.contiguous(), (r + 1) % n), dist.irecv(incoming, (r - 1) % n)]
        for work in works:
            work.wait()
        into += incoming
    return chunks[r].clone()


def ring_all_gather(ctx, piece):
    n, r = ctx.world_size, ctx.rank
    out = torch.empty(n * piece.numel(), dtype=piece.dtype)
    slots = out.split(piece.numel())
    slots[r].copy_(piece.reshape(-1))
    for k in range(n - 1):
        works = [dist.isend(slots[(r - k) % n].clone(), (r + 1) % n), dist.irecv(slots[(r - k - 1) % n], (r - 1) % n)]
        for work in works:
            work.wait()
    return out


def ring_all_reduce(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    chunks = tensor.view(-1).tensor_split(n)

    def exchange(send, into, add):
        incoming = torch.empty_like(into)
        works = [dist.isend(send.clone(), (r + 1) % n), dist.irecv(incoming, (r - 1) % n)]
        for work in works:
            work.wait()
        if add:
            into += incoming
        else:
            into.copy_(incoming)

    for k in range(n - 1):  # reduce-scatter: chunk (r+1) ends complete
        exchange(chunks[(r - k) % n], chunks[(r - k - 1) % n], add=True)
    for k in range(n - 1):  # all-gather: pass the complete chunks on
        exchange(chunks[(r + 1 - k) % n], chunks[(r - k) % n], add=False)
    return tensor


def halving_doubling_all_reduce(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    if n & (n - 1):
        raise ValueError(f"halving-doubling needs a power-of-two number of ranks; got {n}")
    flat = tensor.view(-1)

    def exchange(send, into, peer, add):
        incoming = torch.empty_like(into)
        works = [dist.isend(send.clone(), peer), dist.irecv(incoming, peer)]
        for work in works:
            work.wait()
        if add:
            into += incoming
        else:
            into.copy_(incoming)

    lo, hi, ranges, d = 0, flat.numel(), [], n // 2
    while d >= 1:  # reduce-scatter: give half of [lo, hi) away, sum the other half
        mid, peer = (lo + hi) // 2, r ^ d
        keep, give = ((lo, mid), (mid, hi)) if r < peer else ((mid, hi), (lo, mid))
        exchange(flat[give[0]:give[1]], flat[keep[0]:keep[1]], peer, add=True)
        ranges.append((lo, hi, peer))
        (lo, hi), d = keep, d // 2
    for outer_lo, outer_hi, peer in reversed(ranges):  # all-gather: the same pairs, backwards
        other = (hi, outer_hi) if lo == outer_lo else (outer_lo, lo)
        exchange(flat[lo:hi], flat[other[0]:other[1]], peer, add=False)
        lo, hi = outer_lo, outer_hi
    return tensor


def average_gradients(ctx, model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size


class BucketedGradientSync:
    def __init__(self, ctx, model, bucket_mb):
        self.world_size = ctx.world_size
        limit = bucket_mb * 2**20
        self.buckets, size = [[]], 0
        for p in reversed([p for p in model.parameters() if p.requires_grad]):  # backward order
            if self.buckets[-1] and size + p.numel() * 4 > limit:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * 4
        self.bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready, self.pending = [0] * len(self.buckets), []
        for p in self.bucket_of:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, p):
        i = self.bucket_of[p]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for i, flat, work in self.pending:
            work.wait()
            flat /= self.world_size
            offset = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
                offset += q.numel()
        self.ready, self.pending = [0] * len(self.buckets), []


def accumulate_gradients(ctx, ddp, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        loss = F.cross_entropy(ddp(x), y) * (len(y) / total)  # per token: weight by the micro-batch's tokens
        if i < len(micro_batches) - 1:
            with ddp.no_sync():
                loss.backward()
        else:
            loss.backward()
    ddp.finish_gradient_synchronization()


def layerwise_step(ctx, stage, x, y, loss_fn, act_shape):
    r, last = ctx.rank, ctx.world_size - 1
    if r == 0:
        a = x
    else:
        a = torch.empty(act_shape)
        dist.recv(a, r - 1)
        a.requires_grad_()
    out = stage(a)
    loss = None
    if r == last:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), r + 1)
        grad = torch.empty(act_shape)
        dist.recv(grad, r + 1)
        out.backward(grad)
    if r > 0:
        dist.send(a.grad, r - 1)
    return loss


def balanced_stages(layer_parameters, ranks, optimizer):
    def needed(limit):  # ranks used when each takes layers from the front until the next would pass limit
        count, total = 1, 0
        for size in layer_parameters:
            count, total = (count + 1, size) if total + size > limit else (count, total + size)
        return count

    lo, hi = max(layer_parameters), sum(layer_parameters)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if needed(mid) <= ranks else (mid + 1, hi)
    stages, start, n = [], 0, len(layer_parameters)
    for r in range(ranks):
        end, total = start + 1, layer_parameters[start]
        while end < n - (ranks - r - 1) and total + layer_parameters[end] <= lo:  # leave a layer for every later rank
            total += layer_parameters[end]
            end += 1
        stages.append(list(range(start, end)))
        start = end
    per = 4 + 4 + (8 if optimizer == "adam" else 0)  # weight, gradient, Adam's two moments (fp32)
    return stages, [sum(layer_parameters[i] for i in stage) * per for stage in stages]


class CopyToParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


def megatron_mlp(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.linear(f(x), up_weight, up_bias)
    return g(F.linear(F.gelu(h), down_weight)) + down_bias


def gpipe_schedule(rank, p, m):
    program = []
    for mb in range(m):
        program += [RecvAct(mb, rank, rank - 1)] if rank > 0 else []
        program += [Forward(mb, rank)] + ([SendAct(mb, rank, rank + 1)] if rank < p - 1 else [])
    for mb in range(m):
        program += [RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []
        program += [Backward(mb, rank)] + ([SendGrad(mb, rank, rank - 1)] if rank > 0 else [])
    return program + [OptimizerStep()]


def one_f_one_b_schedule(rank, p, m):
    warmup = min(p - rank - 1, m)
    order = [("F", k) for k in range(warmup)]
    for k in range(m - warmup):
        order += [("F", warmup + k), ("B", k)]
    order += [("B", k) for k in range(m - warmup, m)]
    program = []
    for kind, mb in order:
        if kind == "F":
            program += [RecvAct(mb, rank, rank - 1)] if rank > 0 else []
            program += [Forward(mb, rank)] + ([SendAct(mb, rank, rank + 1)] if rank < p - 1 else [])
        else:
            program += [RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []
            program += [Backward(mb, rank)] + ([SendGrad(mb, rank, rank - 1)] if rank > 0 else [])
    return program + [OptimizerStep()]


def zb_h1_schedule(rank, p, m):
    warmup = min(p - rank - 1, m)
    order, deferred = [("F", k) for k in range(warmup)], []

    def backward(k):  # B now; its W waits while this rank may still hold it (rank r: up to r pending)
        order.append(("B", k))
        deferred.append(k)
        if len(deferred) > rank:
            order.append(("W", deferred.pop(0)))
    for k in range(m - warmup):
        order.append(("F", warmup + k))
        backward(k)
    for k in range(m - warmup, m):
        backward(k)
    order += [("W", k) for k in deferred]
    program = []
    for kind, mb in order:
        if kind == "F":
            program += [RecvAct(mb, rank, rank - 1)] if rank > 0 else []
            program += [Forward(mb, rank)] + ([SendAct(mb, rank, rank + 1)] if rank < p - 1 else [])
        elif kind == "B":
            program += [RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []
            program += [BackwardInput(mb, rank)] + ([SendGrad(mb, rank, rank - 1)] if rank > 0 else [])
        else:
            program.append(BackwardWeight(mb, rank))
    return program + [OptimizerStep()]


def interleaved_schedule(rank, p, m):
    v = 2
    last = v * p - 1

    def chunk_and_mb(k, backward):  # micro-batches go round in groups of p, chunk by chunk
        chunk = (k // p) % v
        return (v - 1 - chunk if backward else chunk) * p + rank, (k // (p * v)) * p + k % p

    def forward(k):
        stage, mb = chunk_and_mb(k, False)
        return (([RecvAct(mb, stage, (stage - 1) % p)] if stage > 0 else []) + [Forward(mb, stage)]
                + ([SendAct(mb, stage, (stage + 1) % p)] if stage < last else []))

    def backward(k):
        stage, mb = chunk_and_mb(k, True)
        return (([RecvGrad(mb, stage, (stage + 1) % p)] if stage < last else []) + [Backward(mb, stage)]
                + ([SendGrad(mb, stage, (stage - 1) % p)] if stage > 0 else []))
    total = v * m
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    program = [ins for k in range(warmup) for ins in forward(k)]
    for k in range(total - warmup):
        program += forward(warmup + k) + backward(k)
    for k in range(total - warmup, total):
        program += backward(k)
    return program + [OptimizerStep()]


def zero1_step(ctx, params, grad, optimizer):
    n, r = ctx.world_size, ctx.rank
    sizes = [len(piece) for piece in params.tensor_split(n)]
    width = max(sizes)

    def padded(flat):  # equal pieces of ``width`` elements, as reduce_scatter_tensor wants
        out = torch.zeros(n * width)
        for i, piece in enumerate(flat.tensor_split(n)):
            out[i * width:i * width + len(piece)] = piece
        return out

    shard_grad = torch.empty(width)
    dist.reduce_scatter_tensor(shard_grad, padded(grad))
    shard_grad /= n
    start = sum(sizes[:r])
    optimizer.step(start, params[start:start + sizes[r]], shard_grad[:sizes[r]])
    gathered = torch.empty(n * width)
    dist.all_gather_into_tensor(gathered, padded(params)[r * width:(r + 1) * width].contiguous())
    params.copy_(torch.cat([gathered[i * width:i * width + sizes[i]] for i in range(n)]))


class FSDPLinear(torch.autograd.Function):
    @staticmethod
    def gather(shard, unit):
        flat = torch.empty(unit.world_size * shard.numel())
        dist.all_gather_into_tensor(flat, shard.detach().contiguous())
        out_features, in_features = unit.shape
        return flat[:out_features * in_features].view(unit.shape), flat[out_features * in_features:unit.numel]

    @staticmethod
    def forward(ctx, x, shard, unit):
        weight, bias = FSDPLinear.gather(shard, unit)
        ctx.save_for_backward(x, shard)  # not the full parameters: they go when forward returns
        ctx.unit = unit
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        weight, _ = FSDPLinear.gather(shard, unit)  # gathered again for the input gradient
        grad_x = grad_out @ weight
        flat = torch.zeros(unit.world_size * shard.numel())
        flat[:unit.numel] = torch.cat([(grad_out.t() @ x).reshape(-1), grad_out.sum(0)])
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_tensor(grad_shard, flat)
        return grad_x, grad_shard / unit.world_size, None


class DynamicLossScaler:
    def scale(self, loss):
        return loss * self.value

    def __init__(self, ctx, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.value, self.growth, self.backoff = float(init_scale), growth_factor, backoff_factor
        self.interval, self.good, self.found_inf = growth_interval, 0, False

    def step(self, optimizer):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        for g in grads:
            g.div_(self.value)
        flag = torch.tensor([float(any(not torch.isfinite(g).all() for g in grads))])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the ranks hold different gradients: agree
        self.found_inf = bool(flag.item())
        if not self.found_inf:
            optimizer.step()

    def update(self):
        if self.found_inf:
            self.value, self.good = self.value * self.backoff, 0
        else:
            self.good += 1
            if self.good == self.interval:
                self.value, self.good = self.value * self.growth, 0

    def get_scale(self):
        return self.value


def checkpoint_block(block, x):
    class Checkpoint(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *params):  # the parameters as inputs: the output needs grad even when x does not
            ctx.rng = torch.get_rng_state()
            ctx.save_for_backward(x)
            with torch.no_grad():
                return block(x)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                torch.set_rng_state(ctx.rng)  # dropout draws the forward's mask again
                again = x.detach().requires_grad_(x.requires_grad)
                out = block(again)
                torch.autograd.backward(out, grad)
            return (again.grad,) + (None,) * len(params)

    params = [p for p in block.parameters() if p.requires_grad]
    return Checkpoint.apply(x, *params)


def rank_coordinates(rank, dp, pp, tp):
    rest, tp_index = divmod(rank, tp)
    dp_index, pp_index = divmod(rest, pp)
    return dp_index, pp_index, tp_index


def process_groups(dp, pp, tp):
    groups = {"dp": {}, "pp": {}, "tp": {}}
    for rank in range(dp * pp * tp):  # tp innermost, dp outermost (its own cell: no other exercise's function)
        coords = {"dp": rank // (pp * tp), "pp": rank // tp % pp, "tp": rank % tp}
        for dim in groups:
            key = tuple(v for d, v in coords.items() if d != dim)
            groups[dim].setdefault(key, []).append(rank)
    return {dim: list(found.values()) for dim, found in groups.items()}


def memory_per_gpu(params, dp, pp, tp, zero_stage):
    psi = params / (pp * tp)
    return (2 * psi / (dp if zero_stage >= 3 else 1) + 2 * psi / (dp if zero_stage >= 2 else 1)
            + 12 * psi / (dp if zero_stage >= 1 else 1))


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((dist.get_world_size() * x.shape[0], *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous())  # rank j's shard lands in rows j·s/N ..
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.shape[0] // dist.get_world_size(), *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous())  # the ranks' partial gradients, this rank's tokens
        return out


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((dist.get_world_size() * grad.shape[0], *grad.shape[1:]))
        dist.all_gather_into_tensor(out, grad.contiguous())
        return out


def ring_attention_merge(ctx, q, k, v):
    n, r, c = ctx.world_size, ctx.rank, q.shape[2] // 2

    def positions(rank):  # chunks rank and 2N-1-rank of the 2N chunks
        return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * n - 1 - rank) * c, (2 * n - rank) * c)])

    def finite(t):  # -inf (a query that saw no key yet) as 0, so exp(s - lse) stays 0 and never NaN
        return torch.where(torch.isinf(t), torch.zeros_like(t), t)

    mine, scaled = positions(r), q.float() * q.shape[-1] ** -0.5
    out, lse = torch.zeros(scaled.shape), torch.full(scaled.shape[:-1], float("-inf"))  # fp32 statistics
    kv = torch.stack([k, v])
    for step in range(n):
        if step < n - 1:  # pass the block on while this one is computed
            arriving = torch.empty_like(kv)
            hops = [dist.isend(kv, (r + 1) % n), dist.irecv(arriving, (r - 1) % n)]
        seen = mine[:, None] >= positions((r - step) % n)[None, :]  # the owner of kv is rank r - step
        if seen.any():
            s = (scaled @ kv[0].float().transpose(-2, -1)).masked_fill(~seen, float("-inf"))
            block_lse = s.logsumexp(-1)
            block_out = torch.exp(s - finite(block_lse)[..., None]) @ kv[1].float()
            new = torch.logaddexp(lse, block_lse)
            out = (torch.exp(lse - finite(new))[..., None] * out
                   + torch.exp(block_lse - finite(new))[..., None] * block_out)
            lse = new
        if step < n - 1:
            for hop in hops:
                hop.wait()
            kv = arriving
    return out.to(q.dtype), lse


def ulysses_head_swap(ctx, q, k, v):
    n = ctx.world_size

    def exchange(x, scatter_dim, gather_dim):  # block j of scatter_dim to rank j; received blocks joined in rank order
        send = torch.stack(x.chunk(n, dim=scatter_dim)).contiguous()
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send)
        return torch.cat(received.unbind(0), dim=gather_dim)

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(fctx, x, scatter_dim, gather_dim):
            fctx.dims = (scatter_dim, gather_dim)
            return exchange(x, scatter_dim, gather_dim)

        @staticmethod
        def backward(fctx, grad):  # every gradient block goes back to the rank its values came from
            scatter_dim, gather_dim = fctx.dims
            return exchange(grad, gather_dim, scatter_dim), None, None

    q, k, v = (AllToAll.apply(t, 1, 2) for t in (q, k, v))  # [b, H, s/N, d] -> [b, H/N, s, d]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return AllToAll.apply(out, 2, 1)  # -> [b, H, s/N, d]


class ExpertParallelMoE:
    class AllToAll(torch.autograd.Function):  # dimension 0 cut in N blocks, block j to rank j; backward: back again
        @staticmethod
        def forward(fctx, x):
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x.contiguous())
            return out

        @staticmethod
        def backward(fctx, grad):
            out = torch.empty_like(grad)
            dist.all_to_all_single(out, grad.contiguous())
            return out

    def __init__(self, ctx, router, experts, num_experts, top_k, capacity):
        self.ctx, self.router, self.experts = ctx, router, experts
        self.num_experts, self.top_k, self.capacity = num_experts, top_k, capacity

    def forward(self, x):
        n, e, cap = self.ctx.world_size, self.num_experts, self.capacity
        weights, chosen = torch.softmax(self.router(x), dim=-1).topk(self.top_k, dim=-1)
        choice = chosen.t().reshape(-1)  # every token's first choice in token order, then the second choices
        token = torch.arange(len(x)).repeat(self.top_k)
        slot = (F.one_hot(choice, e).cumsum(0) - 1)[torch.arange(len(choice)), choice]
        kept = slot < cap  # beyond an expert's capacity the choice is dropped
        buffer = x.new_zeros(e, cap, x.shape[1]).index_put((choice[kept], slot[kept]), x[token[kept]])
        arrived = self.AllToAll.apply(buffer).view(n, e // n, cap, -1)  # [source rank, my expert, slot, h]
        done = torch.stack([expert(arrived[:, j].reshape(n * cap, -1)).view(n, cap, -1)
                            for j, expert in enumerate(self.experts)], dim=1)
        back = self.AllToAll.apply(done.reshape(e, cap, -1))  # [expert, slot, h] on the tokens' rank
        combined = weights.t().reshape(-1)[kept, None] * back[choice[kept], slot[kept]]
        return x.new_zeros(x.shape).index_add(0, token[kept], combined)

    def synchronize_gradients(self):
        n = self.ctx.world_size
        for p in self.experts.parameters():  # they already hold every rank's tokens' gradient: N x the mean's
            if p.grad is not None:
                p.grad /= n
        for p in self.router.parameters():  # replicated, trained on this rank's tokens: average as in DP
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= n
def reshard_reads(numel, saved_ranks, new_ranks):
    def bounds(ranks):
        sizes = [len(piece) for piece in torch.empty(numel).tensor_split(ranks)]
        return [(sum(sizes[:r]), sum(sizes[:r + 1])) for r in range(ranks)]

    saved = bounds(saved_ranks)
    return [[(r, max(a, lo), min(b, hi)) for r, (a, b) in enumerate(saved) if max(a, lo) < min(b, hi)]
            for lo, hi in bounds(new_ranks)]


def checkpoint_every(step_seconds, checkpoint_seconds, mtbf_seconds):
    every = max(1, round((2 * checkpoint_seconds * mtbf_seconds) ** 0.5 / step_seconds))
    tau = every * step_seconds
    return every, checkpoint_seconds / tau + tau / (2 * mtbf_seconds)


def definitions(exercise) -> list:
    """The top-level classes and functions that make up ``exercise``'s solution (its ``target``'s names)."""
    names = [n.strip(" ()") for n in exercise.target.split(",")]
    return [getattr(sys.modules[__name__], n) for n in names]


def source(exercise) -> str:
    """The solution of ``exercise`` as code text (what goes into a notebook cell)."""
    return "\n\n".join(inspect.getsource(obj) for obj in definitions(exercise))


def body(obj) -> str:
    """The statements of a function's or class's body after its docstring, as written (indented)."""
    text = inspect.getsource(obj)
    tree = ast.parse(text).body[0]
    statements = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    first = statements[0]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])  # a method's decorators
    return "\n".join(text.splitlines()[start - 1:])
