"""Attempts for the FSDPLinear autograd Function: forward(ctx, x, shard, unit), backward(ctx, grad_out)
-> (grad_x, grad_shard, None); graded on values, on what is held between forward and backward, and
on bytes (an all-gather per unit forward, an all-gather and a reduce-scatter per unit backward)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def _split(flat, unit):
    out_f, in_f = unit.shape
    return flat[:out_f * in_f].view(out_f, in_f), flat[out_f * in_f:unit.numel]


def _gather(shard, unit):
    flat = torch.empty(unit.world_size * shard.numel())
    dist.all_gather_into_tensor(flat, shard.detach().contiguous())
    return _split(flat, unit)


def _flat_grad(grad_out, x, unit, size):
    flat = torch.zeros(unit.world_size * size)
    flat[:unit.numel] = torch.cat([(grad_out.t() @ x).reshape(-1), grad_out.sum(0)])
    return flat


# ---------------------------------------------------------------- correct
class WithListCollectives(torch.autograd.Function):
    """dist.all_gather into a list of shards and dist.reduce_scatter from a list."""
    @staticmethod
    def forward(ctx, x, shard, unit):
        parts = [torch.empty_like(shard) for _ in range(unit.world_size)]
        dist.all_gather(parts, shard.detach().contiguous())
        w, b = _split(torch.cat(parts), unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return x @ w.t() + b

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        parts = [torch.empty_like(shard) for _ in range(unit.world_size)]
        dist.all_gather(parts, shard.detach().contiguous())
        w, _ = _split(torch.cat(parts), unit)
        pieces = list(_flat_grad(grad_out, x, unit, shard.numel()).split(shard.numel()))
        mine = torch.empty_like(shard)
        dist.reduce_scatter(mine, pieces)
        return grad_out @ w, mine / unit.world_size, None


class FreesByResizingStorage(torch.autograd.Function):
    """FSDP2's trick: the gathered flat buffer is saved, then its storage resized to 0 after the
    forward; the backward grows it back and gathers into it again."""
    @staticmethod
    def forward(ctx, x, shard, unit):
        full = torch.empty(unit.world_size * shard.numel())
        dist.all_gather_into_tensor(full, shard.detach().contiguous())
        w, b = _split(full, unit)
        y = F.linear(x, w, b)
        ctx.save_for_backward(x, shard, full)
        ctx.unit, ctx.nbytes = unit, full.untyped_storage().nbytes()
        full.untyped_storage().resize_(0)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, shard, full = ctx.saved_tensors
        unit = ctx.unit
        full.untyped_storage().resize_(ctx.nbytes)
        dist.all_gather_into_tensor(full, shard.detach().contiguous())
        w, _ = _split(full, unit)
        grad_x = grad_out @ w
        out = torch.empty_like(shard)
        dist.reduce_scatter_tensor(out, _flat_grad(grad_out, x, unit, shard.numel()))
        full.untyped_storage().resize_(0)
        return grad_x, out.div_(unit.world_size), None


class BroadcastsAndReduces(torch.autograd.Function):
    """Gathers with one broadcast per owner and reduce-scatters with one reduce per owner: the
    same bytes per rank on the chain as the all-gather and the reduce-scatter."""
    @staticmethod
    def _gather(shard, unit):
        parts = []
        for owner in range(unit.world_size):
            part = shard.detach().clone() if owner == unit.rank else torch.empty_like(shard)
            dist.broadcast(part, src=owner)
            parts.append(part)
        return _split(torch.cat(parts), unit)

    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = BroadcastsAndReduces._gather(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        unit = ctx.unit
        w, _ = BroadcastsAndReduces._gather(shard, unit)
        pieces = _flat_grad(grad_out, x, unit, shard.numel()).split(shard.numel())
        mine = None
        for owner, piece in enumerate(pieces):
            piece = piece.clone()
            dist.reduce(piece, dst=owner)
            if owner == unit.rank:
                mine = piece / unit.world_size
        return grad_out @ w, mine, None


CORRECT = [WithListCollectives, FreesByResizingStorage, BroadcastsAndReduces]


# ---------------------------------------------------------------- wrong
class _GathersAndSavesTheShard(torch.autograd.Function):
    """The forward the wrong ones below share (right as it is); each gets its backward wrong."""
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):   # right: gather again, reduce-scatter, average
        x, shard = ctx.saved_tensors
        w, _ = _gather(shard, ctx.unit)
        out = torch.empty_like(shard)
        dist.reduce_scatter_tensor(out, _flat_grad(grad_out, x, ctx.unit, shard.numel()))
        return grad_out @ w, out / ctx.unit.world_size, None


class KeepsTheFullWeight(torch.autograd.Function):
    """Saves the gathered weight for backward: no second all-gather, full W alive in between."""
    @staticmethod
    def forward(ctx, x, shard, unit):
        w, b = _gather(shard, unit)
        ctx.save_for_backward(x, w)
        ctx.unit, ctx.size = unit, shard.numel()
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, w = ctx.saved_tensors
        out = torch.empty(ctx.size)
        dist.reduce_scatter_tensor(out, _flat_grad(grad_out, x, ctx.unit, ctx.size))
        return grad_out @ w, out / ctx.unit.world_size, None


class KeepsItOnTheContext(torch.autograd.Function):
    """Not saved through save_for_backward but kept on ctx: held all the same."""
    @staticmethod
    def forward(ctx, x, shard, unit):
        ctx.w, b = _gather(shard, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, ctx.w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        out = torch.empty_like(shard)
        dist.reduce_scatter_tensor(out, _flat_grad(grad_out, x, ctx.unit, shard.numel()))
        return grad_out @ ctx.w, out / ctx.unit.world_size, None


def _all_reduced(ctx, grad_out):
    """grad_x and the whole flat gradient, all-reduced and averaged."""
    x, shard = ctx.saved_tensors
    w, _ = _gather(shard, ctx.unit)
    flat = _flat_grad(grad_out, x, ctx.unit, shard.numel())
    dist.all_reduce(flat)
    return grad_out @ w, flat / ctx.unit.world_size


class AllReducesTheGradient(_GathersAndSavesTheShard):
    """Correct values, but the flat gradient is all-reduced and then sliced: twice a reduce-scatter's bytes."""
    @staticmethod
    def backward(ctx, grad_out):
        grad_x, flat = _all_reduced(ctx, grad_out)
        return grad_x, flat.split(ctx.saved_tensors[1].numel())[ctx.unit.rank], None


class GathersWithAnAllReduce(_GathersAndSavesTheShard):
    """Correct values, but gathers by all-reducing a zero buffer holding only its own shard."""
    @staticmethod
    def forward(ctx, x, shard, unit):
        flat = torch.zeros(unit.world_size * shard.numel())
        flat[unit.rank * shard.numel():(unit.rank + 1) * shard.numel()] = shard.detach()
        dist.all_reduce(flat)
        w, b = _split(flat, unit)
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, w, b)


class SumsTheGradient(_GathersAndSavesTheShard):
    """Reduce-scatters but never divides by the world size."""
    @staticmethod
    def backward(ctx, grad_out):
        grad_x, mean, _ = _GathersAndSavesTheShard.backward(ctx, grad_out)
        return grad_x, mean * ctx.unit.world_size, None


class ForgetsThePadding(_GathersAndSavesTheShard):
    """Cuts the whole gathered (padded) vector into W and b."""
    @staticmethod
    def forward(ctx, x, shard, unit):
        flat = torch.empty(unit.world_size * shard.numel())
        dist.all_gather_into_tensor(flat, shard.detach().contiguous())
        out_f, in_f = unit.shape
        ctx.save_for_backward(x, shard)
        ctx.unit = unit
        return F.linear(x, flat[:out_f * in_f].view(out_f, in_f), flat[out_f * in_f:])


class ReturnsTheWholeGradient(_GathersAndSavesTheShard):
    """All-reduces and returns the whole flat gradient for the shard."""
    @staticmethod
    def backward(ctx, grad_out):
        return (*_all_reduced(ctx, grad_out), None)


WRONG = [
    (KeepsTheFullWeight, "holds a tensor"),
    (KeepsItOnTheContext, "holds a tensor"),
    (AllReducesTheGradient, "reduce-scatter the gradient"),
    (GathersWithAnAllReduce, "all_gather_into_tensor"),
    (SumsTheGradient, "never divided"),
    (ForgetsThePadding, "padded"),
    (ReturnsTheWholeGradient, "shard"),
]
