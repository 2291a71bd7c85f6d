"""How work is cut across ranks, in plain integers: a model's layers into pipeline stages, a
flat buffer into ZeRO slices. Torch-free, so the run (``pipeline``, ``ShardedOptimizer``) and
the cost model (``mpkit.sim``, which plans without importing torch) cut the same way."""
from __future__ import annotations

import math


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


def shard_numel(numel: int, world_size: int) -> int:
    """Elements per rank of a flat buffer of ``numel`` elements padded to a multiple of ``world_size``."""
    return math.ceil(numel / world_size)
