"""The same pipeline with PyTorch's own ``torch.distributed.pipelining`` (cross-check and
benchmark baseline for ``pp``): the same stages (``split.plan``), one ``PipelineStage`` built
by hand per rank, ``ScheduleGPipe`` or ``Schedule1F1B``.

It runs on CPU/gloo in torch 2.13. Its communication is internal, so the trace holds one
``compute`` span per schedule step and an ``optimizer`` span, no send/recv events; its private
schedule visualiser is buggy in 2.13 (DESIGN.md), so timelines come from ``pp`` only.
Run it with ``mpkit.launch(run_rank, world_size, args=(make_config("pp", ...),))``.
"""
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from mpkit.models import loss_fn, make_batch
from mpkit.strategies.common import RankOutput, make_optimizer
from mpkit.strategies.pp.split import build_stages, plan

TORCH_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def run_rank(ctx, cfg):
    name, m, p = cfg.option("schedule"), cfg.option("micro_batches"), ctx.world_size
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"schedule={name!r}: the torch.distributed.pipelining cross-check runs "
                         f"{', '.join(TORCH_SCHEDULES)}")
    groups = plan(cfg.model, p, cfg.seed)
    stage = build_stages(cfg.model, cfg.seed, groups, [ctx.rank])[ctx.rank].to(ctx.device)
    optimizer = make_optimizer(stage.parameters(), cfg)
    # loss per micro-batch is the mean over its samples; scale_grads=True divides the
    # accumulated gradients by m, as our loss/m does
    pipe = TORCH_SCHEDULES[name](PipelineStage(stage, ctx.rank, p, ctx.device), m,
                                 loss_fn=lambda out, target: loss_fn(cfg.model, out, target))
    first, last = ctx.rank == 0, ctx.rank == p - 1
    losses = []
    # no ctx.memory.track here: MemTracker's gradient hooks break the autograd.grad call of
    # pipelining's shape inference ("A leaf node was passed to _will_engine_execute_node")
    for step in range(cfg.steps):
        ctx.set_step(step)
        x, y = (t.to(ctx.device) for t in make_batch(cfg.model, cfg.batch_size, step, cfg.seed))
        mb_losses = []
        with ctx.trace.span("compute", name=f"torch {name}"):
            pipe.step(*([x] if first else []), **({"target": y, "losses": mb_losses} if last else {}))
        with ctx.trace.span("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if last:
            losses.append(sum(loss.item() for loss in mb_losses) / m)
    return RankOutput(losses=losses if last else None, params=stage.single_state())
