"""3D parallelism (Megatron-LM's DP x TP x PP): data, tensor and pipeline parallelism together on
one ``DeviceMesh`` with named dimensions ("dp", "pp", "tp"), as every large model is trained.

Ranks sit on the grid of ``mpkit.parallel.Layout``: tensor parallel innermost (adjacent ranks
share a node's fastest links, and TP talks inside every layer), pipeline next, data parallel
outermost. Every rank builds the model from the seed; the layers are cut into ``pp`` stages
(balanced by parameter count, as ``pp`` cuts them), each stage's big Linears are split over its
TP group (Megatron's plan, as ``tp`` splits them), the micro-batches of this rank's DP shard flow
through the stages with the chosen schedule, and after the pipeline flush the gradients are
averaged over the DP group (``DataParallel``) — or, with ``zero=True``, reduce-scattered and the
optimizer state sharded over it (``ShardedOptimizer``: ZeRO-1 over the DP dimension).

Options: ``dp``, ``tp``, ``pp`` (their product is the world size), ``schedule``, ``micro_batches``,
``virtual_stages`` (interleaved only), ``zero``.

Long sequences (built-in gpt): ``sp=True`` makes the TP groups sequence-parallel (``strategies.sp``);
``cp`` > 1 adds a context-parallel dimension between dp and pp (``strategies.cp``: ring or Ulysses
``attention``), so the world is dp·cp·pp·tp. Its ranks are the dp index's replicas cut along the
sequence: the gradients are averaged over the dp x cp ranks together (Megatron's data-parallel
group with CP), and on the dp x pp x tp grid (``Run.mesh``) the dp coordinate counts the dp x cp
pairs, dp index outer (rank = ((d·cp + c)·pp + p)·tp + t).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from mpkit.parallel.buckets import DEFAULT_BUCKET_MB, bucket_caps, plan_buckets
from mpkit.parallel.data_parallel import DataParallel
from mpkit.layout import DIMS, Layout
from mpkit.parallel.pipeline import check_schedule_args, pipeline, schedule
from mpkit.pricing.pipeline_program import engine_program
from mpkit.parallel.pipeline.split import Stage, partition
from mpkit.parallel.sequence_parallel import all_reduce_sequence_parallel_gradients
from mpkit.parallel.sharded_optimizer import ShardedOptimizer, shard_numel
from mpkit.parallel.tensor_parallel import full_parameters
from mpkit.simulator.engine import Compute, Wait
from mpkit.pricing.profile import Cost, optimizer_cost
from mpkit.parallel.context_parallel import shard_sequence
from mpkit.strategies import cp as context_strategy
from mpkit.strategies import sp as sequence_strategy
from mpkit.strategies import stages as builtin
from mpkit.strategies import tp as tensor_strategy
from mpkit.strategies.base import (
    RankOutput, Strategy, make_optimizer, optimizer_spec, require_builtin, require_divisible,
)
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import (PipelineLoss, full_batch, group_mean, mixed_precision, optimizer_step, prepare_layers,
                                   run_steps)

OPTIONS = {"dp": 1, "tp": 1, "pp": 1, "schedule": "1f1b", "micro_batches": 2, "virtual_stages": 2, "zero": False,
           "cp": 1, "sp": False, "attention": "ring"}


def layout(cfg) -> Layout:
    """The dp x pp x tp grid; with context parallelism its dp coordinate counts dp x cp pairs."""
    return Layout(dp=cfg.option("dp") * cfg.option("cp"), pp=cfg.option("pp"), tp=cfg.option("tp"))


def validate_long_sequences(cfg):
    """The sp, cp and attention options: the gpt only, sizes that split its sequence and heads."""
    cp, sp = cfg.option("cp"), cfg.option("sp")
    if not isinstance(sp, bool):
        raise ValueError(f"sp={sp!r} must be True (sequence parallelism inside the tp groups) or False")
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp={cp!r} must be a whole number >= 1 (context-parallel ranks per sequence)")
    if cp == 1 and not sp:
        return
    sequence_strategy.require_gpt(cfg, "sp and cp split a transformer's sequence")
    if sp and cfg.option("tp") == 1:
        raise ValueError("sp=True splits the sequence over the tensor-parallel group, and tp=1 has none; use tp >= 2")
    if sp:
        require_divisible(cfg.model.seq_len // cp, cfg.option("tp"), "seq_len/cp", "tp",
                          "sequence parallelism cuts each rank's tokens into tp equal shards")
    if cp > 1:
        context_strategy.check_cp(cfg.model, cp, cfg.option("attention"), "cp")
        if cfg.option("attention") == "ulysses":
            require_divisible(cfg.model.heads // cfg.option("tp"), cp, "heads/tp", "cp",
                              "Ulysses splits each tp rank's heads over the cp ranks")


def validate(cfg):
    require_builtin(cfg, "its tensor-parallel plan is the built-in models' Megatron plan; on your own model "
                         "compose mpkit.parallel's classes on a DeviceMesh")
    validate_long_sequences(cfg)
    grid = layout(cfg)
    if cfg.option("cp") == 1:
        grid.check_world(cfg.world_size)
    elif grid.world_size != cfg.world_size:
        raise ValueError(f"dp*cp*pp*tp = {cfg.option('dp')}*{cfg.option('cp')}*{grid.pp}*{grid.tp} = {grid.world_size} "
                         f"ranks, but world_size={cfg.world_size}; choose sizes whose product is the world size")
    if not isinstance(cfg.option("zero"), bool):
        raise ValueError(f"zero={cfg.option('zero')!r} must be True (ZeRO-1 over the dp dimension) or False")
    if cfg.option("zero") and grid.dp == 1:
        raise ValueError("zero=True shards the optimizer state over the dp dimension, and dp=1 has one replica; "
                         "use dp >= 2 or zero=False")
    tensor_strategy.validate_tp_size(cfg.model, grid.tp, "tp")
    dp = cfg.option("dp")
    require_divisible(cfg.batch_size, dp, "batch_size", "dp", "every data-parallel replica trains on an "
                      "equal slice of the global batch")
    m = cfg.option("micro_batches")
    if cfg.option("schedule") not in ("gpipe", "1f1b", "interleaved"):  # first: before the schedule's own checks
        raise ValueError(f"schedule={cfg.option('schedule')!r}: 3d runs 'gpipe', '1f1b' or 'interleaved'; the "
                         f"zero-bubble, DualPipeV and looped schedules run under strategy 'pp' or "
                         f"mpkit.parallel.pipeline")
    check_schedule_args(cfg.option("schedule"), grid.pp, m, cfg.option("virtual_stages"))
    require_divisible(cfg.batch_size // dp, m, "batch_size/dp", "micro_batches",
                      "each replica's batch is cut into micro-batches")
    v = virtual_stages(cfg)
    builtin.check_stage_count(cfg.model, grid.pp * v, "pp" if v == 1 else f"pp*virtual_stages={grid.pp}*{v}")


def virtual_stages(cfg) -> int:
    return cfg.option("virtual_stages") if cfg.option("schedule") == "interleaved" else 1


def mesh_groups(ctx, grid: Layout) -> dict:
    """{dim: this rank's process group} of the ``DeviceMesh`` of ``grid`` with named dimensions.
    Its groups carry "mesh_dp" etc. as their description, which the trace reads to tell the
    dimensions apart; a dimension spanning the whole world would reuse the default group (no
    name), so it gets a group of its own with the same description."""
    mesh = init_device_mesh(ctx.device.type, grid.shape, mesh_dim_names=DIMS)
    groups = {}
    for dim in DIMS:
        group = mesh.get_group(dim)
        if dist.get_world_size(group) == ctx.world_size > 1:
            group = dist.new_group(list(range(ctx.world_size)), group_desc=f"mesh_{dim}")
        groups[dim] = group
    return groups


def cp_group(ctx, cfg):
    """This rank's context-parallel group: the cp ranks with the same dp index, stage and tp index
    (every rank creates every group, in the same order, as ``new_group`` requires)."""
    dp, cp, pp, tp = (cfg.option(d) for d in ("dp", "cp", "pp", "tp"))
    mine = None
    for d in range(dp):
        for p in range(pp):
            for t in range(tp):
                ranks = [((d * cp + c) * pp + p) * tp + t for c in range(cp)]
                group = dist.new_group(ranks, group_desc="mesh_cp")
                mine = group if ctx.rank in ranks else mine
    return mine


def run_rank(ctx, cfg):
    grid, v, m = layout(cfg), virtual_stages(cfg), cfg.option("micro_batches")
    me = grid.coords(ctx.rank)
    groups = mesh_groups(ctx, grid)  # "dp": the dp x cp ranks that average their gradients
    cp, sp = cfg.option("cp"), cfg.option("sp")
    context = cp_group(ctx, cfg) if cp > 1 else None
    model = cfg.model.build(cfg.seed)
    split = partition(builtin.layer_sizes(model), grid.pp * v)  # on the full model, as pp splits it
    if context is not None:  # first: its hook cuts the embedding to this rank's tokens before sp's does
        context_strategy.attach(model, cfg.option("attention"), context)
    if sp:
        sequence_strategy.shard(model, me["tp"], grid.tp, groups["tp"])
    elif grid.tp > 1:
        tensor_strategy.shard(model, me["tp"], grid.tp, groups["tp"])
    mp = mixed_precision(cfg)  # as tp and pp: the layers wrapped after the split, before the stages are cut
    prepare_layers(cfg, model, mp)
    loss_fn = PipelineLoss(cfg, mp)
    stages = [Stage([model.layers[i] for i in g], g) for g in split]
    pipe = pipeline(stages, schedule=cfg.option("schedule"), micro_batches=m, group=groups["pp"],
                    loss_fn=loss_fn, virtual_stages=v).to(ctx.device)
    if cfg.option("zero"):
        cls, kwargs = optimizer_spec(cfg)
        opt = ShardedOptimizer(pipe.parameters(), cls, group=groups["dp"], average_gradients=True, **kwargs)
        shards = nn.ParameterList(opt.shard_parameters)  # a module, as in zero1: their .grad filed as gradients
        sync, track = opt.reduce_scatter_gradients, (pipe, shards, opt.inner)
    else:
        opt = make_optimizer(pipe.parameters(), cfg)
        sync, track = None, (pipe, opt)
        if grid.dp > 1:  # after the pipeline flush, as Megatron does
            dp = DataParallel(pipe, overlap=False, group=groups["dp"])
            sync, track = dp.finish_gradient_synchronization, (pipe, opt)

    def step(x, y):
        x, y = (t.tensor_split(cfg.option("dp"))[me["dp"] // cp] for t in (x, y))
        if context is not None:
            y = shard_sequence(y, context, dim=1)  # x stays whole: the embedding needs global positions
        loss = loss_fn.step(pipe, x, y)
        if sp:
            all_reduce_sequence_parallel_gradients(pipe, groups["tp"])
        if sync is not None:
            sync()
        if cfg.option("zero"):
            with ctx.trace.span("optimizer"):  # every rank holds other stages, slices or shards: all agree
                if mp.unscale_(opt.shard_parameters, group=dist.group.WORLD):
                    opt.update_shard()
                opt.zero_grad()
            opt.all_gather_parameters()
        else:
            optimizer_step(ctx, opt, mp=mp, params=pipe.parameters(), group=dist.group.WORLD)
        return loss

    losses = run_steps(ctx, cfg, step, full_batch(ctx, cfg), track=track, state=Resumable(pipe, opt, "layers.", mp))
    if pipe.holds_last_stage:
        losses = group_mean(ctx, losses, groups["dp"])  # the replicas' shard losses -> the global batch's
    params = {}
    for s, stage in pipe.stages.items():  # gathered over the TP group: every rank of it takes part
        full = full_parameters(stage)
        params.update({f"layers.{stage.layer_ids[int(k.split('.', 1)[0])]}.{k.split('.', 1)[1]}": t
                       for k, t in full.items()})
    report = me["dp"] == 0 and me["tp"] == 0
    return RankOutput(losses=losses if pipe.holds_last_stage and report else None, params=params if report else {},
                      extra={"coords": me, "stages": sorted(pipe.stages), "parameters": sum(p.numel() for p in pipe.parameters()),
                             "layers": {s: list(stage.layer_ids) for s, stage in pipe.stages.items()},
                             **mp.report()})


def program(pricer):
    """Each rank's step on the grid: its pipeline rank's schedule, every micro-batch's forward and
    backward priced on its stage's tensor-parallel slice with the TP all-reduces in between (as
    ``tp`` profiles them), messages to the ranks of its PP group, and after the flush the gradient
    average over its DP group — buckets (``DataParallel``) or ZeRO-1's reduce-scatter and
    all-gather (``ShardedOptimizer``) — then the optimizer on its parameters."""
    o, grid = pricer.options, Layout(dp=pricer.options["dp"], pp=pricer.options["pp"], tp=pricer.options["tp"])
    if o["cp"] > 1 or o["sp"]:
        raise ValueError("the cost model prices 3d without cp and sp; sim.predict prices 'sp' and 'cp' on their own")
    v = o["virtual_stages"] if o["schedule"] == "interleaved" else 1
    m, count = o["micro_batches"], grid.pp * v
    split = partition([b // 4 for b in pricer.piece(batch=1).param_bytes.values()], count)
    shard = tensor_strategy.shard if grid.tp > 1 else None
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
