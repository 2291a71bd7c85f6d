"""3D parallelism and beyond: data, pipeline, context, tensor and expert parallelism together on one
``DeviceMesh`` with named dimensions, as large models are trained (Megatron-LM's DP x TP x PP, with
Megatron-Core's CP and EP, Llama 3's 4-D layout).

Ranks sit on the grid of ``mpkit.parallel.Layout`` in the rank order ``order`` (outermost first):
the default ``"dp-pp-cp-tp"`` keeps DP outermost (picotron), ``"pp-dp-cp-tp"`` (or ``"megatron"``,
``"torchtitan"``) PP outermost; TP is innermost in both (adjacent ranks share a node's fastest links,
and TP talks inside every layer), CP just outside it. Every rank builds the model from the seed,
and ``mpkit.parallel.parallelize`` applies, in its fixed order: the pipeline cut into ``pp`` stages
(balanced by parameter count, as ``pp`` cuts them; this rank keeps its own), the Megatron plan over
the tp group (``sp=True``: sequence parallel), ring or Ulysses attention over the cp group
(``attention``), the experts over ep neighbouring dp ranks (``ep``, a gpt with ``experts=``), and
data parallelism over dp x cp: the micro-batches of this rank's dp shard flow through the stages
with the chosen schedule, and after the pipeline flush the gradients are averaged
(``DataParallel``), or reduce-scattered with the optimizer state sharded (``zero=True``: ZeRO-1,
``ShardedOptimizer``), or the parameters themselves are sharded (``fsdp=True``: torch's
``fully_shard``, ZeRO-3).

Options: ``dp``, ``pp``, ``cp``, ``tp`` (their product is the world size), ``ep`` (divides dp),
``order``, ``schedule``, ``micro_batches``, ``virtual_stages`` (interleaved only), ``zero``,
``fsdp``, ``sp``, ``attention``, ``use`` (the learner's own pieces: ``mpkit.train`` checks them, see
``mpkit.capstone``). ``Run.mesh`` is the run's ``Layout``.
"""
from __future__ import annotations

import math

import torch

from mpkit.layout import DEFAULT_ORDER, Layout
from mpkit.parallel.buckets import DEFAULT_BUCKET_MB, bucket_caps, plan_buckets
from mpkit.parallel.expert_parallel import check_expert_split
from mpkit.parallel.learner_pieces import Pieces
from mpkit.parallel.pipeline import check_schedule_args, schedule
from mpkit.parallel.pipeline.split import partition
from mpkit.parallel.plans import split_builtin
from mpkit.parallel.sharded_optimizer import shard_numel
from mpkit.pricing.pipeline_program import engine_program
from mpkit.pricing.profile import Cost, optimizer_cost
from mpkit.simulator.engine import Compute, Wait
from mpkit.strategies.base import Strategy, require_builtin, require_divisible
from mpkit.strategies.checks import check_cp, check_stage_count, require_gpt, validate_batch, validate_tp_size
from mpkit.strategies.loop import builtin_plan, parallelized, train_parallelized

OPTIONS = {"dp": 1, "tp": 1, "pp": 1, "schedule": "1f1b", "micro_batches": 2, "virtual_stages": 2, "zero": False,
           "cp": 1, "sp": False, "attention": "ring", "ep": 1, "fsdp": False, "order": DEFAULT_ORDER, "use": None}
SCHEDULES_3D = ("gpipe", "1f1b", "interleaved")  # the zero-bubble, DualPipeV and looped schedules run under 'pp'


def layout_of(options: dict) -> Layout:
    """The run's grid from its options (a size that is no whole number, a bool included, is refused by name)."""
    return Layout(dp=options["dp"], pp=options["pp"], tp=options["tp"], order=options["order"], cp=options["cp"],
                  ep=options["ep"])


def layout(cfg) -> Layout:
    return layout_of(cfg.options)


def validate(cfg):
    require_builtin(cfg, "its tensor-parallel plan is the built-in models' Megatron plan; on your own model "
                         "call mpkit.parallel.parallelize(model, build_mesh(layout), Plan(tp=..., ...))")
    grid = layout(cfg)  # first: dp=True, a size 0 or an unknown order is refused here, by name
    validate_long_sequences(cfg, grid)
    validate_experts(cfg, grid)
    grid.check_world(cfg.world_size)
    validate_data_parallel(cfg, grid)
    validate_tp_size(cfg.model, grid.tp, "tp")
    validate_batch(cfg, grid.dp, "dp")
    m = cfg.option("micro_batches")
    if cfg.option("schedule") not in SCHEDULES_3D:  # first: before the schedule's own checks
        raise ValueError(f"schedule={cfg.option('schedule')!r}: 3d runs 'gpipe', '1f1b' or 'interleaved'; the "
                         f"zero-bubble, DualPipeV and looped schedules run under strategy 'pp' or "
                         f"mpkit.parallel.pipeline")
    check_schedule_args(cfg.option("schedule"), grid.pp, m, cfg.option("virtual_stages"))
    require_divisible(cfg.batch_size // grid.dp, m, "batch_size/dp", "micro_batches",
                      "each replica's batch is cut into micro-batches")
    v = virtual_stages(cfg)
    check_stage_count(cfg.model, grid.pp * v, "pp" if v == 1 else f"pp*virtual_stages={grid.pp}*{v}")
    validate_pieces(cfg, grid)


def validate_pieces(cfg, grid: Layout):
    """``use``: the learner's pieces (``mpkit.train`` checked them), each where the run has its place."""
    pieces = cfg.option("use")
    if pieces is None:
        return
    if not isinstance(pieces, Pieces):
        raise ValueError("use= takes {piece name: your function}, checked by mpkit.train('3d', use=...); "
                         "mpkit.training.train does not check pieces")
    if cfg.precision != "fp32" or cfg.option("sp") or grid.cp > 1 or grid.ep > 1 or cfg.option("fsdp"):
        raise ValueError("use= runs your pieces in fp32 without sp, cp, ep and fsdp (the exercises' setting): "
                         "leave those options at their defaults")
    if pieces.gradient_sync is not None and pieces.bucketed_gradient_sync is not None:
        raise ValueError("use= takes one gradient sync: 'gradient_sync' (average_gradients) or 'bucketed_gradient_sync' "
                         "(BucketedGradientSync), not both")
    unpipelined = grid.pp == 1 and cfg.option("micro_batches") == 1  # one backward a step: what its hooks count on
    places = {"gradient_sync": (grid.size("dp_cp") > 1 and not cfg.option("zero"), "dp >= 2 and zero=False"),
              "bucketed_gradient_sync": (grid.size("dp_cp") > 1 and not cfg.option("zero") and unpipelined,
                                         "dp >= 2, zero=False, pp=1 and micro_batches=1"),
              "zero1_step": (grid.size("dp_cp") > 1 and cfg.option("zero"), "dp >= 2 and zero=True"),
              "f_and_g": (grid.tp > 1, "tp >= 2"), "megatron_mlp": (grid.tp > 1, "tp >= 2"),
              "pipeline_schedule": (grid.pp > 1 and cfg.option("schedule") == "1f1b", "pp >= 2 and schedule='1f1b'")}
    for name in pieces.names():
        fits, needs = places[name]
        if not fits:
            raise ValueError(f"use={{'{name}': ...}}: this run has no place for it; it runs with {needs}")


def validate_long_sequences(cfg, grid: Layout):
    """The sp, cp and attention options: the gpt only, sizes that split its sequence and heads."""
    sp = cfg.option("sp")
    if not isinstance(sp, bool):
        raise ValueError(f"sp={sp!r} must be True (sequence parallelism inside the tp groups) or False")
    if grid.cp == 1 and not sp:
        return
    require_gpt(cfg, "sp and cp split a transformer's sequence")
    if sp and grid.tp == 1:
        raise ValueError("sp=True splits the sequence over the tensor-parallel group, and tp=1 has none; use tp >= 2")
    if sp:
        require_divisible(cfg.model.seq_len // grid.cp, grid.tp, "seq_len/cp", "tp",
                          "sequence parallelism cuts each rank's tokens into tp equal shards")
    if grid.cp > 1:
        check_cp(cfg.model, grid.cp, cfg.option("attention"), "cp")
        if cfg.option("attention") == "ulysses":
            require_divisible(cfg.model.heads // grid.tp, grid.cp, "heads/tp", "cp",
                              "Ulysses splits each tp rank's heads over the cp ranks")


def validate_experts(cfg, grid: Layout):
    """ep > 1 needs a mixture of experts to spread; experts and sequence splitting do not mix here."""
    experts = cfg.model.experts if cfg.model.builtin else 0
    if grid.ep > 1 and not experts:
        raise ValueError(f"ep={grid.ep} spreads the experts of a mixture of experts: pass model='gpt' with "
                         f"experts=<a multiple of ep>, e.g. experts={2 * grid.ep}")
    if not experts:
        return
    check_expert_split(experts, grid.ep)
    if cfg.option("sp") or grid.cp > 1:
        raise ValueError("a mixture of experts picks at most `capacity` tokens per expert and sequence; sp=True and "
                         "cp > 1 cut the sequence, so each rank would drop other tokens than one device: use sp=False "
                         "and cp=1 with experts=")


def validate_data_parallel(cfg, grid: Layout):
    """zero (ZeRO-1) and fsdp (ZeRO-3): one of them, over dp x cp replicas, without ep or sp."""
    zero, fsdp = cfg.option("zero"), cfg.option("fsdp")
    if not isinstance(zero, bool):
        raise ValueError(f"zero={zero!r} must be True (ZeRO-1 over the dp x cp ranks) or False")
    if not isinstance(fsdp, bool):
        raise ValueError(f"fsdp={fsdp!r} must be True (torch's fully_shard, ZeRO-3, over the dp x cp ranks) or False")
    for name, on in (("zero", zero), ("fsdp", fsdp)):
        if not on:
            continue
        if zero and fsdp:
            raise ValueError("zero=True (ZeRO-1: optimizer state sharded) and fsdp=True (ZeRO-3: everything sharded) "
                             "exclude each other; pick one")
        if grid.size("dp_cp") == 1:
            raise ValueError(f"{name}=True shards over the dp x cp ranks, and dp*cp = 1 has one replica; use dp >= 2 "
                             f"or {name}=False")
        if grid.ep > 1 or cfg.option("sp"):
            what = f"ep={grid.ep} (experts and the rest average over different groups)" if grid.ep > 1 else \
                "sp=True (the LayerNorm gradients are summed over tp after backward)"
            raise ValueError(f"{name}=True with {what} is not supported: use {name}=False (replicas with "
                             f"DataParallel)")


def virtual_stages(cfg) -> int:
    return cfg.option("virtual_stages") if cfg.option("schedule") == "interleaved" else 1


def run_rank(ctx, cfg):
    grid = layout(cfg)
    dp = "fsdp" if cfg.option("fsdp") else "zero1" if cfg.option("zero") else "replicate"
    plan = builtin_plan(cfg, grid.tp, sp=cfg.option("sp"), attention=cfg.option("attention"),
                        schedule=cfg.option("schedule"), micro_batches=cfg.option("micro_batches"),
                        virtual_stages=cfg.option("virtual_stages"), dp=dp, overlap=False,  # reduce after the flush
                        pieces=cfg.option("use"))
    par = parallelized(ctx, cfg, grid, plan)
    out = train_parallelized(ctx, cfg, par)
    out.extra.update(coords=par.mesh.coords, stages=sorted(par.stages),
                     parameters=sum(p.numel() for p in par.model.parameters()),
                     layers=par.layers)
    if cfg.option("use") is not None:
        out.extra["pieces"] = dict(cfg.option("use").calls)  # how often each of the learner's pieces ran here
    return out


def program(pricer):
    """Each rank's step on the grid: its pipeline rank's schedule, every micro-batch's forward and
    backward priced on its stage's tensor-parallel slice with the TP all-reduces in between (as
    ``tp`` profiles them), messages to the ranks of its PP group, and after the flush the gradient
    average over its DP group — buckets (``DataParallel``) or ZeRO-1's reduce-scatter and
    all-gather (``ShardedOptimizer``) — then the optimizer on its parameters."""
    o, grid = pricer.options, layout_of(pricer.options)
    unpriced = [f"{k}={o[k]!r}" for k in ("cp", "ep") if o[k] > 1] + [f"{k}=True" for k in ("sp", "fsdp") if o[k]]
    if unpriced:
        raise ValueError(f"the cost model prices 3d without cp and sp, ep or fsdp ({', '.join(unpriced)}); "
                         f"sim.predict prices 'cp', 'sp', 'ep' and 'fsdp' on their own")
    v = o["virtual_stages"] if o["schedule"] == "interleaved" else 1
    m, count = o["micro_batches"], grid.pp * v
    split = partition([b // 4 for b in pricer.piece(batch=1).param_bytes.values()], count)
    shard = split_builtin if grid.tp > 1 else None
    profs = {s: pricer.piece(g.start, g.stop, batch=pricer.batch // grid.dp // m, tp=grid.tp, shard=shard)
             for s, g in enumerate(split)}
    lists = schedule(o["schedule"], grid.pp, m, v)
    extra = pricer.hw.stage_overhead

    def message(kind, stage, src, dst):
        prof = profs[stage]
        nbytes = prof.input_bytes if kind == "act" else prof.output_bytes[split[stage].stop - 1]
        return pricer.wire(nbytes), pricer.p2p_time(src, dst, nbytes)

    programs = []
    for rank in range(grid.world_size):
        tp_group, dp_group = tuple(grid.group_of(rank, "tp")), tuple(grid.group_of(rank, "dp"))

        def phase(kind, tp_group=tp_group):
            def instructions(s, mb):
                out = [Compute(kind, pricer.hw.stage_overhead[kind] * pricer.slowdown)] if extra[kind] else []
                for i in (split[s] if kind == "forward" else reversed(split[s])):
                    for k, item in enumerate(getattr(profs[s], kind)[i]):
                        if hasattr(item, "flops"):
                            out.append(Compute(kind, pricer.seconds(item, kind)))
                        else:
                            out.append(pricer.collective(item.kind, tp_group, item.bytes, (kind, s, mb, i, k, tp_group),
                                                         name=item.name))
                return out
            return instructions

        def step_after_flush(_rank, dp_group=dp_group, rank=rank):
            mine = [s for s in range(grid.coords(rank)["pp"], count, grid.pp)]
            cost = sum((profs[s].optimizer for s in mine), Cost())
            shapes = [shape for s in mine for i in split[s] for shape in profs[s].layer_shapes[i]]
            if grid.dp == 1:
                return [Compute("optimizer", pricer.seconds(cost, "optimizer"))]
            if o["zero"]:
                per_rank = shard_numel(sum(math.prod(sh) for sh in shapes), grid.dp)
                flat = per_rank * grid.dp * 4
                return [pricer.collective("reduce_scatter", dp_group, flat, ("grads", dp_group), name="grads"),
                        Compute("optimizer", pricer.seconds(optimizer_cost(((per_rank,),)), "optimizer")),
                        pricer.collective("all_gather", dp_group, flat, ("params", dp_group), name="params")]
            with torch.device("meta"):
                params = [torch.empty(sh) for sh in shapes]
            buckets = plan_buckets(params, *bucket_caps(DEFAULT_BUCKET_MB))  # DataParallel's defaults, as the run uses
            out = [pricer.collective("all_reduce", dp_group, sum(t.numel() * 4 for t in b), ("bucket", k, dp_group),
                                     True, f"bucket {k}") for k, b in enumerate(buckets)]
            out += [Wait(("bucket", k, dp_group)) for k in range(len(buckets))]
            return out + [Compute("optimizer", pricer.seconds(cost, "optimizer"))]

        peers = grid.group_of(rank, "pp")
        programs.append(engine_program(lists[grid.coords(rank)["pp"]], grid.coords(rank)["pp"], phase("forward"),
                                       phase("backward"), message, step_after_flush, peers, count - 1))
    return programs


STRATEGY = Strategy("3d", OPTIONS, validate, run_rank, program, layout=layout, takes_precision=True)
