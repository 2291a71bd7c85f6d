"""The same pipeline with PyTorch's own ``torch.distributed.pipelining`` (cross-check and
benchmark baseline for ``pp``): the same stages (``loop.all_stages``, balanced by parameter count), one ``PipelineStage`` built
by hand per rank, ``ScheduleGPipe`` or ``Schedule1F1B``.

It runs on CPU/gloo in torch 2.13. Its communication is internal, so the trace holds one
``compute`` span per schedule step and an ``optimizer`` span, no send/recv events; its private
schedule visualiser is buggy in 2.13 (1F1B order off by one on the last rank), so timelines
come from ``pp`` only.
Run it with ``mpkit.launch(run_rank, world_size, args=(make_config("pp", ...),))``.
"""
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from mpkit.strategies.base import RankOutput, make_optimizer
from mpkit.strategies.loop import all_stages, full_batch, optimizer_step, run_steps

TORCH_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def run_rank(ctx, cfg):
    name, m, p = cfg.option("schedule"), cfg.option("micro_batches"), ctx.world_size
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"schedule={name!r}: the torch.distributed.pipelining cross-check runs "
                         f"{', '.join(TORCH_SCHEDULES)}")
    stage = all_stages(cfg, p)[ctx.rank].to(ctx.device)
    opt = make_optimizer(stage.parameters(), cfg)
    # loss per micro-batch is the mean over its samples; scale_grads=True divides the
    # accumulated gradients by m, as our loss/m does
    pipe = TORCH_SCHEDULES[name](PipelineStage(stage, ctx.rank, p, ctx.device), m, loss_fn=cfg.model.loss)
    first, last = ctx.rank == 0, ctx.rank == p - 1

    def step(x, y):
        mb_losses = []
        with ctx.trace.span("compute", name=f"torch {name}"):
            pipe.step(*([x] if first else []), **({"target": y, "losses": mb_losses} if last else {}))
        optimizer_step(ctx, opt)
        return sum(loss.item() for loss in mb_losses) / m if last else None

    # no memory tracking here: MemTracker's gradient hooks break the autograd.grad call of
    # pipelining's shape inference ("A leaf node was passed to _will_engine_execute_node")
    losses = run_steps(ctx, cfg, step, full_batch(ctx, cfg))
    return RankOutput(losses=losses if last else None,
                      params=stage.named_as_original("layers." if cfg.model.builtin else ""))
