"""The one training loop every strategy runs, and the phases it is made of.

``run_steps`` does what every strategy's loop has in common: tag events with the step, hand the
strategy's ``step(x, y)`` this rank's data, and stop with an error naming the step when a loss is
NaN or infinite (``check_finite``). What differs between strategies is only ``step``: where the
batch is cut, which communication follows backward, what the optimizer owns. The strategies that
compose parallelisms (tp, sp, cp, ep, pp, mp, fsdp, 3d) are short callers of
``mpkit.parallel.parallelize``: ``parallelized`` builds the model on this rank's mesh by a plan,
``train_parallelized`` runs the loop on it and reports.
"""
from __future__ import annotations

import math

import torch

from mpkit.config import TrainConfig
from mpkit.layout import Layout
from mpkit.parallel.mesh import build_mesh
from mpkit.parallel.parallelize import Parallelized, Plan, mean_losses, parallelize
from mpkit.parallel.pipeline.split import split_layers
from mpkit.parallel.plans import builtin_structure
from mpkit.strategies.checkpointing import LoopCheckpoints, Resumable
from mpkit.parallel.precision import LossScaler, MixedPrecision
from mpkit.parallel.recompute import recompute_layers
from mpkit.strategies.base import RankOutput, optimizer_spec


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
    return mean_losses(losses, group, ctx.device)


def all_stages(cfg: TrainConfig, count: int, mp: MixedPrecision | None = None) -> list:
    """Every stage of the model, built from the seed and cut as ``parallelize`` cuts it (balanced by
    parameter count), with the run's precision and recomputation on each layer: what the
    cross-checks with torch's pipelining and rpc hand each rank."""
    model = cfg.model.build(cfg.seed)
    prepare_layers(cfg, model, mp or mixed_precision(cfg))
    return split_layers(cfg.model.layers_of(model), count)


# ---- the strategies built on ``mpkit.parallel.parallelize`` ----

def recipe(cfg: TrainConfig) -> dict:
    """The ``Plan`` fields every strategy takes from the run: the model's loss, precision, recomputation."""
    return {"loss": cfg.model.loss, "precision": cfg.precision, "loss_scale": cfg.loss_scale,
            "recompute": cfg.recompute}


def builtin_plan(cfg: TrainConfig, tp: int = 1, **options) -> Plan:
    """The ``Plan`` of a built-in model (its Megatron plan over ``tp`` ranks) with ``options``."""
    return Plan(**builtin_structure(cfg.model, tp), **recipe(cfg), **options)


def parallelized(ctx, cfg: TrainConfig, layout: Layout, plan: Plan) -> Parallelized:
    """The model from the seed on this rank's mesh of ``layout``, parallelized by ``plan``, with
    the run's optimizer."""
    par = parallelize(cfg.model.build(cfg.seed), build_mesh(layout, ctx.device.type), plan)
    cls, kwargs = optimizer_spec(cfg)
    par.build_optimizer(cls, **kwargs)
    return par


def train_parallelized(ctx, cfg: TrainConfig, par: Parallelized, step=None, every_rank: bool = False) -> RankOutput:
    """The one loop on ``par`` (``step``: ``par.step`` or a caller's wrapper of it; checkpoints of
    ``par.model`` and ``par.optimizer`` as the run asks), then the global
    losses (the mean over dp x cp, where the last stage is) and the full parameters. They are
    reported by the first replica of every stage, or by ``every_rank``; ``extra``: the precision."""
    losses = run_steps(ctx, cfg, step or par.step, full_batch(ctx, cfg), track=par.tracked,
                       state=Resumable(par.model, par.optimizer, par.prefix, par.mp))
    if par.holds_last_stage and par.mesh.size("dp_cp") > 1:
        losses = par.mean_losses(losses)
    params = par.full_parameters()  # a collective: every rank takes part
    speaks = every_rank or par.reports
    return RankOutput(losses=losses if speaks and par.holds_last_stage else None, params=params if speaks else {},
                      extra=par.mp.report())
