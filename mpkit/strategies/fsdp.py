"""FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and optimizer state all
sharded across ranks (ZeRO stage 3), each rank training on its slice of the batch.

Every layer of ``model.layers`` is one FSDP unit, then the root: before a unit's forward (and
again before its backward) its parameters are all-gathered, used, and freed; after its backward
the gradients are reduce-scattered, so each rank keeps only its shard. FSDP2 shards every tensor
along dim 0, padding dim 0 to a multiple of N (rank r holds rows [r·c, (r+1)·c), c = ceil(d0/N)).

Tracing: FSDP2's public ``set_custom_all_gather`` / ``set_custom_reduce_scatter`` let us issue its
collectives ourselves, so each one is logged as an event with its bytes: an async all-gather ends
when its Work's future completes, a blocking reduce-scatter when the call returns. Not traced:
the all-gathers that ``DTensor.full_tensor()`` does to report full parameters after training.

Precision: the same recipe as every strategy here (``precision.py``): each layer's forward under
autocast, FSDP's parameters, gathers, reduce-scatters and Adam all fp32. torch's own
``fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32))`` differs: it
casts the shards to bf16 *before* the all-gather (half the bytes gathered) and runs the whole unit in
bf16, its input and residual stream included, then reduce-scatters in fp32; its sharded fp32
parameters are the master weights as here. Here autocast runs the matmuls and the attention (SDPA)
in bf16 as well, but each unit's input and the residual stream stay fp32, so LayerNorm, which reads
them, computes in fp32 (CPU autocast leaves layer_norm and softmax in their input's dtype).
``tests/test_precision_strategies.py`` runs torch's next to ours: both within 1e-3 of ``single``'s
bf16 losses, both more than 1e-5 from fsdp's fp32 losses, torch's forward seeing bf16 weights.

``recompute``: the layers are checkpointed before they become units (as torch's recipe: activation
checkpointing, then ``fully_shard``); the recomputation runs after FSDP's pre-backward all-gather,
on the unsharded parameters.
"""
import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from mpkit.observe.comm import nbytes
from mpkit.simulator.engine import Compute, Wait
from mpkit.pricing.profile import optimizer_cost
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer
from mpkit.strategies.dp import validate_batch
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import group_mean, local_batch, mixed_precision, plain_step, prepare_layers, run_steps

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


class _Traced:
    """What FSDP2's ``set_custom_all_gather``/``set_custom_reduce_scatter`` take: ``allocate`` and a
    call issuing the collective. Ours issue FSDP2's own ops and log each as one event."""

    def __init__(self, ctx, name):
        self.ctx, self.name = ctx, name

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)


class TracedAllGather(_Traced):
    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        start = self.ctx.trace.now()
        work = dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        return _log(self.ctx, "all_gather", start, work, nbytes(output_tensor), self.name)


class TracedReduceScatter(_Traced):
    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        start = self.ctx.trace.now()
        work = dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        return _log(self.ctx, "reduce_scatter", start, work, nbytes(input_tensor), self.name)


def units(cfg, model) -> dict:
    """{name: module} of the FSDP units: each layer of a built-in model; each top-level child
    that holds parameters of a user's model, except children that share a parameter (tied
    weights: an embedding and its output layer). FSDP2 refuses a parameter in two units; those
    children stay with the root unit, which then gathers the shared tensor once for both."""
    if cfg.model.builtin:
        return {f"layers.{i}": layer for i, layer in enumerate(model.layers)}
    children = {name: child for name, child in model.named_children() if any(True for _ in child.parameters())}
    holders = {}  # id(parameter) -> the children holding it
    for name, child in children.items():
        for param in child.parameters():
            holders.setdefault(id(param), set()).add(name)
    tied = {name for names in holders.values() if len(names) > 1 for name in names}
    return {name: child for name, child in children.items() if name not in tied}


def shard_model(ctx, cfg, model):
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for name, unit in units(cfg, model).items():
        fully_shard(unit, mesh=mesh)
        unit.set_custom_all_gather(TracedAllGather(ctx, name))
        unit.set_custom_reduce_scatter(TracedReduceScatter(ctx, name))
    fully_shard(model, mesh=mesh)  # the root: owns what no unit holds, drives the lazy init
    return model


def run_rank(ctx, cfg):
    mp = mixed_precision(cfg)
    model = cfg.model.build(cfg.seed)
    prepare_layers(cfg, model, mp)
    model = shard_model(ctx, cfg, model.to(ctx.device))
    opt = make_optimizer(model.parameters(), cfg)

    # each rank holds its gradient shards: an fp16 overflow in one shard skips the step on all
    step = plain_step(ctx, cfg, model, opt, mp, group=dist.group.WORLD)
    losses = group_mean(ctx, run_steps(ctx, cfg, step, local_batch(ctx, cfg), track=(model, opt),
                                       state=Resumable(model, opt, mp=mp)))
    local = {name: p.to_local() for name, p in model.named_parameters()}
    full = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}  # collective
    extra = {"local_numel": sum(t.numel() for t in local.values()),
             "padded_numel": sum(t.untyped_storage().nbytes() // t.element_size() for t in local.values()),
             "traced": "all_gather and reduce_scatter of every layer (not the final full_tensor gathers)",
             **mp.report()}
    return RankOutput(losses=losses if ctx.rank == 0 else None, params=full if ctx.rank == 0 else {}, extra=extra)


def unsharded_bytes(shapes, world: int) -> int:
    """Bytes of one FSDP2 unit once gathered: every tensor's dim 0 padded to a multiple of N
    (rank r holds rows [r·c, (r+1)·c), c = ceil(d0/N))."""
    return sum(math.ceil(s[0] / world) * world * math.prod(s[1:]) * 4 for s in shapes)


def program(pricer):
    """One unit per layer: all-gather before each layer's forward; in backward, FSDP2 gathers the
    next unit (in backward order) while this one computes — its default backward prefetch — and
    reduce-scatters each unit's gradients after its backward; Adam on the local shards."""
    prof = pricer.piece(batch=pricer.batch // pricer.world)
    n, program = pricer.world, []
    gathered = {i: unsharded_bytes(prof.layer_shapes[i], n) for i in prof.layers}

    def collective(kind, i, key, async_op=False):
        return pricer.collective(kind, pricer.all_ranks, gathered[i], (key, i), async_op, name=f"layers.{i}")

    for i in prof.layers:
        if gathered[i]:
            program.append(collective("all_gather", i, "ag"))
        program.append(Compute("forward", pricer.seconds(prof.cost("forward", [i]), "forward"), name=f"layer {i}"))
    order = [i for i in reversed(prof.layers)]
    for k, i in enumerate(order):
        if k == 0 and gathered[i]:
            program.append(collective("all_gather", i, "ag-b"))
        elif gathered[i]:
            program.append(Wait(("ag-b", i)))  # prefetched while the previous unit computed
        following = order[k + 1] if k + 1 < len(order) else None
        if following is not None and gathered[following]:
            program.append(collective("all_gather", following, "ag-b", async_op=True))
        program.append(Compute("backward", pricer.seconds(prof.cost("backward", [i]), "backward"), name=f"layer {i}"))
        if gathered[i]:
            program.append(collective("reduce_scatter", i, "rs"))
    shapes = tuple((math.ceil(s[0] / n), *s[1:]) for i in prof.layers for s in prof.layer_shapes[i])
    program.append(Compute("optimizer", pricer.seconds(optimizer_cost(shapes), "optimizer")))
    return [list(program) for _ in range(n)]


STRATEGY = Strategy("fsdp", OPTIONS, validate, run_rank, program, takes_precision=True)
