"""Blind attempts (blind-b) at fsdp_unit: written from the stub and hints only."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import all_reduce


def _gather_list(shard, unit):
    parts = [torch.empty_like(shard) for _ in range(unit.world_size)]
    dist.all_gather(parts, shard.contiguous())
    flat = torch.cat(parts)[: unit.numel]
    out, inp = unit.shape
    return flat[: out * inp].view(out, inp), flat[out * inp:]


def _gather_tensor(shard, unit):
    flat = shard.new_empty(unit.world_size * shard.numel())
    dist.all_gather_into_tensor(flat, shard.contiguous())
    out, inp = unit.shape
    return flat[: out * inp].view(out, inp), flat[out * inp: unit.numel]


def _flat_grads(x, grad_out, w):
    x2, g2 = x.reshape(-1, x.shape[-1]), grad_out.reshape(-1, grad_out.shape[-1])
    grad_x = grad_out @ w
    return grad_x, torch.cat([(g2.t() @ x2).reshape(-1), g2.sum(0)])


def _padded(flat, shard, unit):
    return F.pad(flat, (0, unit.world_size * shard.numel() - flat.numel()))


# correct, unusual: all_gather into a list + torch.cat, and reduce_scatter over a list of chunks
class ListCollectives(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather_list(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, _ = _gather_list(shard, unit)
        grad_x, flat = _flat_grads(x, grad_out, w)
        chunks = list(_padded(flat, shard, unit).chunk(unit.world_size))
        mine = torch.empty_like(shard)
        dist.reduce_scatter(mine, [c.contiguous() for c in chunks])
        return grad_x, mine / unit.world_size, None


# correct, unusual: the backward recomputes F.linear under enable_grad and asks torch.autograd.grad for the gradients
class AutogradGrads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather_tensor(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, b = _gather_tensor(shard, unit)
        with torch.enable_grad():
            xs, ws, bs = (t.detach().requires_grad_() for t in (x, w, b))
            gx, gw, gb = torch.autograd.grad(F.linear(xs, ws, bs), (xs, ws, bs), grad_out)
        flat = _padded(torch.cat([gw.reshape(-1), gb]), shard, unit)
        mine = torch.empty_like(shard)
        dist.reduce_scatter_tensor(mine, flat)
        mine.div_(unit.world_size)
        return gx, mine, None


# mistake (values right, more memory): saves the gathered full W and b for backward instead of gathering again
class SavesFullWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather_tensor(shard, unit)
        ctx.save_for_backward(x, shard, w)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard, w = ctx.saved_tensors
        unit = ctx.unit
        grad_x, flat = _flat_grads(x, grad_out, w)
        mine = torch.empty_like(shard)
        dist.reduce_scatter_tensor(mine, _padded(flat, shard, unit))
        return grad_x, mine / unit.world_size, None


# mistake: the reduce-scatter sums the gradient over the ranks and never divides by N
class SumNotMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather_tensor(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, _ = _gather_tensor(shard, unit)
        grad_x, flat = _flat_grads(x, grad_out, w)
        mine = torch.empty_like(shard)
        dist.reduce_scatter_tensor(mine, _padded(flat, shard, unit))
        return grad_x, mine, None


# mistake (values right, wasteful): all-reduces the whole flat gradient and keeps its own slice instead of a reduce-scatter
class AllReduceGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather_tensor(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, _ = _gather_tensor(shard, unit)
        grad_x, flat = _flat_grads(x, grad_out, w)
        flat = _padded(flat, shard, unit)
        dist.all_reduce(flat)
        return grad_x, flat.chunk(unit.world_size)[unit.rank] / unit.world_size, None


# mistake (values right, wasteful): the same all-reduce of the gradient, via `from torch.distributed import all_reduce`
class AllReduceGradientImported(AllReduceGradient):
    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, _ = _gather_tensor(shard, unit)
        grad_x, flat = _flat_grads(x, grad_out, w)
        flat = _padded(flat, shard, unit)
        all_reduce(flat)
        return grad_x, flat.chunk(unit.world_size)[unit.rank] / unit.world_size, None


# mistake: the weight gradient as xᵀ·grad_out ([in, out]) flattened, the transpose of grad_W's layout
class TransposedWeightGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather_tensor(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, _ = _gather_tensor(shard, unit)
        x2, g2 = x.reshape(-1, x.shape[-1]), grad_out.reshape(-1, grad_out.shape[-1])
        flat = torch.cat([(x2.t() @ g2).reshape(-1), g2.sum(0)])
        mine = torch.empty_like(shard)
        dist.reduce_scatter_tensor(mine, _padded(flat, shard, unit))
        return grad_out @ w, mine / unit.world_size, None


# mistake (raises on uneven shards): the flat gradient goes to reduce_scatter_tensor without the zero padding
class NoPadding(SumNotMean):
    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, _ = _gather_tensor(shard, unit)
        grad_x, flat = _flat_grads(x, grad_out, w)
        mine = torch.empty_like(shard)
        dist.reduce_scatter_tensor(mine, flat)
        return grad_x, mine / unit.world_size, None


# mistake (raises): backward returns two gradients for forward's three inputs
class TwoGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather_tensor(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, _ = _gather_tensor(shard, unit)
        grad_x, flat = _flat_grads(x, grad_out, w)
        mine = torch.empty_like(shard)
        dist.reduce_scatter_tensor(mine, _padded(flat, shard, unit))
        return grad_x, mine / unit.world_size


CORRECT = [ListCollectives, AutogradGrads]
WRONG = [
    (SavesFullWeight, ("full weight", "memory", "held", "saved")),
    (SumNotMean, ("average", "divide", "mean")),
    (AllReduceGradient, ("bytes", "all-reduce", "all_reduce")),
    (AllReduceGradientImported, ("bytes", "all-reduce", "all_reduce")),
    (TransposedWeightGrad, ("transpose", "grad_outᵀ", "layout")),
    (NoPadding, ("pad", "padding", "n·shard")),
    (TwoGradients, ("number of gradients", "three", "none")),
]
