"""Attempts for accumulate_gradients(ctx, ddp, micro_batches): the whole batch's per-token mean
gradient on every rank, one all-reduce (per bucket) per k micro-steps."""
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F


# ---------------------------------------------------------------- correct
def sum_reduction_over_tokens(ctx, ddp, micro_batches):
    """Summed token losses divided by the rank's token count."""
    total = sum(y.numel() for _, y in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        ctx_mgr = ddp.no_sync() if i + 1 < len(micro_batches) else contextlib.nullcontext()
        with ctx_mgr:
            (F.cross_entropy(ddp(x), y, reduction="sum") / total).backward()
    ddp.finish_gradient_synchronization()


def global_token_count(ctx, ddp, micro_batches):
    """The global token count from a one-element all-reduce, then sum-loss · N / T (DDP averages)."""
    count = torch.tensor([float(sum(len(y) for _, y in micro_batches))])
    dist.all_reduce(count)
    scale = ctx.world_size / count.item()
    last = len(micro_batches) - 1
    for i, (x, y) in enumerate(micro_batches):
        if i < last:
            with ddp.no_sync():
                (F.cross_entropy(ddp(x), y, reduction="sum") * scale).backward()
        else:
            (F.cross_entropy(ddp(x), y, reduction="sum") * scale).backward()
    ddp.finish_gradient_synchronization()


def forward_and_backward_inside_no_sync(ctx, ddp, micro_batches):
    """DDP style: no_sync() wraps the forward too; the last micro-batch goes first out of it."""
    total = sum(len(y) for _, y in micro_batches)
    *early, last = micro_batches
    with ddp.no_sync():
        for x, y in early:
            loss = F.cross_entropy(ddp(x), y) * len(y) / total
            loss.backward()
    x, y = last
    (F.cross_entropy(ddp(x), y) * len(y) / total).backward()
    ddp.finish_gradient_synchronization()


CORRECT = [sum_reduction_over_tokens, global_token_count, forward_and_backward_inside_no_sync]


# ---------------------------------------------------------------- wrong
def divide_by_k(ctx, ddp, micro_batches):
    """Mean of micro-batch means: right only when micro-batches hold the same number of tokens."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with (ddp.no_sync() if i < k - 1 else contextlib.nullcontext()):
            (F.cross_entropy(ddp(x), y) / k).backward()
    ddp.finish_gradient_synchronization()


def sync_every_micro_step(ctx, ddp, micro_batches):
    """Correct values, but finishes the sync after every micro-batch: k all-reduces."""
    total = sum(len(y) for _, y in micro_batches)
    for x, y in micro_batches:
        (F.cross_entropy(ddp(x), y) * len(y) / total).backward()
        ddp.finish_gradient_synchronization()


def no_no_sync(ctx, ddp, micro_batches):
    """Every backward outside no_sync(): the second one reaches a bucket already sent."""
    total = sum(len(y) for _, y in micro_batches)
    for x, y in micro_batches:
        (F.cross_entropy(ddp(x), y) * len(y) / total).backward()
    ddp.finish_gradient_synchronization()


def forgot_finish(ctx, ddp, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with (ddp.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext()):
            (F.cross_entropy(ddp(x), y) * len(y) / total).backward()


def not_scaled(ctx, ddp, micro_batches):
    """Each micro-batch's mean loss as it is: the gradients add up k means."""
    for i, (x, y) in enumerate(micro_batches):
        with (ddp.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext()):
            F.cross_entropy(ddp(x), y).backward()
    ddp.finish_gradient_synchronization()


def first_micro_batch_syncs(ctx, ddp, micro_batches):
    """The sync is launched by the first backward, so the later micro-batches stay local."""
    total = sum(len(y) for _, y in micro_batches)
    (x0, y0), *rest = micro_batches
    (F.cross_entropy(ddp(x0), y0) * len(y0) / total).backward()
    ddp.finish_gradient_synchronization()
    with ddp.no_sync():
        for x, y in rest:
            (F.cross_entropy(ddp(x), y) * len(y) / total).backward()


WRONG = [
    (divide_by_k, "mean of means"),
    (sync_every_micro_step, "all-reduces"),
    (no_no_sync, "backward but the last inside ddp.no_sync()"),
    (forgot_finish, "finish_gradient_synchronization"),
    (not_scaled, "not scaled"),
    (first_micro_batch_syncs, "last micro-batch"),
]
