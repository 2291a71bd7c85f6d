"""Tensor parallel (Megatron-LM, tp size = world_size) with ``mpkit.parallel.tensor_parallel``:
every rank holds a slice of every big matrix and all ranks work on the same batch at the same time.

gpt: in each block, attention's qkv is column-parallel BY HEADS (rank r computes q, k, v of its
heads only; attention is independent per head, so no communication inside) and proj is
row-parallel; the MLP's up is column-parallel (GeLU is elementwise) and down row-parallel. That
is 2 all-reduces per block forward (g after proj and down) and 2 backward (f before qkv and up).
Embeddings, LayerNorms, the head and the row-parallel biases are replicated; their gradients
agree on all ranks without any gradient all-reduce (identical inputs and output gradients).

mlp: consecutive DenseReLU layers pair up as column -> row (ReLU between is elementwise); with an
odd number of layers the last one (the classifier) stays replicated.

A user's model brings its own plan: ``mpkit.train("tp", model=..., plan={"mlp.up": "column",
"mlp.down": "row"})``. Every rank builds the full model from the seed and keeps its slice, so the
weights equal the single-device model's exactly; ``params`` gathers the slices back. The plan is
applied in one call, so ``validate`` requires its split layers in pairs (``check_pairs``): a column
layer whose output stays split needs a row layer, a row layer a column layer; a column layer with
``Split("column", gather_output=True)`` gives the full output and stands alone.
"""
from __future__ import annotations

import torch.distributed as dist

from mpkit.models import Block
from mpkit.parallel.tensor_parallel import (Split, full_parameters, head_split, plan_targets, sharded_layers, slices,
                                           tensor_parallel, unpaired_columns)
from mpkit.simulator.engine import Compute
from mpkit.pricing.pricing import optimizer
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import full_batch, mixed_precision, plain_step, prepare_layers, run_steps

OPTIONS = {"plan": None}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


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


def validate_tp_size(m, t: int, name: str) -> None:
    """ValueError unless a tensor-parallel size ``t`` splits the built-in model ``m`` evenly."""
    if m.kind == "gpt":
        # heads % t implies the other two for this model (hidden = heads·head_dim), but each is a
        # separate requirement of the split, so each gets its own message.
        checks = [("heads", m.heads, "attention is split by whole heads"),
                  ("hidden", m.hidden, "proj's input features are split"),
                  ("4*hidden", 4 * m.hidden, "the MLP's 4·hidden features are split")]
    elif m.layers >= 2:
        checks = [("hidden", m.hidden, "each column/row pair splits the hidden features")]
    else:
        checks = []
    for size, value, why in checks:
        if value % t:
            raise ValueError(f"tp size {name}={t} does not divide {size}={value} ({why}); "
                             f"use {name} in {_divisors(value)}")


def builtin_plan(cfg, tp: int) -> dict:
    """The Megatron plan of a built-in model (see the module docstring)."""
    if cfg.kind == "gpt":
        return {"layers.*.attn.qkv": Split("column", tuple(head_split(cfg.hidden, tp))),
                "layers.*.attn.proj": "row", "layers.*.mlp.up": "column", "layers.*.mlp.down": "row"}
    plan = {}
    for i in range(0, cfg.layers - 1, 2):
        plan[f"layers.{i}.fc"], plan[f"layers.{i + 1}.fc"] = "column", "row"
    return plan


def shard(model, rank: int, tp: int, group=None):
    """Swap a built-in model's big Linears for this rank's slices, in place (also what the cost
    model profiles, with ``rank=0``)."""
    plan = builtin_plan(model.cfg, tp)
    if plan:
        tensor_parallel(model, plan, group, rank=rank, world_size=tp)
    for layer in model.layers:
        if isinstance(layer, Block):
            layer.attn.heads //= tp  # its forward now views the local qkv as its own heads
    return model


def all_reduce_counts(events, step=0) -> dict:
    """All-reduces of one step by direction, from this rank's trace (f: backward, g: forward)."""
    names = [e.name for e in events if e.kind == "all_reduce" and e.step == step]
    return {"forward": sum(n.startswith("g forward") for n in names),
            "backward": sum(n.startswith("f backward") for n in names)}


def run_rank(ctx, cfg):
    model = cfg.model.build(cfg.seed)
    if cfg.model.builtin:
        shard(model, ctx.rank, ctx.world_size)
    else:
        tensor_parallel(model, cfg.option("plan"))
    # after the split, so a top-level layer the plan swaps is wrapped as its parallel version. Under
    # autocast the sliced matmuls give bf16/fp16 partial sums, all-reduced in that dtype (as Megatron does)
    mp = mixed_precision(cfg)
    prepare_layers(cfg, model, mp)
    model = model.to(ctx.device)
    opt = make_optimizer(model.parameters(), cfg)

    # each rank holds other slices' gradients: an fp16 overflow in one slice skips the step on all
    step = plain_step(ctx, cfg, model, opt, mp, group=dist.group.WORLD)
    losses = run_steps(ctx, cfg, step, full_batch(ctx, cfg), track=(model, opt), state=Resumable(model, opt, mp=mp))
    return RankOutput(losses=losses, params=full_parameters(model), extra={
        "parameters_per_rank": sum(p.numel() for p in model.parameters()),
        "sharded_layers": list(sharded_layers(model)),
        "all_reduces_per_step": all_reduce_counts(ctx.trace.events), **mp.report(),
    })


def program(pricer):
    """The whole batch on every rank, this strategy's own slices and its f/g all-reduces in the
    order its code issues them (recorded while profiling the sliced model)."""
    prof = pricer.piece(tp=pricer.world, shard=shard)
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
