"""Bytes a rank sends for the calls a case recorded: what a checker compares with a mechanism's
bound (an all-gather of S bytes sends (N-1)/N·S per rank, an all-reduce twice that). The figures
are lab 05's hand-written collectives' (``parallel.collectives.bytes_per_rank``: ring all-reduce,
reduce-scatter, all-gather and all-to-all, chain broadcast and reduce), the algorithms whose
bytes the bounds are stated for.

A recorded call names the first tensor it was given: the output of ``all_gather_into_tensor``,
``reduce_scatter_tensor`` and ``all_to_all_single``, one piece of a list for ``all_gather``,
``reduce_scatter`` and ``all_to_all``; ``peer`` is the root of a broadcast, reduce, scatter or gather.
"""
from __future__ import annotations

from mpkit.parallel.collectives import bytes_per_rank

# call kind -> (the collective's name in bytes_per_rank, how many of the recorded tensor make its S)
AS_COLLECTIVE = {"all_reduce": ("all_reduce", 1), "all_gather_into_tensor": ("all_gather", 1),
                 "all_gather": ("all_gather", "n"), "reduce_scatter_tensor": ("reduce_scatter", "n"),
                 "reduce_scatter": ("reduce_scatter", "n"), "all_to_all_single": ("all_to_all", 1),
                 "all_to_all": ("all_to_all", "n"), "broadcast": ("broadcast", 1), "reduce": ("reduce", 1)}


def sent_bytes(call, world_size: int, rank: int) -> int:
    """What ``rank`` sends for ``call`` (a ``harness.Call``) in a world of ``world_size`` ranks."""
    n, nbytes = world_size, call.nbytes
    if call.kind == "send":
        return nbytes
    if call.kind == "gather":  # every rank but the root sends its piece
        return 0 if rank == call.peer else nbytes
    if call.kind == "scatter":  # the root sends every other rank its piece
        return (n - 1) * nbytes if rank == call.peer else 0
    if call.kind not in AS_COLLECTIVE:
        return 0  # recv, barrier
    name, pieces = AS_COLLECTIVE[call.kind]
    return bytes_per_rank(name, nbytes * (n if pieces == "n" else 1), n, rank, root=call.peer or 0)


def sent(calls, world_size: int, rank: int, phase=None) -> int:
    """Bytes ``rank`` sent for ``calls`` (those of ``phase`` only, when given)."""
    return sum(sent_bytes(c, world_size, rank) for c in calls if phase is None or c.phase == phase)
