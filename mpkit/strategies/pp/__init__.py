"""Pipeline parallel: the model cut into stages, the batch into micro-batches that flow
through the stages so that several devices compute at once.

The schedule is data (``schedules.py``: one instruction list per rank, unit-tested by a
simulator), run by one executor for every schedule (``executor.py``):

- ``gpipe``: all forwards, then all backwards; every rank keeps m micro-batches of activations.
- ``1f1b``: rank r runs p-1-r forwards, then alternates one forward / one backward; at most
  p-r micro-batches of activations alive, same bubble (p-1)/(m+p-1).
- ``interleaved``: v model chunks per rank (Megatron's virtual stages); the bubble shrinks to
  (p-1)/(v·m+p-1) of the step, i.e. (p-1)/(v·m) of the ideal time, for v times the messages.

Options: ``schedule``, ``micro_batches`` (m; each holds batch_size/m samples, loss scaled by
1/m, gradients accumulated, one optimizer step per rank per step), ``virtual_stages`` (v, only
read by ``interleaved``). Stages are balanced by parameter count (``split.py``).
"""
from mpkit.models import make_batch
from mpkit.strategies.common import RankOutput, make_optimizer, require_divisible
from mpkit.strategies.pp.executor import PipelineExecutor
from mpkit.strategies.pp.schedules import SCHEDULES, check_schedule_args, schedule
from mpkit.strategies.pp.split import build_stages, check_stage_count, plan

OPTIONS = {"schedule": "gpipe", "micro_batches": 4, "virtual_stages": 2}


def virtual_stages(cfg) -> int:
    return cfg.option("virtual_stages") if cfg.option("schedule") == "interleaved" else 1


def validate(cfg):
    name, m = cfg.option("schedule"), cfg.option("micro_batches")
    check_schedule_args(name, cfg.world_size, m, cfg.option("virtual_stages"))
    require_divisible(cfg.batch_size, m, "batch_size", "micro_batches",
                      "each micro-batch holds batch_size/micro_batches samples")
    v = virtual_stages(cfg)
    what = "world_size" if v == 1 else f"world_size*virtual_stages={cfg.world_size}*{v}"
    try:
        check_stage_count(cfg.model, cfg.world_size * v, "stages")
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def run_rank(ctx, cfg):
    p, v, m = ctx.world_size, virtual_stages(cfg), cfg.option("micro_batches")
    groups = plan(cfg.model, p * v, cfg.seed)
    mine = list(range(ctx.rank, p * v, p))  # stage s lives on rank s % p
    stages = {s: stage.to(ctx.device) for s, stage in build_stages(cfg.model, cfg.seed, groups, mine).items()}
    params = [q for s in mine for q in stages[s].parameters()]
    optimizer = make_optimizer(params, cfg)
    program = schedule(cfg.option("schedule"), p, m, v)[ctx.rank]
    executor = PipelineExecutor(ctx, cfg, stages, p * v, m, optimizer)
    losses = []
    with ctx.memory.track(*stages.values(), optimizer):
        for step in range(cfg.steps):
            ctx.set_step(step)
            x, y = (t.to(ctx.device) for t in make_batch(cfg.model, cfg.batch_size, step, cfg.seed))
            losses.append(executor.step(program, x, y))
    holds_last = (p * v - 1) in stages
    return RankOutput(
        losses=losses if holds_last else None,
        params={k: t for s in mine for k, t in stages[s].single_state().items()},
        extra={"schedule": cfg.option("schedule"), "micro_batches": m, "stages": mine,
               "layers": {s: list(groups[s]) for s in mine}, "parameters": sum(q.numel() for q in params),
               "program": program})


__all__ = ["OPTIONS", "validate", "run_rank", "SCHEDULES", "schedule"]
