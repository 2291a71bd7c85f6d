"""Cutting ``model.layers`` into consecutive stages: shared by ``mp``, ``pp`` and the
``torch.distributed.pipelining`` cross-check, so all three split the model the same way.

Stages are balanced by **parameter count** (the largest stage as small as possible): memory is
what layer-wise model parallelism exists for, and in these models compute follows parameters
closely (the gpt's embedding is cheap and light, so it joins the first block instead of
taking a device of its own, as an equal count of layers would give it).
"""
from __future__ import annotations

import torch
from torch import nn

from mpkit.models import ModelConfig, build_model


def check_stage_count(cfg: ModelConfig, stages: int, what: str) -> None:
    """ValueError when ``stages`` stages (each >= 1 layer) cannot be cut from the model."""
    n = cfg.num_layers
    if stages > n:
        deeper = stages if cfg.kind == "mlp" else stages - 2  # gpt: layers blocks + embedding + head
        raise ValueError(f"{what}={stages} is more than the {n} layers of the model; use {what}<={n} "
                         f"or a deeper model (layers={deeper})")


def partition(sizes: list[int], parts: int) -> list[range]:
    """Consecutive non-empty groups of layers minimising the largest group's total size.

    The smallest feasible limit is found by bisection (greedy packing decides feasibility),
    then layers are packed greedily from the front, leaving at least one layer per later group.
    """
    n = len(sizes)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} layers into {parts} non-empty stages")

    def groups_needed(limit):
        count, total = 1, 0
        for size in sizes:
            if total + size > limit:
                count, total = count + 1, size
            else:
                total += size
        return count

    lo, hi = max(sizes), sum(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if groups_needed(mid) <= parts else (mid + 1, hi)
    groups, start = [], 0
    for g in range(parts):
        end, total = start + 1, sizes[start]
        while end < n - (parts - g - 1) and total + sizes[end] <= lo:
            total += sizes[end]
            end += 1
        groups.append(range(start, end))
        start = end
    assert start == n, "greedy packing under a feasible limit covers every layer"
    return groups


def layer_sizes(model: nn.Module) -> list[int]:
    return [sum(p.numel() for p in layer.parameters()) for layer in model.layers]


def plan(cfg: ModelConfig, stages: int, seed: int = 0) -> list[range]:
    """The layer ranges of ``stages`` stages of the model built from ``seed``."""
    return partition(layer_sizes(build_model(cfg, seed)), stages)


class Stage(nn.Sequential):
    """Consecutive layers of the model; ``layer_ids`` are their indices in ``model.layers``."""

    def __init__(self, layers, layer_ids):
        super().__init__(*layers)
        self.layer_ids = list(layer_ids)

    def single_state(self):
        """Detached copies of the parameters under the single model's names (``layers.3.fc.weight``)."""
        return {f"layers.{i}.{name}": p.detach().clone()
                for i, layer in zip(self.layer_ids, self) for name, p in layer.named_parameters()}


def build_stages(cfg: ModelConfig, seed: int, groups: list[range], keep: list[int]) -> dict[int, Stage]:
    """Build the full model from ``seed`` (so weights equal the single run's), keep only the
    stages in ``keep``: the other layers are dropped here, so memory shows the split."""
    model = build_model(cfg, seed)
    return {s: Stage([model.layers[i] for i in groups[s]], groups[s]) for s in keep}


def boundary_shape(cfg: ModelConfig, batch: int) -> tuple[int, ...]:
    """Shape of the activation between two stages (and of its gradient), known in advance
    from the config, so a receiver can allocate the buffer before the message arrives."""
    return (batch, cfg.hidden) if cfg.kind == "mlp" else (batch, cfg.seq_len, cfg.hidden)


class _FromPreviousStage(torch.autograd.Function):
    """The received activation entering this stage's graph. Its backward hands the gradient
    w.r.t. that activation — the message for the previous stage — to ``sink``.

    Why not a leaf with ``requires_grad``: torch 2.13's MemTracker registers a hook on every
    module input whose closure holds the input's autograd node, and a leaf's node holds the
    leaf, so every received activation (and its .grad) would stay alive for good. Here the
    node holds only ``anchor``, one scalar per rank."""

    @staticmethod
    def forward(ctx, anchor, x, sink):
        ctx.sink = sink
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.sink.append(grad)
        return None, None, None


class StageInput:
    """``attach(received) -> (input for the stage, sink)``; after backward ``sink.pop()`` is
    the gradient to send back."""

    def __init__(self, device):
        self.anchor = torch.zeros((), device=device, requires_grad=True)

    def attach(self, received):
        sink = []
        return _FromPreviousStage.apply(self.anchor, received, sink), sink
