"""The one training loop every strategy runs, and the phases it is made of.

``run_steps`` does what every strategy's loop has in common: tag events with the step, hand the
strategy's ``step(x, y)`` this rank's data, and stop with an error naming the step when a loss is
NaN or infinite (``check_finite``). What differs between strategies is only ``step``: where the
batch is cut, which communication follows backward, what the optimizer owns.
"""
from __future__ import annotations

import math

import torch

from mpkit.config import TrainConfig
from mpkit.strategies.checkpointing import LoopCheckpoints, Resumable
from mpkit.parallel.precision import LossScaler, MixedPrecision
from mpkit.parallel.recompute import recompute_layers


class NonFiniteLoss(FloatingPointError):
    """The loss of a step is NaN or infinite (a learning rate too large, an overflow)."""


def run_steps(ctx, cfg: TrainConfig, step, data, *, track=(), state: Resumable | None = None) -> list[float]:
    """``step(x, y) -> loss (float) or None`` for each of ``cfg.steps`` steps on ``data(k)``, inside
    ``ctx.memory.track(*track)``; returns this rank's losses. ``state``: what the run's checkpoints
    hold (``checkpointing.Resumable``): with ``resume_from`` the loop starts at the checkpoint's
    step (and returns the losses from there on), with ``checkpoint_dir`` it saves as asked."""
    losses = []
    checkpoints = LoopCheckpoints(ctx, cfg, state)
    with ctx.memory.track(*track):
        for k in range(checkpoints.resume(), cfg.steps):
            ctx.set_step(k)
            checkpoints.before_step(k)
            loss = step(*data(k))
            if loss is not None and cfg.check_finite and not math.isfinite(loss):
                raise NonFiniteLoss(f"step {k}: the loss is {loss} on rank {ctx.rank}. Lower the learning rate "
                                    f"(lr={cfg.lr:g}), or pass check_finite=False to keep training anyway")
            if loss is not None:
                losses.append(loss)
            checkpoints.after_step(k + 1)
        checkpoints.finish()
    ctx.set_step(None)
    return losses


def full_batch(ctx, cfg: TrainConfig):
    """``data`` for strategies where every rank sees the whole global batch."""
    def data(k):
        return tuple(t.to(ctx.device) for t in cfg.model.batch(cfg.batch_size, k, cfg.seed))
    return data


def local_batch(ctx, cfg: TrainConfig, rank=None, parts=None):
    """``data`` for data parallelism: slice ``rank`` of ``parts`` (default: this rank of the world)
    of the global batch, contiguous, all of one size."""
    rank = ctx.rank if rank is None else rank
    parts = ctx.world_size if parts is None else parts

    def data(k):
        return tuple(t.tensor_split(parts)[rank].to(ctx.device) for t in cfg.model.batch(cfg.batch_size, k, cfg.seed))
    return data


def mixed_precision(cfg: TrainConfig) -> MixedPrecision:
    """The run's precision recipe (fp16 with a ``LossScaler`` from ``cfg.loss_scale``)."""
    return MixedPrecision(cfg.precision, LossScaler(cfg.loss_scale) if cfg.precision == "fp16" else None)


def build_model(ctx, cfg: TrainConfig, mp: MixedPrecision | None = None):
    """The model from the seed, on this rank's device, with the run's precision and recomputation
    applied layer by layer (the layers a pipeline cuts; a model that is not a stack: as a whole)."""
    model = cfg.model.build(cfg.seed)
    prepare_layers(cfg, model, mp or mixed_precision(cfg))
    return model.to(ctx.device)


def prepare_layers(cfg: TrainConfig, model, mp: MixedPrecision) -> None:
    try:
        layers = cfg.model.layers_of(model)
    except ValueError:  # a user's model that is not an nn.Sequential
        layers = [model]
    mp.wrap(layers)
    recompute_layers(layers, cfg.recompute)


def forward_backward(ctx, cfg: TrainConfig, model, x, y, mp: MixedPrecision | None = None) -> torch.Tensor:
    with ctx.trace.span("forward"):
        loss = cfg.model.loss(model(x), y)
    with ctx.trace.span("backward"):
        loss.backward() if mp is None else mp.backward(loss)
    return loss


def optimizer_step(ctx, optimizer, set_to_none: bool = True, mp: MixedPrecision | None = None, params=(),
                   group=None) -> None:
    """The optimizer's step, or for fp16 the loss scaler's: unscale ``params``' gradients and
    skip the step when one overflowed on any rank of ``group`` (see ``MixedPrecision``)."""
    with ctx.trace.span("optimizer"):
        if mp is None:
            optimizer.step()
        else:
            mp.step(optimizer, params, group)
        optimizer.zero_grad(set_to_none=set_to_none)


def plain_step(ctx, cfg: TrainConfig, model, optimizer, mp: MixedPrecision | None = None, group=None):
    """``step`` for a strategy whose communication lives inside the model (DDP's hooks, FSDP's
    units, tensor-parallel layers) or that has none (single): forward, backward, optimizer.
    ``group``: the ranks holding different gradients (shards, slices), which agree on an fp16
    overflow (see ``optimizer_step``)."""
    def step(x, y):
        loss = forward_backward(ctx, cfg, model, x, y, mp)
        optimizer_step(ctx, optimizer, mp=mp, params=model.parameters(), group=group)
        return loss.item()
    return step


def group_mean(ctx, losses, group=None) -> list[float]:
    """The mean over ``group`` of each step's loss (equal shards: the mean of shard means is the
    global mean): one all-reduce for all steps, outside the timed steps."""
    values = torch.tensor(losses, dtype=torch.float64, device=ctx.device)
    ctx.comm.all_reduce(values, op="avg", group=group, name="losses")
    return values.tolist()


class PipelineLoss:
    """The loss a pipeline's executor runs backward from, for mp, pp and 3d: for fp16 each
    micro-batch's loss scaled by the loss scale (the executor calls backward itself, so
    ``MixedPrecision.backward`` cannot); ``step`` returns the pipeline's loss unscaled."""

    def __init__(self, cfg: TrainConfig, mp: MixedPrecision):
        self.cfg, self.scaler = cfg, mp.scaler

    def __call__(self, out, y):
        loss = self.cfg.model.loss(out, y)
        return loss if self.scaler is None else self.scaler.scale(loss)

    def step(self, pipe, x, y):
        """``pipe.step(x, y)``'s loss (None off the last stage) divided by the scale it was run with."""
        scale = 1.0 if self.scaler is None else self.scaler.value
        loss = pipe.step(x, y)
        return None if loss is None else loss / scale
