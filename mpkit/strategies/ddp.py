"""PyTorch's own data parallel, ``DistributedDataParallel``, on the same model and data as ``dp``.

DDP does what ``dp`` spells out — broadcast at construction, buckets of ``bucket_mb`` MiB
(``bucket_cap_mb``; its first bucket is capped at 1 MiB so communication starts early, and it
re-orders buckets after the first step by the order gradients really arrived), all-reduces
launched from autograd hooks during backward — in C++. To make its timeline comparable with
``dp``'s, a comm hook wraps the default all-reduce hook and logs one ``all_reduce`` event per
bucket: start when DDP hands the bucket over, end when its future completes.

``find_unused_parameters=True`` is DDP's own option (a model with a branch some steps leave
unused): DDP then all-reduces a bitmap of the parameters each rank used, inside its C++, so
the timeline does not show it; the cost model prices it as ``dp``'s used-parameter mask.
"""
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from mpkit.parallel.buckets import FIRST_BUCKET_MB, MiB, check_bucket_mb
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer, state_of
from mpkit.strategies.dp import bucket_program, check_flags, validate_batch
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import build_model, group_mean, local_batch, mixed_precision, plain_step, run_steps

OPTIONS = {"bucket_mb": 25.0, "find_unused_parameters": False}


def validate(cfg):
    validate_batch(cfg)
    check_bucket_mb(cfg.option("bucket_mb"))
    check_flags(cfg, "find_unused_parameters")


class HookState:
    def __init__(self, ctx):
        self.ctx = ctx
        self.bucket_bytes = {}  # step -> [bytes of each bucket, in the order DDP reduced them]


def traced_allreduce_hook(state, bucket):
    """DDP comm hook: the default (divide by world size, all-reduce), logged as one event."""
    ctx = state.ctx
    start = ctx.trace.now()
    buffer = bucket.buffer()
    nbytes, index = buffer.numel() * buffer.element_size(), bucket.index()
    state.bucket_bytes.setdefault(ctx.trace.step, []).append(nbytes)

    def done(fut):
        ctx.trace.record("all_reduce", start, ctx.trace.now(), bytes=nbytes, name=f"bucket {index}")
        return fut.value()

    return default_hooks.allreduce_hook(None, bucket).then(done)


def run_rank(ctx, cfg):
    mp = mixed_precision(cfg)  # DDP all-reduces the fp32 gradients: every rank sees the same overflow
    model = build_model(ctx, cfg, mp)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                                  bucket_cap_mb=cfg.option("bucket_mb"),
                                  find_unused_parameters=cfg.option("find_unused_parameters"))
    hook_state = HookState(ctx)
    ddp.register_comm_hook(hook_state, traced_allreduce_hook)
    opt = make_optimizer(ddp.parameters(), cfg)

    losses = group_mean(ctx, run_steps(ctx, cfg, plain_step(ctx, cfg, ddp, opt, mp), local_batch(ctx, cfg),
                                       track=(model, opt), state=Resumable(ddp, opt, mp=mp)))
    buckets = hook_state.bucket_bytes[cfg.steps - 1]  # after DDP's rebuild at the end of step 0
    extra = {"buckets": len(buckets), "bucket_bytes": buckets, "all_reduce_bytes_per_step": sum(buckets),
             **mp.report()}
    return RankOutput(losses=losses if ctx.rank == 0 else None, params=state_of(model) if ctx.rank == 0 else {},
                      extra=extra)


def program(pricer):
    # torch DDP caps its first bucket at 1 MiB whatever bucket_cap_mb is (larger or smaller)
    return bucket_program(pricer, int(pricer.options["bucket_mb"] * MiB), int(FIRST_BUCKET_MB * MiB), True,
                          pricer.options["find_unused_parameters"])


STRATEGY = Strategy("ddp", OPTIONS, validate, run_rank, program, takes_precision=True)
