"""Bytes each rank sends for the calls a case recorded, on the bandwidth-optimal algorithms (ring
all-reduce, reduce-scatter and all-gather, chain broadcast and reduce) and averaged over the
ranks: the figure a checker compares with a mechanism's bound (an all-gather of S bytes sends
(N-1)/N·S per rank, an all-reduce twice that).

A recorded call names the first tensor it was given: the output of ``all_gather_into_tensor``
and ``reduce_scatter_tensor``, one piece of a list for ``all_gather``, ``reduce_scatter`` and
``all_to_all``.
"""
from __future__ import annotations

PER_PIECE = ("all_gather", "reduce_scatter", "all_to_all")      # the call names one piece of N
WHOLE = ("all_gather_into_tensor", "all_to_all_single", "broadcast", "reduce", "scatter", "gather")


def sent_bytes(call, world_size: int) -> float:
    """What one rank sends for ``call`` (a ``harness.Call``) in a world of ``world_size`` ranks."""
    n, nbytes = world_size, call.nbytes
    if call.kind == "send":
        return nbytes
    if call.kind == "all_reduce":
        return 2 * (n - 1) / n * nbytes
    if call.kind == "reduce_scatter_tensor" or call.kind in PER_PIECE:
        return (n - 1) * nbytes
    if call.kind in WHOLE:
        return (n - 1) / n * nbytes
    return 0.0  # recv, barrier


def sent(calls, world_size: int, phase=None) -> float:
    """Bytes sent for ``calls`` (those of ``phase`` only, when given)."""
    return sum(sent_bytes(c, world_size) for c in calls if phase is None or c.phase == phase)
