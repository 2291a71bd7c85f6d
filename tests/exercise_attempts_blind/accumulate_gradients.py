"""Blind attempts (blind-b) at accumulate_gradients: written from the stub and hints only."""
import contextlib

import torch.nn.functional as F


# correct, unusual: summed token losses over this rank's token count, the context chosen per micro-batch
def summed_losses(ctx, ddp, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    last = len(micro_batches) - 1
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < last else contextlib.nullcontext():
            (F.cross_entropy(ddp(x), y, reduction="sum") / total).backward()
    ddp.finish_gradient_synchronization()


# correct, unusual: the synchronising micro-batch goes FIRST (outside no_sync), the rest accumulate after it
def sync_last_processed_first(ctx, ddp, micro_batches):
    total = sum(y.numel() for _, y in micro_batches)
    with ddp.no_sync():
        for x, y in micro_batches[1:]:
            (F.cross_entropy(ddp(x), y) * (y.numel() / total)).backward()
    x, y = micro_batches[0]
    (F.cross_entropy(ddp(x), y) * (y.numel() / total)).backward()
    ddp.finish_gradient_synchronization()


def _run(ddp, micro_batches, weight, sync_every=False):
    last = len(micro_batches) - 1
    for i, (x, y) in enumerate(micro_batches):
        loss = F.cross_entropy(ddp(x), y) * weight(y)
        if sync_every or i == last:
            loss.backward()
        else:
            with ddp.no_sync():
                loss.backward()
    ddp.finish_gradient_synchronization()


# mistake: every micro-batch's mean loss times 1/k (wrong when the micro-batches hold different token counts)
def one_over_k(ctx, ddp, micro_batches):
    _run(ddp, micro_batches, lambda y: 1 / len(micro_batches))


# mistake: no scaling at all, the k mean losses just added
def unscaled(ctx, ddp, micro_batches):
    _run(ddp, micro_batches, lambda y: 1.0)


# mistake: also divides by the world size, although DDP already averages over the ranks
def divides_by_world_too(ctx, ddp, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    _run(ddp, micro_batches, lambda y: len(y) / (total * ctx.world_size))


# mistake (values right, wasteful): no no_sync, so every micro-step all-reduces
def sync_every_step(ctx, ddp, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    _run(ddp, micro_batches, lambda y: len(y) / total, sync_every=True)


# mistake: the last backward too inside no_sync, so the ranks never average
def all_inside_no_sync(ctx, ddp, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    with ddp.no_sync():
        for x, y in micro_batches:
            (F.cross_entropy(ddp(x), y) * (len(y) / total)).backward()
    ddp.finish_gradient_synchronization()


# mistake (raises): unpacks (i, (x, y)) without enumerate
def no_enumerate(ctx, ddp, micro_batches):
    total = sum(len(y) for _, y in micro_batches)
    for i, (x, y) in micro_batches:
        (F.cross_entropy(ddp(x), y) * (len(y) / total)).backward()
    ddp.finish_gradient_synchronization()


CORRECT = [summed_losses, sync_last_processed_first]
WRONG = [
    (one_over_k, ("1/k", "n_i", "token count", "number of tokens")),
    (unscaled, ("scale", "1/k", "n_i", "k times")),
    (divides_by_world_too, ("world size", "already averages", "twice", "ranks")),
    (sync_every_step, ("no_sync", "all-reduces", "every micro")),
    (all_inside_no_sync, ("no_sync", "never", "last backward", "not averaged")),
    (no_enumerate, ("unpack", "valueerror", "typeerror", "enumerate")),
]
