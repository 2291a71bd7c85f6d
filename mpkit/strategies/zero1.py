"""ZeRO stage 1: data parallel where each rank keeps Adam's state only for its 1/N of the model.

Parameters and gradients stay replicated (every rank runs the full forward/backward on its batch
slice); the optimizer is what gets sharded. All parameters live in one flat buffer, padded to a
multiple of N and cut into N equal contiguous slices: rank r owns slice r. A step is

1. reduce-scatter the flat gradient: rank r receives the sum of slice r only ((N-1)/N·S bytes),
2. Adam on slice r alone (its exp_avg/exp_avg_sq are 1/N of the model: 8Ψ/N bytes),
3. all-gather the updated slices back into every rank's flat parameters ((N-1)/N·S bytes).

Together that is the 2(N-1)/N·S of one all-reduce: ZeRO-1 saves memory at no extra traffic.
Flat equal slices (not whole tensors balanced greedily) make the state exactly ceil(Ψ/N)
elements per rank — 8Ψ/N bytes when N divides Ψ — plus a single step counter, since each rank's
optimizer sees one tensor. Adam is elementwise, so stepping slices is the same math as stepping
tensors.
"""
import math

from torch import nn

from mpkit.models import build_model
from mpkit.strategies.common import RankOutput, make_optimizer, state_of
from mpkit.strategies.dp_buckets import flat_views, train_loop, validate_batch

OPTIONS = {}


def validate(cfg):
    validate_batch(cfg)


class FlatShards:
    """The model's parameters and gradients as views of two flat buffers of N equal slices."""

    def __init__(self, ctx, model):
        self.ctx = ctx
        params = list(model.parameters())
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = math.ceil(self.numel / ctx.world_size)
        padded = self.shard_numel * ctx.world_size
        self.params, views = flat_views(params, padded)
        for p, view in zip(params, views):
            view.copy_(p.detach())
            p.data = view
        self.grads, views = flat_views(params, padded)
        for p, view in zip(params, views):
            p.grad = view
        lo = ctx.rank * self.shard_numel
        # This rank's slice as the optimizer's only parameter: a view, so Adam updates the model.
        self.shard = nn.Parameter(self.params[lo:lo + self.shard_numel])
        self.shard.grad = self.grads.new_zeros(self.shard_numel)  # receives the reduced slice
        self.owned = nn.ParameterList([self.shard])  # a module, so the memory tracker files .grad as gradients

    def broadcast(self, src=0):
        self.ctx.comm.broadcast(self.params, src=src, name="initial weights")

    def reduce_scatter_grads(self):
        self.ctx.comm.reduce_scatter_tensor(self.shard.grad, self.grads, name="grads")
        self.shard.grad.div_(self.ctx.world_size)

    def zero_grad(self):
        self.grads.zero_()  # in place: the .grad views must stay; shard.grad is overwritten next step

    def all_gather_params(self):
        # In place (input is this rank's slice of the output), NCCL's documented in-place form.
        self.ctx.comm.all_gather_into_tensor(self.params, self.shard.detach(), name="params")


def run_rank(ctx, cfg):
    model = build_model(cfg.model, cfg.seed).to(ctx.device)
    flat = FlatShards(ctx, model)
    flat.broadcast()
    optimizer = make_optimizer([flat.shard], cfg)
    losses = train_loop(ctx, cfg, model, optimizer, track=(model, flat.owned, optimizer),
                        sync_grads=flat.reduce_scatter_grads, zero_grad=flat.zero_grad,
                        after_step=flat.all_gather_params)
    extra = {"partition": "flat", "shard_numel": flat.shard_numel,
             "padding": flat.shard_numel * ctx.world_size - flat.numel,
             "shard_range": (ctx.rank * flat.shard_numel, (ctx.rank + 1) * flat.shard_numel)}
    return RankOutput(losses=losses if ctx.rank == 0 else None, params=state_of(model) if ctx.rank == 0 else {},
                      extra=extra)
