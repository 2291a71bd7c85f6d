"""Tensor parallel with Megatron sequence parallelism (tp size = world_size), built-in gpt only.

The blocks are split exactly as ``tp`` splits them (qkv by heads, proj by rows, the MLP's up by
columns and down by rows), but with ``mpkit.parallel.sequence_parallel``: between the TP regions
every rank holds only its 1/t of the sequence, so the LayerNorms and residual adds run on s/t
tokens and their activations are 1/t per rank. The embedding output is cut into the ranks'
sequence shards (``scatter_to_sequence_parallel_region``), and the last block's output gathered
back for the replicated head and loss (``gather_from_sequence_parallel_region``). Per block that
is 2 all-gathers and 2 reduce-scatters forward (instead of 2 all-reduces), their conjugates
backward plus the column layers' second all-gather of their saved input shard, and after
backward one all-reduce of the LayerNorm and row-bias gradients, which cover each rank's tokens only.
The run is ``mpkit.parallel.parallelize`` with ``sp=True`` on a mesh of ``tp = world_size``.
"""
from __future__ import annotations

from mpkit.parallel.plans import split_builtin
from mpkit.pricing.pricing import optimizer
from mpkit.simulator.engine import Compute
from mpkit.strategies.base import Strategy, require_divisible
from mpkit.strategies.checks import require_gpt, validate_tp_size
from mpkit.strategies.loop import builtin_plan, parallelized, train_parallelized

OPTIONS = {}


def validate(cfg):
    require_gpt(cfg, "it splits a transformer's sequence between its tensor-parallel layers")
    if cfg.model.experts:
        raise ValueError("strategy='sp' splits dense MLPs; a mixture of experts (experts=) trains with 'ep'")
    if cfg.world_size < 2:
        raise ValueError(f"strategy='sp' needs world_size >= 2 (got {cfg.world_size}): sequence parallelism shards the "
                         "sequence between tensor-parallel ranks, and one rank has no one to share it with; "
                         "train 'single' for one rank")
    validate_tp_size(cfg.model, cfg.world_size, "world_size")
    require_divisible(cfg.model.seq_len, cfg.world_size, "seq_len", "world_size",
                      "sequence parallelism gives every rank an equal shard of the sequence")


def run_rank(ctx, cfg):
    par = parallelized(ctx, cfg, STRATEGY.mesh(cfg), builtin_plan(cfg, ctx.world_size, sp=True))
    out = train_parallelized(ctx, cfg, par, every_rank=True)
    out.extra["parameters_per_rank"] = sum(p.numel() for p in par.model.parameters())
    return out


def program(pricer):
    """Every rank: the tp slices' compute (profiled as ``tp`` splits the model; the LayerNorms are
    priced whole, a small overestimate), with the collectives in the order ``run_rank`` issues
    them. Each all-gather and reduce-scatter is over one whole [b, s, h] activation, as the run
    records it (the ring moves (t-1)/t of it per rank)."""
    prof, cfg, group = pricer.piece(tp=pricer.world, shard=split_builtin), pricer.cfg, pricer.all_ranks
    act = pricer.batch * cfg.seq_len * cfg.hidden * 4

    def comm(kind, name, *key):
        return pricer.collective(kind, group, act, (name, *key), name=name)

    def compute(phase, i, share=1.0):
        return Compute(phase, pricer.seconds(prof.cost(phase, [i]), phase) * share, name=f"layer {i}")

    first, blocks, last = prof.layers[0], prof.layers[1:-1], prof.layers[-1]
    forward = [compute("forward", first)]
    for i in blocks:
        forward += [comm("all_gather", "sp all-gather forward attn.qkv", i), compute("forward", i, 0.5),
                    comm("reduce_scatter", "sp reduce-scatter forward attn.proj", i),
                    comm("all_gather", "sp all-gather forward mlp.up", i), compute("forward", i, 0.5),
                    comm("reduce_scatter", "sp reduce-scatter forward mlp.down", i)]
    forward += [comm("all_gather", "sp all-gather forward head"), compute("forward", last)]
    backward = [compute("backward", last)]
    for i in reversed(blocks):
        backward += [comm("all_gather", "sp all-gather backward mlp.down", i), compute("backward", i, 0.5),
                     comm("all_gather", "sp all-gather again backward mlp.up", i),
                     comm("reduce_scatter", "sp reduce-scatter backward mlp.up", i),
                     comm("all_gather", "sp all-gather backward attn.proj", i), compute("backward", i, 0.5),
                     comm("all_gather", "sp all-gather again backward attn.qkv", i),
                     comm("reduce_scatter", "sp reduce-scatter backward attn.qkv", i)]
    backward += [comm("all_gather", "sp scatter backward embedding"), compute("backward", first)]
    marked = 4 * 6 * cfg.hidden * len(blocks)  # two LayerNorms (2h each), proj's and down's biases (h each)
    grads = pricer.collective("all_reduce", group, marked, ("sp grads",), name="sp layernorm/bias grads")
    return [[*forward, *backward, grads, optimizer(pricer, prof)] for _ in group]


STRATEGY = Strategy("sp", OPTIONS, validate, run_rank, program, dim="tp",
                    model_defaults=lambda world_size: {"model": "gpt"}, takes_precision=True)
