"""FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters, gradients and optimizer state all
sharded across ranks (ZeRO stage 3), each rank training on its slice of the batch.

Every layer of ``model.layers`` is one FSDP unit, then the root: before a unit's forward (and
again before its backward) its parameters are all-gathered, used, and freed; after its backward
the gradients are reduce-scattered, so each rank keeps only its shard. FSDP2 shards every tensor
along dim 0, padding dim 0 to a multiple of N (rank r holds rows [r·c, (r+1)·c), c = ceil(d0/N)).

The run is ``mpkit.parallel.parallelize`` with ``dp="fsdp"`` on a mesh of ``dp = world_size``
(``mpkit.parallel.fully_sharded``: the units, and every all-gather and reduce-scatter traced).

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

from torch.distributed.tensor import DTensor

from mpkit.parallel.parallelize import Plan
from mpkit.pricing.profile import optimizer_cost
from mpkit.simulator.engine import Compute, Wait
from mpkit.strategies.base import Strategy
from mpkit.strategies.checks import validate_batch
from mpkit.strategies.loop import builtin_plan, parallelized, recipe, train_parallelized

OPTIONS = {}


def validate(cfg):
    validate_batch(cfg)


def run_rank(ctx, cfg):
    plan = builtin_plan(cfg, dp="fsdp") if cfg.model.builtin else Plan(**recipe(cfg), dp="fsdp")
    par = parallelized(ctx, cfg, STRATEGY.mesh(cfg), plan)
    out = train_parallelized(ctx, cfg, par)
    local = [p.to_local() for p in par.model.parameters() if isinstance(p, DTensor)]
    out.extra.update(local_numel=sum(t.numel() for t in local),
                     padded_numel=sum(t.untyped_storage().nbytes() // t.element_size() for t in local),
                     traced="all_gather and reduce_scatter of every layer (not the final full_tensor gathers)")
    return out


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
