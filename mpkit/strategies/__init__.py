"""The strategies ``mpkit.train`` runs, by name (the registry itself is ``mpkit.registry``, torch-free).

Each entry of ``REGISTRY`` names the module that defines its ``STRATEGY`` (a ``base.Strategy``: option
defaults, ``validate``, ``run_rank`` and the cost model's ``program``) and says in a line what it does.
Modules load on first use: fsdp and the pipelining cross-check each cost about a second of imports,
which a notebook that never runs them should not pay. ARCHITECTURE.md says how to add one.
"""
from importlib import import_module

import torch

from mpkit.config import DEFAULT_LOSS_SCALE, TrainConfig, build_config
from mpkit.parallel.recompute import selective_targets
from mpkit.registry import REGISTRY, SEQUENCE_STRATEGIES, STRATEGIES
from mpkit.strategies.base import Strategy


def get_strategy(name) -> Strategy:
    if name not in REGISTRY:
        raise ValueError(f"strategy={name!r} is unknown; use one of {', '.join(REGISTRY)}")
    return import_module(REGISTRY[name][0]).STRATEGY


# ``model`` when the caller names none (None is a model the checks refuse, as any other bad value)
STRATEGY_DEFAULT = object()


def make_config(strategy, world_size, *, model=STRATEGY_DEFAULT, steps=3, batch_size=32, lr=1e-2, optimizer="adam",
                seed=0, data=None, loss=None, check_finite=True, precision="fp32", recompute=None, loss_scale=DEFAULT_LOSS_SCALE,
                **options) -> TrainConfig:
    """Resolve model sizes and strategy options into a ``TrainConfig`` checked by the strategy too."""
    spec = get_strategy(strategy)
    if model is STRATEGY_DEFAULT:  # the strategy's own default model, so its defaults train without any argument
        defaults = dict(spec.model_defaults(world_size)) if spec.model_defaults else {}
        model = defaults.pop("model", "mlp")
        options = {**defaults, **options}
    cfg = build_config(strategy, world_size, options, spec.options, model=model, steps=steps,
                       batch_size=batch_size, lr=lr, optimizer=optimizer, seed=seed, data=data, loss=loss,
                       check_finite=check_finite, precision=precision, recompute=recompute, loss_scale=loss_scale)
    if (precision != "fp32" or recompute is not None) and not spec.takes_precision:
        takers = ", ".join(n for n in REGISTRY if get_strategy(n).takes_precision)
        why = f" ({spec.no_precision})" if spec.no_precision else ""
        raise ValueError(f"strategy={strategy!r} does not take precision= or recompute={why}; the strategies that "
                         f"do: {takers}")
    if recompute == "selective":  # a model without attention fails here, in the caller
        with torch.device("meta"):
            selective_targets([cfg.model.build(cfg.seed)])
    spec.validate(cfg)
    return cfg


__all__ = ["REGISTRY", "STRATEGIES", "SEQUENCE_STRATEGIES", "Strategy", "get_strategy", "make_config"]
