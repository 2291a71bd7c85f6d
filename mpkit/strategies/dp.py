"""Data parallel from scratch: every rank holds the whole model and trains on its slice of the
global batch; averaging the gradients makes every rank take the same step as one big device.

The mechanics, in order: (1) build the model everywhere and broadcast rank 0's weights (seeds
match here, but broadcasting is what makes replicas identical in general); (2) each rank runs
forward/backward on ``batch_size / world_size`` samples; (3) gradients are all-reduced and
divided by the world size — packed in flat buckets of at most ``bucket_mb`` MiB (fewer, larger
messages: latency is paid per message), optionally started from backward hooks (``overlap``) so
the network works while autograd still computes; (4) every rank runs the same optimizer step.

world_size=1 is allowed: the all-reduces become no-ops and this is exactly ``single``.
"""
from mpkit.models import build_model
from mpkit.strategies.common import RankOutput, make_optimizer, state_of
from mpkit.strategies.dp_buckets import GradientAllReducer, train_loop, validate_batch, validate_bucket_mb

OPTIONS = {"bucket_mb": 25.0, "overlap": False}


def validate(cfg):
    validate_batch(cfg)
    validate_bucket_mb(cfg)
    if not isinstance(cfg.option("overlap"), bool):
        raise ValueError(f"overlap={cfg.option('overlap')!r} must be True (all-reduce buckets during backward) "
                         f"or False (after backward)")


def broadcast_parameters(ctx, model, src=0):
    """Make every replica start from rank ``src``'s weights."""
    for name, p in model.named_parameters():
        ctx.comm.broadcast(p.detach(), src=src, name=name)


def run_rank(ctx, cfg):
    model = build_model(cfg.model, cfg.seed).to(ctx.device)
    broadcast_parameters(ctx, model)
    reducer = GradientAllReducer(ctx, model.parameters(), cfg.option("bucket_mb"), cfg.option("overlap"))
    optimizer = make_optimizer(model.parameters(), cfg)
    losses = train_loop(ctx, cfg, model, optimizer, track=(model, optimizer, *reducer.buffers),
                        sync_grads=reducer.finish, zero_grad=reducer.zero_grad)
    bucket_bytes = [b.nbytes for b in reducer.buckets]
    extra = {"buckets": len(bucket_bytes), "bucket_bytes": bucket_bytes,
             "all_reduce_bytes_per_step": sum(bucket_bytes), "overlap": cfg.option("overlap")}
    return RankOutput(losses=losses if ctx.rank == 0 else None, params=state_of(model) if ctx.rank == 0 else {},
                      extra=extra)
