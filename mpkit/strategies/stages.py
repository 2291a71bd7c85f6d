"""The built-in models cut into stages the same way by ``mp``, ``pp``, the torch pipelining
cross-check and the cost model: ``model.layers`` balanced by parameter count
(``mpkit.parallel.pipeline.split.partition``). The gpt's embedding is cheap and light, so it joins
the first block instead of taking a device of its own, as an equal count of layers would give it."""
from __future__ import annotations

from mpkit.models import ModelConfig, build_model
from mpkit.parallel.pipeline.split import Stage, partition


def check_stage_count(cfg: ModelConfig, stages: int, what: str) -> None:
    """ValueError when ``stages`` stages (each >= 1 layer) cannot be cut from the model."""
    n = cfg.num_layers
    if stages > n:
        deeper = stages if cfg.kind == "mlp" else stages - 2  # gpt: layers blocks + embedding + head
        raise ValueError(f"{what}={stages} is more than the {n} layers of the model; use {what}<={n} "
                         f"or a deeper model (layers={deeper})")


def layer_sizes(model) -> list[int]:
    return [sum(p.numel() for p in layer.parameters()) for layer in model.layers]


def plan(cfg: ModelConfig, stages: int, seed: int = 0) -> list[range]:
    """The layer ranges of ``stages`` stages of the model built from ``seed``."""
    return partition(layer_sizes(build_model(cfg, seed)), stages)


def build_stages(cfg: ModelConfig, seed: int, groups: list[range], keep) -> dict[int, Stage]:
    """Build the full model from ``seed`` (so weights equal the single run's), keep only the
    stages in ``keep``: the other layers are dropped here, so memory shows the split."""
    model = build_model(cfg, seed)
    return {s: Stage([model.layers[i] for i in groups[s]], groups[s]) for s in keep}
