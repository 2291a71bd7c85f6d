"""Blind attempts at average_gradients (written without the reference)."""
import torch
import torch.distributed as dist
from torch.distributed import all_reduce


# unusual: one flat all-reduce of every gradient at once (imported by name), then copied back
def flat_once(ctx, model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce(flat)
    flat /= ctx.world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


# unusual: divide first, then sum through the world ProcessGroup object
def divide_then_sum(ctx, model):
    for p in model.parameters():
        if p.grad is None:
            continue
        p.grad.div_(dist.get_world_size())
        dist.all_reduce(p.grad, group=dist.group.WORLD)


# wrong: sums without dividing by world_size
def sum_only(ctx, model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


# wrong (raises): forgets that frozen parameters have p.grad None
def ignores_frozen(ctx, model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= ctx.world_size


# wrong: averages a copy and never writes it back into p.grad
def averages_a_copy(ctx, model):
    for p in model.parameters():
        if p.grad is not None:
            g = p.grad.clone()
            dist.all_reduce(g)
            g /= ctx.world_size


# wrong: only rank 0 calls the collective (the others never join; a deadlock)
def only_rank0_reduces(ctx, model):
    for p in model.parameters():
        if p.grad is not None and ctx.rank == 0:
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size


# wrong: broadcasts rank 0's gradient instead of averaging
def broadcasts_rank0(ctx, model):
    for p in model.parameters():
        if p.grad is not None:
            dist.broadcast(p.grad, src=0)


CORRECT = [flat_once, divide_then_sum]
WRONG = [
    (sum_only, ("world_size", "divid", "sum instead", "not divided")),
    (ignores_frozen, ("none", "frozen")),
    (averages_a_copy, ("in place", "unchanged", "p.grad", "write")),
    (only_rank0_reduces, ("some ranks", "every rank", "only rank", "not all ranks")),
    (broadcasts_rank0, ("broadcast", "rank 0's", "copied")),
]
