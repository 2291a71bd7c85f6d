"""Context parallel (cp size = world_size), built-in gpt only: the sequence split over the ranks.

Every rank holds the whole model and the whole batch, but only its share of each sequence: with
the load-balanced split (``mpkit.parallel.sequence_positions``) rank i keeps chunks i and 2·CP-1-i
of 2·CP, so under the causal mask every rank does the same attention work. The embedding is
looked up for the whole sequence (positions are global) and cut to this rank's tokens; blocks,
head and loss then run on those tokens only. Attention is the one layer that needs other ranks'
tokens: ``attention="ring"`` passes the key/value blocks around the ring (CP-1 hops, each
overlapping the next block's compute), ``"ulysses"`` swaps sequence for head shards with
all-to-alls. Each rank's loss is the mean over its tokens, so the gradients are averaged over
the group (``DataParallel``: the same bucketed all-reduce as data parallelism — Megatron folds CP
into the data-parallel gradient reduction the same way).
"""
from __future__ import annotations

from mpkit.models import Block
from mpkit.parallel.buckets import DEFAULT_BUCKET_MB, bucket_caps
from mpkit.simulator.engine import Compute, Msg, P2P
from mpkit.strategies.dp import bucket_program
from mpkit.parallel.context_parallel import ATTENTION, context_parallel_attention, sequence_positions, shard_sequence
from mpkit.parallel.data_parallel import DataParallel
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer, state_of
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import (forward_backward, full_batch, group_mean, mixed_precision, optimizer_step,
                                   prepare_layers, run_steps)
from mpkit.strategies.sp import require_gpt

OPTIONS = {"attention": "ring"}


def check_cp(m, cp: int, attention: str, name: str = "world_size") -> None:
    """ValueError unless ``cp`` ranks can split the built-in gpt ``m``'s sequence (and heads, for Ulysses)."""
    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r} is unknown; use one of {', '.join(ATTENTION)}")
    if m.seq_len % (2 * cp):
        raise ValueError(f"seq_len={m.seq_len} cannot be cut into 2·{name}={2 * cp} equal chunks (the load-balanced "
                         f"causal split gives every rank two); use a seq_len that is a multiple of {2 * cp}")
    if attention == "ulysses" and m.heads % cp:
        raise ValueError(f"attention='ulysses' splits the heads over the ranks: heads={m.heads} is not divisible by "
                         f"{name}={cp}; use ring attention or a number of heads divisible by {cp}")


def validate(cfg):
    require_gpt(cfg, "it splits a transformer's sequence, and only attention needs the other ranks' tokens")
    check_cp(cfg.model, cfg.world_size, cfg.option("attention"))


def attach(model, kind: str, group=None):
    """Every block's attention core becomes ring or Ulysses attention over ``group``, in place, and
    a hook cuts the embedding's output (looked up at global positions) to this rank's tokens, so
    ``model(x)`` (or a pipeline stage of it) gives this rank's tokens' outputs."""
    for layer in model.layers:
        if isinstance(layer, Block):
            layer.attn.attention = context_parallel_attention(kind, group)
    model.layers[0].register_forward_hook(lambda _m, _x, out: shard_sequence(out, group, dim=1))
    return model


def run_rank(ctx, cfg, group=None):
    mp = mixed_precision(cfg)  # ring/Ulysses attention inside the autocast blocks: its K/V messages in bf16/fp16
    model = attach(cfg.model.build(cfg.seed), cfg.option("attention"), group)
    prepare_layers(cfg, model, mp)
    model = model.to(ctx.device)
    dp = DataParallel(model, group=group)
    opt = make_optimizer(model.parameters(), cfg)

    def step(x, y):
        loss = forward_backward(ctx, cfg, model, x, shard_sequence(y, group, dim=1), mp)  # x whole: global positions
        dp.finish_gradient_synchronization()  # averaged: every rank holds the same gradients, sees the same overflow
        optimizer_step(ctx, opt, mp=mp, params=model.parameters())
        return loss.item()

    losses = run_steps(ctx, cfg, step, full_batch(ctx, cfg), track=(model, opt), state=Resumable(dp, opt, mp=mp))
    return RankOutput(losses=group_mean(ctx, losses, group), params=state_of(model), extra={
        "positions": sequence_positions(cfg.model.seq_len, ctx.world_size, ctx.rank).tolist(), **mp.report()})


def program(pricer):
    """``dp``'s bucketed step on 1/cp of the tokens (the model profiled on batch/cp whole
    sequences: the same tokens per rank, attention priced on its own tokens' share), with each
    block's attention communication put in front of its forward and its backward: ring hops as
    send/receive pairs to the neighbours (forward cp-1 K/V hops; backward cp-1 K/V hops and cp hops
    of their gradients), or Ulysses' four all-to-alls of one [b, s/cp, h] tensor each way."""
    n, cfg, ring = pricer.world, pricer.cfg, pricer.options["attention"] == "ring"
    local = pricer.batch * cfg.seq_len // n * cfg.hidden * 4  # one [b, s/cp, h] fp32 tensor
    blocks = range(1, cfg.num_layers - 1)

    def ring_hops(rank, what, i, hops):
        right, left = (rank + 1) % n, (rank - 1) % n
        seconds = pricer.p2p_time(rank, right, 2 * local)
        return [P2P((Msg("send", right, (what, i, h, rank), pricer.wire(2 * local), seconds),
                     Msg("recv", left, (what, i, h, left), pricer.wire(2 * local), seconds))) for h in range(hops)]

    def attention(rank, phase, i):
        if not ring:
            return [pricer.collective("all_to_all", pricer.all_ranks, local, ("ulysses", phase, i, c), name=c)
                    for c in "qkvo"]
        if phase == "forward":
            return ring_hops(rank, "kv", i, n - 1)
        return ring_hops(rank, "kv back", i, n - 1) + ring_hops(rank, "dkv", i, n)

    base = bucket_program(pricer, *bucket_caps(DEFAULT_BUCKET_MB), True)[0]
    prof = pricer.piece(batch=pricer.batch // n)
    programs = []
    for rank in range(n):
        out = []
        for ins in base:
            if isinstance(ins, Compute) and ins.kind == "forward":  # per layer, the attention's messages first
                for i in prof.layers:
                    out += attention(rank, "forward", i) if i in blocks else []
                    out.append(Compute("forward", pricer.seconds(prof.cost("forward", [i]), "forward"), name=f"layer {i}"))
                continue
            if isinstance(ins, Compute) and ins.kind == "backward" and int(ins.name.split()[-1]) in blocks:
                out += attention(rank, "backward", int(ins.name.split()[-1]))
            out.append(ins)
        programs.append(out)
    return programs


STRATEGY = Strategy("cp", OPTIONS, validate, run_rank, program, dim="dp",
                    model_defaults=lambda world_size: {"model": "gpt"}, takes_precision=True)
