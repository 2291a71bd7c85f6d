"""Data parallel from scratch (``mpkit.parallel.DataParallel``): every rank holds the whole model
and trains on its slice of the global batch; bucketed all-reduces average the gradients, so every
rank takes the same step as one big device. world_size=1 is allowed: the all-reduces become
no-ops and this is exactly ``single``.

Options: ``bucket_mb`` (MiB per all-reduce, as DDP's ``bucket_cap_mb``; 0 = one per parameter
tensor), ``first_bucket_mb`` (the first bucket's cap, 1 MiB as in DDP, so the first all-reduce
starts early) and ``overlap`` (start each bucket's all-reduce from a backward hook the moment it
is full, or all after backward), ``find_unused_parameters`` (your model has a branch a step may
not use: DataParallel's one extra all-reduce of a used-parameter mask per step, as DDP's).
"""
from __future__ import annotations

from mpkit.parallel.buckets import bucket_caps, check_bucket_mb, plan_buckets
from mpkit.parallel.data_parallel import DataParallel
from mpkit.simulator.engine import Compute, Wait
from mpkit.pricing.pricing import optimizer
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer, require_divisible, state_of
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import (build_model, forward_backward, group_mean, local_batch, mixed_precision,
                                   optimizer_step, run_steps)

OPTIONS = {"bucket_mb": 25.0, "first_bucket_mb": 1.0, "overlap": False, "find_unused_parameters": False}


def validate_batch(cfg) -> None:
    require_divisible(cfg.batch_size, cfg.world_size, "batch_size", "world_size",
                      "every rank trains on an equal slice of the global batch")


FLAGS = {"overlap": "True (all-reduce buckets during backward) or False (after backward)",
         "find_unused_parameters": "True (some steps leave parameters without a gradient) or False"}


def check_flags(cfg, *names):
    """A ValueError for an option of ``FLAGS`` that is not a bool (``'no'`` would read as True)."""
    for name in names:
        if not isinstance(cfg.option(name), bool):
            raise ValueError(f"{name}={cfg.option(name)!r} must be {FLAGS[name]}")


def validate(cfg):
    validate_batch(cfg)
    check_bucket_mb(cfg.option("bucket_mb"))
    check_bucket_mb(cfg.option("first_bucket_mb"), "first_bucket_mb")
    check_flags(cfg, "overlap", "find_unused_parameters")


def run_rank(ctx, cfg):
    mp = mixed_precision(cfg)
    model = build_model(ctx, cfg, mp)
    dp = DataParallel(model, bucket_mb=cfg.option("bucket_mb"), overlap=cfg.option("overlap"),
                      first_bucket_mb=cfg.option("first_bucket_mb"),
                      find_unused_parameters=cfg.option("find_unused_parameters"))
    opt = make_optimizer(model.parameters(), cfg)

    def step(x, y):
        loss = forward_backward(ctx, cfg, dp, x, y, mp)
        dp.finish_gradient_synchronization()
        # set_to_none=False keeps .grad as views of the buckets between steps; every rank holds the
        # same averaged gradients, so an overflow is seen alike everywhere (no group to ask)
        optimizer_step(ctx, opt, set_to_none=False, mp=mp, params=model.parameters())
        return loss.item()

    losses = run_steps(ctx, cfg, step, local_batch(ctx, cfg), track=(model, opt), state=Resumable(dp, opt, mp=mp))
    bucket_bytes = [b.nbytes for b in dp.buckets]
    extra = {"buckets": len(bucket_bytes), "bucket_bytes": bucket_bytes,
             "all_reduce_bytes_per_step": sum(bucket_bytes), "overlap": cfg.option("overlap"), **mp.report()}
    losses = group_mean(ctx, losses)
    return RankOutput(losses=losses if ctx.rank == 0 else None, params=state_of(model) if ctx.rank == 0 else {},
                      extra=extra)


def bucket_program(pricer, cap_bytes, first_cap, overlap, find_unused=False):
    """One data-parallel step (dp, ddp): forward, backward (layer by layer when buckets start
    from backward hooks), the buckets of ``plan_buckets`` on the model's real parameters, each
    all-reduced once the backward of the earliest layer it holds is done, then the optimizer;
    ``find_unused``: the used-parameter mask's all-reduce (a float per parameter tensor) after
    every bucket's (so ranks that used different branches issue them in one order)."""
    prof = pricer.piece(batch=pricer.batch // pricer.world)
    model = pricer.meta_model()
    layer_of = {p: i for i, layer in enumerate(model.layers) for p in layer.parameters()}
    buckets = plan_buckets([p for p in model.parameters() if p.requires_grad], cap_bytes, first_cap)
    done_at = [min(layer_of[p] for p in bucket) for bucket in buckets]
    sizes = [sum(p.numel() * p.element_size() for p in bucket) for bucket in buckets]

    def all_reduce(k):
        return pricer.collective("all_reduce", pricer.all_ranks, sizes[k], ("bucket", k), True, f"bucket {k}")

    program = [Compute("forward", pricer.seconds(prof.cost("forward"), "forward"))]
    if overlap:
        for i in reversed(prof.layers):
            program.append(Compute("backward", pricer.seconds(prof.cost("backward", [i]), "backward"), name=f"layer {i}"))
            program += [all_reduce(k) for k in range(len(buckets)) if done_at[k] == i]
    else:
        program.append(Compute("backward", pricer.seconds(prof.cost("backward"), "backward")))
    if not overlap:
        program += [all_reduce(k) for k in range(len(buckets))]
    program += [Wait(("bucket", k)) for k in range(len(buckets))]
    if find_unused:
        tensors = sum(len(bucket) for bucket in buckets)
        program.append(pricer.collective("all_reduce", pricer.all_ranks, 4 * tensors, ("mask",),
                                         name="used-parameter mask"))
    program.append(optimizer(pricer, prof))
    return [list(program) for _ in range(pricer.world)]


def program(pricer):
    o = pricer.options
    return bucket_program(pricer, *bucket_caps(o["bucket_mb"], o["first_bucket_mb"]), o["overlap"],
                          o["find_unused_parameters"])


STRATEGY = Strategy("dp", OPTIONS, validate, run_rank, program, takes_precision=True)

__all__ = ["STRATEGY", "bucket_program", "validate_batch"]
