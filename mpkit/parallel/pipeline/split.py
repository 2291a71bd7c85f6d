"""Cutting a sequence of layers into consecutive pipeline stages.

Stages are balanced by **parameter count** by default (the largest stage as small as possible):
memory is what layer-wise model parallelism exists for, and in models whose compute follows
their parameters a balanced count also balances time. Where it does not, a student passes
``split_points`` by hand: the slowest stage sets the pace of the whole pipeline, so a split must
be designed around the model's structure.
"""
from __future__ import annotations

from torch import nn


def partition(sizes: list[int], parts: int) -> list[range]:
    """Consecutive non-empty groups of layers minimising the largest group's total size.

    The smallest feasible limit is found by bisection (greedy packing decides feasibility),
    then layers are packed greedily from the front, leaving at least one layer per later group.
    """
    n = len(sizes)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} layers into {parts} non-empty stages; use at most {n} stages "
                         f"(world_size x virtual_stages) or a deeper model")

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


def groups_from_split_points(n: int, split_points, parts: int) -> list[range]:
    """``split_points`` = indices where a new stage starts, e.g. [2, 5] cuts 7 layers as 0-1 | 2-4 | 5-6."""
    points = list(split_points)
    if len(points) != parts - 1:
        raise ValueError(f"split_points={points} gives {len(points) + 1} stages, but the pipeline needs {parts} "
                         f"(world_size x virtual_stages): pass {parts - 1} split points")
    bounds = [0, *points, n]
    if any(not isinstance(b, int) for b in points) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"split_points={points} must be increasing layer indices strictly between 0 and {n} "
                         f"(every stage needs at least one layer)")
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


class Stage(nn.Sequential):
    """Consecutive layers of a model; ``layer_ids`` are their indices in the original sequence."""

    def __init__(self, layers, layer_ids):
        super().__init__(*layers)
        self.layer_ids = list(layer_ids)

    def named_as_original(self, prefix: str) -> dict:
        """Detached copies of the parameters under the original model's names (``prefix`` + index),
        e.g. ``layers.3.fc.weight`` for ``prefix="layers."``."""
        return {f"{prefix}{i}.{name}": p.detach().clone()
                for i, layer in zip(self.layer_ids, self) for name, p in layer.named_parameters()}


def split_layers(layers, parts: int, split_points=None) -> list[Stage]:
    """``parts`` stages from a sequence of layers: at ``split_points``, else balanced by parameter count."""
    layers = list(layers)
    if split_points is None:
        groups = partition([sum(p.numel() for p in layer.parameters()) for layer in layers], parts)
    else:
        groups = groups_from_split_points(len(layers), split_points, parts)
    return [Stage([layers[i] for i in group], group) for group in groups]
