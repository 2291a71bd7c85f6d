"""The strategy contract and the pieces every strategy shares.

A strategy is a ``Strategy``: its option defaults, ``validate(cfg)`` (raise ``ValueError`` saying
what to change, before any rank starts), ``run_rank(ctx, cfg) -> RankOutput`` (one rank's
training, built on ``mpkit.parallel`` and the one loop in ``loop.py``) and ``program(pricer)``:
the same step as per-rank instruction lists for the cost model, derived from the same plan
objects ``run_rank`` executes (bucket plan, shard layout, schedule). The registry is
``mpkit.registry.REGISTRY``; ARCHITECTURE.md says how to add one. No strategy module imports
another: what several share lives here, in ``loop.py``, ``checks.py`` and ``programs.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from mpkit.config import TrainConfig
from mpkit.layout import Layout


@dataclass(frozen=True)
class Strategy:
    name: str
    options: dict
    validate: Callable[[TrainConfig], None]
    run_rank: Callable
    program: Callable | None = None  # pricer -> per-rank instruction lists of one step (None: not predicted)
    dim: str | None = "dp"  # the mesh dimension all ranks form ("dp", "pp", "cp", "tp"); None: no grid (ps)
    layout: Callable[[TrainConfig], Layout] | None = None  # several dimensions at once (3d, ep)
    # world size -> the model (and its sizes) to train when the caller names no model: "mlp" unless the
    # strategy needs another (sp/cp split a transformer's sequence; ep needs its experts)
    model_defaults: Callable[[int], dict] | None = None
    takes_precision: bool = False  # runs precision="bf16"/"fp16" and recompute= (mpkit.parallel.precision)
    no_precision: str = ""  # where it does not: why, for the error message
    no_checkpoint: str = ""  # a strategy whose run cannot be checkpointed and resumed: why (train refuses it)

    def mesh(self, cfg: TrainConfig) -> Layout | None:
        """The run's ranks on the dp x pp x cp x tp grid, in its rank order (what ``run_rank`` builds
        its ``DeviceMesh`` of, and ``Run.mesh``)."""
        if self.layout is not None:
            return self.layout(cfg)
        return None if self.dim is None else Layout(**{self.dim: cfg.world_size})


@dataclass
class RankOutput:
    """What one rank reports. ``losses``: the global loss per step, from a rank that knows it
    (None elsewhere). ``params``: full (unsharded) tensors under the single model's names, for
    the parameters this rank can vouch for. ``extra``: strategy-specific facts for the lab."""

    losses: list[float] | None = None
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def optimizer_spec(cfg: TrainConfig):
    """(optimizer class, its keyword arguments) of the run. foreach=True: one fused op per tensor
    group instead of ~10 per parameter; also far cheaper to observe with the memory tracker."""
    if cfg.optimizer == "adam":
        return torch.optim.Adam, {"lr": cfg.lr, "foreach": True}
    return torch.optim.SGD, {"lr": cfg.lr, "foreach": True}


def make_optimizer(params, cfg: TrainConfig):
    cls, kwargs = optimizer_spec(cfg)
    return cls(list(params), **kwargs)


def require_divisible(total: int, parts: int, total_name: str, parts_name: str, hint: str = "") -> None:
    if parts < 1 or total % parts:
        raise ValueError(f"{parts_name}={parts} does not divide {total_name}={total}; "
                         f"choose {total_name} as a multiple of {parts_name}{'; ' + hint if hint else ''}")


def require_builtin(cfg: TrainConfig, why: str) -> None:
    if not cfg.model.builtin:
        raise ValueError(f"strategy={cfg.strategy!r} runs on the built-in models only ({why}); "
                         f"use model='mlp' or model='gpt'")


def state_of(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """Detached copies of a module's parameters under ``prefix`` + their names."""
    return {prefix + name: p.detach().clone() for name, p in module.named_parameters()}
