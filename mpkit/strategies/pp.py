"""Pipeline parallel (``mpkit.parallel.pipeline``): the model cut into stages, the batch into
micro-batches that flow through the stages so that several devices compute at once.

Options: ``schedule`` ("gpipe", "1f1b", "interleaved", "looped_bfs", "interleaved_zb", "zbv" or "dualpipev"),
``micro_batches`` (m; each holds batch_size/m samples, loss scaled by 1/m, gradients accumulated,
one optimizer step per rank per step), ``virtual_stages`` (v model chunks per rank, read by
"interleaved", "looped_bfs" and "interleaved_zb"; "zbv" and "dualpipev" always hold two). Stages of the
built-in models are balanced by parameter count; a user's ``nn.Sequential`` is cut the same way.
``mp`` is this strategy with one micro-batch. The run is ``mpkit.parallel.parallelize`` on a mesh of
``pp = world_size``, which cuts the model and keeps each rank's stages.
"""
from mpkit.parallel.parallelize import Plan
from mpkit.parallel.pipeline import check_schedule_args
from mpkit.parallel.pipeline.schedules import MULTI_CHUNK, chunks_per_rank
from mpkit.strategies.base import Strategy, require_divisible
from mpkit.strategies.checks import check_stages
from mpkit.strategies.loop import parallelized, recipe, train_parallelized
from mpkit.strategies.programs import pipeline_program

OPTIONS = {"schedule": "gpipe", "micro_batches": 4, "virtual_stages": 2}


def virtual_stages(cfg) -> int:
    """Model chunks per rank (1 for gpipe and 1f1b, 2 for zbv and dualpipev)."""
    return chunks_per_rank(cfg.option("schedule"), cfg.option("virtual_stages"))


def validate(cfg):
    name, m = cfg.option("schedule"), cfg.option("micro_batches")
    check_schedule_args(name, cfg.world_size, m, cfg.option("virtual_stages"))
    require_divisible(cfg.batch_size, m, "batch_size", "micro_batches",
                      "each micro-batch holds batch_size/micro_batches samples")
    v = virtual_stages(cfg)
    what = ("world_size" if v == 1 else f"world_size*virtual_stages={cfg.world_size}*{v}" if name in MULTI_CHUNK
            else f"world_size*2={cfg.world_size}*2 (schedule={name!r} holds two stages per rank)")
    try:
        check_stages(cfg, cfg.world_size * v, "stages", name)
    except ValueError as exc:
        if not cfg.model.builtin:  # a learner's model: its message names the stages and the model
            raise
        raise ValueError(f"{what}: {exc}") from None


def run_rank(ctx, cfg):
    name, m = cfg.option("schedule"), cfg.option("micro_batches")
    plan = Plan(**recipe(cfg), schedule=name, micro_batches=m, virtual_stages=cfg.option("virtual_stages"))
    par = parallelized(ctx, cfg, STRATEGY.mesh(cfg), plan)
    out = train_parallelized(ctx, cfg, par)  # each rank holds its stages' gradients: an fp16 overflow skips on all
    mine = sorted(par.stages)
    out.extra.update(schedule=name, micro_batches=m, stages=mine, layers=par.layers,
                     parameters=sum(q.numel() for q in par.model.parameters()), program=par.pipe.program)
    return out


def program(pricer):
    o = pricer.options
    return pipeline_program(pricer, o["schedule"], o["micro_batches"], chunks_per_rank(o["schedule"], o["virtual_stages"]))


STRATEGY = Strategy("pp", OPTIONS, validate, run_rank, program, dim='pp', takes_precision=True)
