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
"""
from __future__ import annotations

import torch.distributed as dist

from mpkit.models import Block
from mpkit.simulator.engine import Compute
from mpkit.pricing.pricing import optimizer
from mpkit.parallel.mappings import gather_from_sequence_parallel_region, scatter_to_sequence_parallel_region
from mpkit.parallel.sequence_parallel import all_reduce_sequence_parallel_gradients, sequence_parallel
from mpkit.parallel.tensor_parallel import full_parameters
from mpkit.strategies import tp as tensor_strategy
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer, require_divisible
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import (forward_backward, full_batch, mixed_precision, optimizer_step, prepare_layers,
                                   run_steps)

OPTIONS = {}


def require_gpt(cfg, why: str) -> None:
    if not cfg.model.builtin or cfg.model.kind != "gpt":
        raise ValueError(f"strategy={cfg.strategy!r} runs on the built-in gpt ({why}); use model='gpt'")


def validate(cfg):
    require_gpt(cfg, "it splits a transformer's sequence between its tensor-parallel layers")
    if cfg.model.experts:
        raise ValueError("strategy='sp' splits dense MLPs; a mixture of experts (experts=) trains with 'ep'")
    tensor_strategy.validate_tp_size(cfg.model, cfg.world_size, "world_size")
    require_divisible(cfg.model.seq_len, cfg.world_size, "seq_len", "world_size",
                      "sequence parallelism gives every rank an equal shard of the sequence")


def shard(model, rank: int, tp: int, group=None):
    """Each block sequence-parallel over ``group`` with the built-in Megatron plan, in place; hooks
    cut the embedding's output into this rank's sequence shard and gather the whole sequence
    back in front of the head, so ``model(x)`` (or a pipeline stage of it) runs as before."""
    plan = {k.removeprefix("layers.*."): v for k, v in tensor_strategy.builtin_plan(model.cfg, tp).items()}
    for layer in model.layers:
        if isinstance(layer, Block):
            sequence_parallel(layer, plan, group, seq_dim=1, rank=rank, world_size=tp)
            layer.attn.heads //= tp
    model.layers[0].register_forward_hook(
        lambda _m, _x, out: scatter_to_sequence_parallel_region(out, group, seq_dim=1, name="embedding"))
    model.layers[-1].register_forward_pre_hook(  # the head is replicated: backward keeps this rank's shard
        lambda _m, args: (gather_from_sequence_parallel_region(args[0], False, group, seq_dim=1, name="head"),))
    return model


def run_rank(ctx, cfg, group=None):
    mp = mixed_precision(cfg)  # as tp: the layers wrapped after the split
    model = shard(cfg.model.build(cfg.seed), ctx.rank, ctx.world_size, group)
    prepare_layers(cfg, model, mp)
    model = model.to(ctx.device)
    opt = make_optimizer(model.parameters(), cfg)

    def step(x, y):
        loss = forward_backward(ctx, cfg, model, x, y, mp)
        all_reduce_sequence_parallel_gradients(model, group)
        optimizer_step(ctx, opt, mp=mp, params=model.parameters(), group=dist.group.WORLD)
        return loss.item()

    losses = run_steps(ctx, cfg, step, full_batch(ctx, cfg), track=(model, opt), state=Resumable(model, opt, mp=mp))
    return RankOutput(losses=losses, params=full_parameters(model),
                      extra={"parameters_per_rank": sum(p.numel() for p in model.parameters()), **mp.report()})


def program(pricer):
    """Every rank: the tp slices' compute (profiled as ``tp`` splits the model; the LayerNorms are
    priced whole, a small overestimate), with the collectives in the order ``run_rank`` issues
    them. Each all-gather and reduce-scatter is over one whole [b, s, h] activation, as the run
    records it (the ring moves (t-1)/t of it per rank)."""
    prof, cfg, group = pricer.piece(tp=pricer.world, shard=tensor_strategy.shard), pricer.cfg, pricer.all_ranks
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
