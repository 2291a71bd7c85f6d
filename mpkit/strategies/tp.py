"""Tensor parallel (Megatron-LM, tp size = world_size) with ``mpkit.parallel.tensor_parallel``:
every rank holds a slice of every big matrix and all ranks work on the same batch at the same time.

The built-in models are split by their Megatron plan (``mpkit.parallel.plans``): in each gpt
block, attention's qkv column-parallel BY HEADS and proj row-parallel, the MLP's up column- and
down row-parallel; consecutive mlp layers pair up as column -> row. That is 2 all-reduces per
block forward (g after proj and down) and 2 backward (f before qkv and up). Embeddings,
LayerNorms, the head and the row-parallel biases are replicated; their gradients agree on all
ranks without any gradient all-reduce (identical inputs and output gradients). The run is
``mpkit.parallel.parallelize`` on a mesh of ``tp = world_size``.

A user's model brings its own plan: ``mpkit.train("tp", model=..., plan={"mlp.up": "column",
"mlp.down": "row"})``. Every rank builds the full model from the seed and keeps its slice, so the
weights equal the single-device model's exactly; ``params`` gathers the slices back. The plan is
applied in one call, so ``validate`` requires its split layers in pairs (``check_pairs``): a column
layer whose output stays split needs a row layer, a row layer a column layer; a column layer with
``Split("column", gather_output=True)`` gives the full output and stands alone.
"""
from __future__ import annotations

from mpkit.parallel.parallelize import Plan
from mpkit.parallel.plans import split_builtin
from mpkit.parallel.tensor_parallel import plan_targets, sharded_layers, slices, unpaired_columns
from mpkit.pricing.pricing import optimizer
from mpkit.simulator.engine import Compute
from mpkit.strategies.base import Strategy
from mpkit.strategies.checks import validate_tp_size
from mpkit.strategies.loop import builtin_plan, parallelized, recipe, train_parallelized

OPTIONS = {"plan": None}


def validate(cfg):
    plan = cfg.option("plan")
    if not cfg.model.builtin:
        if not isinstance(plan, dict) or not plan:
            raise ValueError("tp on your own model needs plan={'<module name>': 'column' | 'row', ...}, e.g. "
                             "plan={'mlp.up': 'column', 'mlp.down': 'row'}")
        # rank 0's split of the learner's model, here in the caller: a layer the plan misnames, one that is
        # not an nn.Linear, a size tp does not divide, a tied weight or an unpaired split fails before any
        # rank starts
        model = cfg.model.build(cfg.seed)
        targets = plan_targets(model, plan)
        slices(model, targets, rank=0, world_size=cfg.world_size)  # each layer on its own
        check_pairs(targets)
        return
    if plan is not None:
        raise ValueError("the built-in models come with their Megatron plan; plan= is for model=<your factory>")
    validate_tp_size(cfg.model, cfg.world_size, "world_size")


def check_pairs(targets: dict) -> None:
    """This strategy applies the plan in one call, so a column layer whose output stays split
    needs a row layer in the same plan, and a row layer a column layer before it (the public
    ``tensor_parallel`` also takes a plan in several calls). A column layer with
    ``gather_output=True`` gives the full output and needs no partner."""
    split_cols = [n for n, s in targets.items() if s.style == "column" and not s.gather_output]
    rows = [n for n, s in targets.items() if s.style == "row"]
    if split_cols and not rows:
        raise unpaired_columns(split_cols, "gather its full output: Split('column', gather_output=True)")
    if rows and not split_cols:
        raise ValueError(f"plan splits {', '.join(rows)} by rows but no layer by columns: a row-parallel layer takes "
                         f"a slice of its input features, which only a column-parallel layer before it gives; pair "
                         f"them, e.g. {{'mlp.up': 'column', 'mlp.down': 'row'}}")


def all_reduce_counts(events, step=0) -> dict:
    """All-reduces of one step by direction, from this rank's trace (f: backward, g: forward)."""
    names = [e.name for e in events if e.kind == "all_reduce" and e.step == step]
    return {"forward": sum(n.startswith("g forward") for n in names),
            "backward": sum(n.startswith("f backward") for n in names)}


def run_rank(ctx, cfg):
    # Under autocast the sliced matmuls give bf16/fp16 partial sums, all-reduced in that dtype (as Megatron does)
    plan = (builtin_plan(cfg, ctx.world_size) if cfg.model.builtin
            else Plan(tp=cfg.option("plan"), **recipe(cfg)))
    par = parallelized(ctx, cfg, STRATEGY.mesh(cfg), plan)
    out = train_parallelized(ctx, cfg, par, every_rank=True)  # every rank holds the same losses
    out.extra.update(parameters_per_rank=sum(p.numel() for p in par.model.parameters()),
                     sharded_layers=list(sharded_layers(par.model)),
                     all_reduces_per_step=all_reduce_counts(ctx.trace.events))
    return out


def program(pricer):
    """The whole batch on every rank, this strategy's own slices and its f/g all-reduces in the
    order its code issues them (recorded while profiling the sliced model)."""
    prof = pricer.piece(tp=pricer.world, shard=split_builtin)
    program = []
    for phase in ("forward", "backward"):
        table = getattr(prof, phase)
        order = prof.layers if phase == "forward" else reversed(prof.layers)
        for i in order:
            for k, item in enumerate(table[i]):
                if hasattr(item, "flops"):
                    program.append(Compute(phase, pricer.seconds(item, phase), name=f"layer {i}"))
                else:
                    program.append(pricer.collective(item.kind, pricer.all_ranks, item.bytes, (phase, i, k),
                                                     name=item.name))
    program.append(optimizer(pricer, prof))
    return [list(program) for _ in range(pricer.world)]


STRATEGY = Strategy("tp", OPTIONS, validate, run_rank, program, dim='tp', takes_precision=True)
