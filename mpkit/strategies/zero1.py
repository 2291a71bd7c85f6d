"""ZeRO stage 1 (``mpkit.parallel.ShardedOptimizer``): data parallel where each rank keeps the
optimizer state only for its 1/N of the model.

Parameters and gradients stay replicated (every rank runs the full forward/backward on its batch
slice); the optimizer is what gets sharded. A step: reduce-scatter the flat gradient (rank r
receives the sum of slice r), Adam on slice r alone, all-gather the updated slices: the
2(N-1)/N·S of one all-reduce, for 1/N of Adam's state, where the backend reduce-scatters as a ring
does (NCCL). gloo (cpu-sim) all-reduces the whole tensor and keeps slice r, so there a step sends
1.5 times dp's bytes (``mpkit.costmodel.cpu.ring_steps``). Cross-checked against torch's
``ZeroRedundancyOptimizer`` in the tests.
"""
import torch.distributed as dist
from torch import nn

from mpkit.parallel.sharded_optimizer import ShardedOptimizer, shard_numel
from mpkit.simulator.engine import Compute
from mpkit.pricing.pricing import fwd_bwd
from mpkit.pricing.profile import optimizer_cost
from mpkit.strategies.base import RankOutput, Strategy, optimizer_spec, state_of
from mpkit.strategies.dp import validate_batch
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import build_model, forward_backward, group_mean, local_batch, mixed_precision, run_steps

OPTIONS = {}


def validate(cfg):
    validate_batch(cfg)


def run_rank(ctx, cfg):
    mp = mixed_precision(cfg)
    model = build_model(ctx, cfg, mp)
    cls, kwargs = optimizer_spec(cfg)
    opt = ShardedOptimizer(model.parameters(), cls, average_gradients=True, **kwargs)
    opt.name_parameters(model)
    opt.broadcast_parameters()
    shards = nn.ParameterList(opt.shard_parameters)  # a module, so the tracker files their .grad as gradients

    def step(x, y):
        loss = forward_backward(ctx, cfg, model, x, y, mp)
        opt.reduce_scatter_gradients()
        with ctx.trace.span("optimizer"):
            if mp.unscale_(opt.shard_parameters, group=dist.group.WORLD):  # each rank sees only its slice
                opt.update_shard()
            opt.zero_grad(set_to_none=False)  # in place: the .grad views of the flat buffer stay
        opt.all_gather_parameters()
        return loss.item()

    losses = group_mean(ctx, run_steps(ctx, cfg, step, local_batch(ctx, cfg), track=(model, shards, opt.inner),
                                       state=Resumable(model, opt, mp=mp)))
    shard = opt.shards[0]
    extra = {"partition": "flat", "shard_numel": shard.shard_numel, "padding": shard.padding,
             "shard_range": (shard.lo, shard.hi), **mp.report()}
    return RankOutput(losses=losses if ctx.rank == 0 else None, params=state_of(model) if ctx.rank == 0 else {},
                      extra=extra)


def program(pricer):
    """Reduce-scatter the flat gradient, Adam on this rank's slice, all-gather the parameters: the
    flat buffer padded as ``ShardedOptimizer`` pads it."""
    prof = pricer.piece(batch=pricer.batch // pricer.world)
    per_rank = shard_numel(prof.total_param_bytes // 4, pricer.world)
    flat = per_rank * pricer.world * 4
    program = [*fwd_bwd(pricer, prof),
               pricer.collective("reduce_scatter", pricer.all_ranks, flat, ("grads",), name="grads"),
               Compute("optimizer", pricer.seconds(optimizer_cost(((per_rank,),)), "optimizer")),
               pricer.collective("all_gather", pricer.all_ranks, flat, ("params",), name="params")]
    return [list(program) for _ in range(pricer.world)]


STRATEGY = Strategy("zero1", OPTIONS, validate, run_rank, program, takes_precision=True)
