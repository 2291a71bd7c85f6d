"""Pieces every strategy shares: the config, the per-rank output, optimizer, batch sharding."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mpkit.config import TrainConfig



@dataclass
class RankOutput:
    """What one rank reports. ``losses``: the global loss per step, from a rank that knows it
    (None elsewhere). ``params``: full (unsharded) tensors under the single model's names, for
    the parameters this rank can vouch for. ``extra``: strategy-specific facts for the lab."""

    losses: list[float] | None = None
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def make_optimizer(params, cfg: TrainConfig):
    # foreach=True: one fused op per tensor group instead of ~10 per parameter; also far cheaper
    # to observe with the memory tracker.
    params = list(params)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, foreach=True)
    return torch.optim.SGD(params, lr=cfg.lr, foreach=True)


def shard(tensor: torch.Tensor, rank: int, parts: int) -> torch.Tensor:
    """Contiguous slice ``rank`` of ``parts`` along dim 0 (batch must divide evenly)."""
    size = tensor.shape[0] // parts
    return tensor[rank * size:(rank + 1) * size]


def require_divisible(total: int, parts: int, total_name: str, parts_name: str, hint: str = "") -> None:
    if parts < 1 or total % parts:
        raise ValueError(f"{parts_name}={parts} does not divide {total_name}={total}; "
                         f"choose {total_name} as a multiple of {parts_name}{'; ' + hint if hint else ''}")


def require_world(cfg: TrainConfig, minimum: int, why: str) -> None:
    if cfg.world_size < minimum:
        raise ValueError(f"strategy={cfg.strategy!r} needs world_size >= {minimum} ({why}); got world_size={cfg.world_size}")


def train_full_batch(ctx, cfg: TrainConfig, model, optimizer) -> list[float]:
    """Every step on the whole global batch: the reference's loop, and tensor parallel's (each
    rank sees the whole batch there). Returns the loss of each step."""
    from mpkit.models import loss_fn, make_batch

    losses = []
    with ctx.memory.track(model, optimizer):
        for step in range(cfg.steps):
            ctx.set_step(step)
            x, y = (t.to(ctx.device) for t in make_batch(cfg.model, cfg.batch_size, step, cfg.seed))
            with ctx.trace.span("forward"):
                loss = loss_fn(cfg.model, model(x), y)
            with ctx.trace.span("backward"):
                loss.backward()
            with ctx.trace.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    ctx.set_step(None)
    return losses


def state_of(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Detached copies of a module's parameters under ``prefix`` + their names."""
    return {prefix + name: p.detach().clone() for name, p in module.named_parameters()}
