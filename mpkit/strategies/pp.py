"""Pipeline parallel (``mpkit.parallel.pipeline``): the model cut into stages, the batch into
micro-batches that flow through the stages so that several devices compute at once.

Options: ``schedule`` ("gpipe", "1f1b", "interleaved", "looped_bfs", "interleaved_zb", "zbv" or "dualpipev"),
``micro_batches`` (m; each holds batch_size/m samples, loss scaled by 1/m, gradients accumulated,
one optimizer step per rank per step), ``virtual_stages`` (v model chunks per rank, read by
"interleaved", "looped_bfs" and "interleaved_zb"; "zbv" and "dualpipev" always hold two). Stages of the
built-in models are balanced by parameter count (``stages.py``); a user's ``nn.Sequential`` is
cut the same way. ``mp`` is this strategy with one micro-batch.
"""
import torch.distributed as dist

from mpkit.parallel.pipeline import (check_every_rank_trains, check_no_tie_across_ranks, check_schedule_args, pipeline,
                                     schedule)
from mpkit.parallel.pipeline.schedules import MULTI_CHUNK, chunks_per_rank, placement
from mpkit.parallel.pipeline.split import partition, split_layers
from mpkit.pricing.pipeline_program import engine_programs
from mpkit.pricing.profile import Cost
from mpkit.strategies import stages as builtin
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer, require_divisible
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import PipelineLoss, full_batch, mixed_precision, optimizer_step, prepare_layers, run_steps

OPTIONS = {"schedule": "gpipe", "micro_batches": 4, "virtual_stages": 2}


def virtual_stages(cfg) -> int:
    """Model chunks per rank (1 for gpipe and 1f1b, 2 for zbv and dualpipev)."""
    return chunks_per_rank(cfg.option("schedule"), cfg.option("virtual_stages"))


def check_stages(cfg, count: int, what: str) -> None:
    if cfg.model.builtin:
        builtin.check_stage_count(cfg.model, count, what)
        return
    # a learner's model is built here, in the caller: a model that cannot be cut fails before any rank starts
    stages = all_stages(cfg, count)
    layers = cfg.model.layers_of(cfg.model.build(cfg.seed))
    trained = [f"{i}: {type(layer).__name__}" for i, layer in enumerate(layers) if any(True for _ in layer.parameters())]
    # per rank, not per stage: under interleaving a rank holds stages r, r+p, ... (pipeline keeps
    # s % p), and a parameter-free stage there is fine if another of them trains
    where = placement(cfg.option("schedule"), cfg.world_size, count // cfg.world_size) if cfg.strategy == "pp" else None
    check_every_rank_trains(stages, cfg.world_size, f"the rule: the model's top-level layers are cut into {count} "
                            f"stages balanced by parameter count, and every rank needs a layer with parameters. "
                            f"This model has {len(trained)} ({', '.join(trained)}): use at most {len(trained)} "
                            f"stages, or put each activation inside a block with its layer, e.g. "
                            f"nn.Sequential(nn.Sequential(nn.Linear(...), nn.ReLU()), ...)", where)
    check_no_tie_across_ranks(stages, cfg.world_size, where)


def validate(cfg):
    name, m = cfg.option("schedule"), cfg.option("micro_batches")
    check_schedule_args(name, cfg.world_size, m, cfg.option("virtual_stages"))
    require_divisible(cfg.batch_size, m, "batch_size", "micro_batches",
                      "each micro-batch holds batch_size/micro_batches samples")
    v = virtual_stages(cfg)
    what = ("world_size" if v == 1 else f"world_size*virtual_stages={cfg.world_size}*{v}" if name in MULTI_CHUNK
            else f"world_size*2={cfg.world_size}*2 (schedule={name!r} holds two stages per rank)")
    try:
        check_stages(cfg, cfg.world_size * v, "stages")
    except ValueError as exc:
        if not cfg.model.builtin:  # a learner's model: its message names the stages and the model
            raise
        raise ValueError(f"{what}: {exc}") from None


def all_stages(cfg, count: int, mp=None) -> list:
    """Every stage of the model, built from the seed (each rank keeps its own; see ``pipeline``),
    with the run's precision and recomputation applied to each layer."""
    model = cfg.model.build(cfg.seed)
    prepare_layers(cfg, model, mp or mixed_precision(cfg))
    return split_layers(cfg.model.layers_of(model), count)


def train_pipeline(ctx, cfg, name, m, v):
    """mp and pp: the stages, the schedule's program on this rank, the one loop; ``RankOutput``."""
    p = ctx.world_size
    mp = mixed_precision(cfg)
    loss_fn = PipelineLoss(cfg, mp)
    pipe = pipeline(all_stages(cfg, p * v, mp), schedule=name, micro_batches=m, loss_fn=loss_fn,
                    virtual_stages=v if name in MULTI_CHUNK else 1)
    pipe.to(ctx.device)
    opt = make_optimizer(pipe.parameters(), cfg)

    def step(x, y):
        loss = loss_fn.step(pipe, x, y)
        # each rank holds its stages' gradients: an overflow on one rank skips the step on all
        optimizer_step(ctx, opt, mp=mp, params=pipe.parameters(), group=dist.group.WORLD)
        return loss

    losses = run_steps(ctx, cfg, step, full_batch(ctx, cfg), track=(pipe, opt),
                       state=Resumable(pipe, opt, "layers." if cfg.model.builtin else "", mp))
    prefix = "layers." if cfg.model.builtin else ""
    mine = sorted(pipe.stages)
    return RankOutput(
        losses=losses if pipe.holds_last_stage else None,
        params={k: t for s in mine for k, t in pipe.stages[s].named_as_original(prefix).items()},
        extra={"schedule": name, "micro_batches": m, "stages": mine,
               "layers": {s: list(pipe.stages[s].layer_ids) for s in mine},
               "parameters": sum(q.numel() for q in pipe.parameters()), "program": pipe.program, **mp.report()})


def run_rank(ctx, cfg):
    return train_pipeline(ctx, cfg, cfg.option("schedule"), cfg.option("micro_batches"), virtual_stages(cfg))


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

    def optimizer(rank):
        return pricer.seconds(sum((profs[s].optimizer for s in range(p * v) if where[s] == rank), Cost()), "optimizer")

    def compute(phase):
        extra = pricer.hw.stage_overhead[phase] * pricer.slowdown  # the executor's own work per micro-batch
        return lambda s, mb: pricer.seconds(profs[s].cost(phase), phase) + extra

    def weight(s, mb):  # W of a split backward: the weight-gradient half of the backward's matmuls
        return compute("backward")(s, mb) / 2

    return engine_programs(schedule(name, p, m, v), compute("forward"), compute("backward"), message, optimizer,
                           weight)


def program(pricer):
    o = pricer.options
    return pipeline_program(pricer, o["schedule"], o["micro_batches"], chunks_per_rank(o["schedule"], o["virtual_stages"]))


STRATEGY = Strategy("pp", OPTIONS, validate, run_rank, program, dim='pp', takes_precision=True)
