"""Cost-model programs several strategies share: a data-parallel step's bucketed all-reduces
(``dp``, ``ddp``, ``cp``) and a pipeline schedule priced stage by stage (``mp``, ``pp``). Kept
here, not in one strategy that the others import, so no strategy module imports another."""
from __future__ import annotations

from mpkit.parallel.buckets import plan_buckets
from mpkit.parallel.pipeline import schedule
from mpkit.parallel.pipeline.schedules import placement
from mpkit.parallel.pipeline.split import partition
from mpkit.pricing.pipeline_program import engine_programs
from mpkit.pricing.pricing import optimizer
from mpkit.pricing.profile import Cost
from mpkit.simulator.engine import Compute, Wait


def bucket_program(pricer, cap_bytes, first_cap, overlap, find_unused=False):
    """One data-parallel step (dp, ddp): forward, backward (layer by layer when buckets start
    from backward hooks), the buckets of ``plan_buckets`` on the model's real parameters, each
    all-reduced once the backward of the earliest layer it holds is done, then the optimizer;
    ``find_unused``: the used-parameter mask's all-reduce (a float per parameter tensor) after
    every bucket's (so ranks that used different branches issue them in one order)."""
    prof = pricer.piece(batch=pricer.batch // pricer.world)
    model = pricer.meta_model()
    layer_of = {p: i for i, layer in enumerate(model.layers) for p in layer.parameters()}
    buckets = plan_buckets([p for p in model.parameters() if p.requires_grad], cap_bytes, first_cap)
    done_at = [min(layer_of[p] for p in bucket) for bucket in buckets]
    sizes = [sum(p.numel() * p.element_size() for p in bucket) for bucket in buckets]

    def all_reduce(k):
        return pricer.collective("all_reduce", pricer.all_ranks, sizes[k], ("bucket", k), True, f"bucket {k}")

    program = [Compute("forward", pricer.seconds(prof.cost("forward"), "forward"))]
    if overlap:
        for i in reversed(prof.layers):
            program.append(Compute("backward", pricer.seconds(prof.cost("backward", [i]), "backward"), name=f"layer {i}"))
            program += [all_reduce(k) for k in range(len(buckets)) if done_at[k] == i]
    else:
        program.append(Compute("backward", pricer.seconds(prof.cost("backward"), "backward")))
    if not overlap:
        program += [all_reduce(k) for k in range(len(buckets))]
    program += [Wait(("bucket", k)) for k in range(len(buckets))]
    if find_unused:
        tensors = sum(len(bucket) for bucket in buckets)
        program.append(pricer.collective("all_reduce", pricer.all_ranks, 4 * tensors, ("mask",),
                                         name="used-parameter mask"))
    program.append(optimizer(pricer, prof))
    return [list(program) for _ in range(pricer.world)]


def pipeline_program(pricer, name, m, v):
    """The schedule's instruction lists, each priced on its stage's profile (the same split)."""
    p = pricer.world
    groups = partition([b // 4 for b in pricer.piece(batch=1).param_bytes.values()], p * v)
    profs = {s: pricer.piece(g.start, g.stop, batch=pricer.batch // m) for s, g in enumerate(groups)}

    def message(kind, stage, src, dst):
        prof = profs[stage]
        nbytes = prof.input_bytes if kind == "act" else prof.output_bytes[groups[stage].stop - 1]
        return pricer.wire(nbytes), pricer.p2p_time(src, dst, nbytes)

    where = placement(name, p, v)

    def optimizer_seconds(rank):
        return pricer.seconds(sum((profs[s].optimizer for s in range(p * v) if where[s] == rank), Cost()), "optimizer")

    def compute(phase):
        extra = pricer.hw.stage_overhead[phase] * pricer.slowdown  # the executor's own work per micro-batch
        return lambda s, mb: pricer.seconds(profs[s].cost(phase), phase) + extra

    def weight(s, mb):  # W of a split backward: the weight-gradient half of the backward's matmuls
        return compute("backward")(s, mb) / 2

    return engine_programs(schedule(name, p, m, v), compute("forward"), compute("backward"), message,
                           optimizer_seconds, weight)
