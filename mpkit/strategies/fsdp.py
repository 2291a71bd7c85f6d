"""FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and optimizer state all
sharded across ranks (ZeRO stage 3), each rank training on its slice of the batch.

Every layer of ``model.layers`` is one FSDP unit, then the root: before a unit's forward (and
again before its backward) its parameters are all-gathered, used, and freed; after its backward
the gradients are reduce-scattered, so each rank keeps only its shard. FSDP2 shards every tensor
along dim 0, padding dim 0 to a multiple of N (rank r holds rows [r·c, (r+1)·c), c = ceil(d0/N)).

Tracing: FSDP2's ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` let us issue its
collectives ourselves, so each one is logged as an event with its bytes: an async all-gather ends
when its Work's future completes, a blocking reduce-scatter when the call returns. Not traced:
the all-gathers that ``DTensor.full_tensor()`` does to report full parameters after training.
"""
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from mpkit.models import build_model
from mpkit.observe.comm import nbytes
from mpkit.strategies.common import RankOutput, make_optimizer
from mpkit.strategies.dp_buckets import train_loop, validate_batch

OPTIONS = {}


def validate(cfg):
    validate_batch(cfg)


def _log(ctx, kind, start, work, size, name):
    def record(_fut=None):
        ctx.trace.record(kind, start, ctx.trace.now(), bytes=size, name=name)

    if work is None:
        record()
    else:
        work.get_future().then(record)
    return work


class TracedAllGather(DefaultAllGather):
    def __init__(self, ctx, name):
        self.ctx, self.name = ctx, name

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        start = self.ctx.trace.now()
        work = super().__call__(output_tensor, input_tensor, group, async_op)
        return _log(self.ctx, "all_gather", start, work, nbytes(output_tensor), self.name)


class TracedReduceScatter(DefaultReduceScatter):
    def __init__(self, ctx, name):
        self.ctx, self.name = ctx, name

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        start = self.ctx.trace.now()
        work = super().__call__(output_tensor, input_tensor, group, op, async_op)
        return _log(self.ctx, "reduce_scatter", start, work, nbytes(input_tensor), self.name)


def shard_model(ctx, model):
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for i, layer in enumerate(model.layers):
        fully_shard(layer, mesh=mesh)
        layer.set_custom_all_gather(TracedAllGather(ctx, f"layers.{i}"))
        layer.set_custom_reduce_scatter(TracedReduceScatter(ctx, f"layers.{i}"))
    fully_shard(model, mesh=mesh)  # the root: owns no parameters of its own, drives the lazy init
    return model


def run_rank(ctx, cfg):
    model = shard_model(ctx, build_model(cfg.model, cfg.seed).to(ctx.device))
    optimizer = make_optimizer(model.parameters(), cfg)
    losses = train_loop(ctx, cfg, model, optimizer, track=(model, optimizer))
    local = {name: p.to_local() for name, p in model.named_parameters()}
    full = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}  # collective
    extra = {"local_numel": sum(t.numel() for t in local.values()),
             "padded_numel": sum(t.untyped_storage().nbytes() // t.element_size() for t in local.values()),
             "traced": "all_gather and reduce_scatter of every layer (not the final full_tensor gathers)"}
    return RankOutput(losses=losses if ctx.rank == 0 else None, params=full if ctx.rank == 0 else {}, extra=extra)
