"""Run ``fn(ctx, *args)`` in a world that torchrun started, with the same result as ``launch``.

torchrun owns the processes (one per rank, possibly on several hosts) and exports RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT. Each rank joins through env://, runs ``fn``, and
rank 0 gathers results, events and memory reports, so notebook code runs unchanged under it.
That gathering (and the clock alignment) runs on a private gloo group: on the default group it
would pair with a user's stray collective (ranks 1..n-1 in ``dist.barrier()``, rank 0 returning
without one) and hide the wrong program.
"""
from __future__ import annotations

import atexit
import statistics
import time
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from mpkit.observe.active import recording
from mpkit.observe.memory import parse_bytes
from mpkit.observe.trace import Trace
from mpkit.runtime.context import make_context
from mpkit.runtime.env import env_int
from mpkit.runtime.result import LaunchResult

_CLOCK_ROUNDS = 7
_runtime_group = None  # the private group of this process's torchrun world (see the module docstring)


def torchrun_backend(local_rank: int) -> str:
    """nccl when this rank has a GPU of its own, gloo otherwise."""
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return "nccl"
    return "gloo"


def clock_offset(group) -> float:
    """This rank's ``perf_counter`` minus rank 0's, in seconds (``group``: a gloo group of all ranks).

    Every round all ranks leave a barrier together and read their clock; rank 0 broadcasts its
    reading. The error is the barrier's exit skew (microseconds on one switch); the median of
    several rounds drops rounds where a rank was descheduled.
    """
    samples = []
    for _ in range(_CLOCK_ROUNDS):
        dist.barrier(group=group)
        now = torch.tensor([time.perf_counter()], dtype=torch.float64)
        mine = now.item()
        dist.broadcast(now, 0, group=group)
        samples.append(mine - now.item())
    return statistics.median(samples)


def _shifted(events, memory, offset):
    """Events and memory samples moved onto rank 0's clock."""
    if not offset:
        return events, memory
    events = [replace(e, start=e.start - offset, end=e.end - offset) for e in events]
    memory.samples = [(t - offset, values) for t, values in memory.samples]
    return events, memory


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def join_world(backend=None, timeout=None) -> str:
    """Join the torchrun world once per process and return its backend; later calls reuse it.

    Destroying and re-creating the group would reuse the first group's keys in torchrun's
    store (it outlives the group), and ranks then race on stale addresses; so the group lives
    until the process exits. The runtime's private group is made here too, once, by every rank.
    """
    global _runtime_group
    kwargs = {} if timeout is None else {"timeout": timedelta(seconds=timeout)}
    if not dist.is_initialized():
        backend = backend or torchrun_backend(env_int("LOCAL_RANK", 0))
        dist.init_process_group(backend, init_method="env://", rank=env_int("RANK"),
                                world_size=env_int("WORLD_SIZE"), **kwargs)
        atexit.register(_leave)
    if _runtime_group is None:
        _runtime_group = dist.new_group(backend="gloo", **kwargs)
    return dist.get_backend()


def run_in_torchrun(fn, args=(), device_memory=None, trace=True, memory=True, *, backend=None, timeout=None):
    """Run ``fn(ctx, *args)`` on this rank of the torchrun world.

    Returns a ``LaunchResult`` on rank 0 (``.clock_offsets``: seconds subtracted per rank, all 0
    on one host) and ``None`` on the others; ``.output`` is empty, as prints already went to
    torchrun's console. A rank that raises lets the exception propagate: torchrun then stops
    the world and reports it.
    """
    backend = join_world(backend, timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    ctx = make_context(rank, world_size, env_int("LOCAL_RANK", 0), backend,
                       device_memory=parse_bytes(device_memory), trace=trace, memory=memory,
                       launcher="torchrun")
    with recording(ctx):
        result = fn(ctx, *args)
    # One host shares one perf_counter; across hosts, move every rank onto rank 0's clock.
    multi_host = env_int("LOCAL_WORLD_SIZE", world_size) != world_size
    offset = clock_offset(_runtime_group) if multi_host else 0.0
    events, report = _shifted(ctx.trace.events, ctx.memory.report(), offset)
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object((result, events, report, offset), gathered, dst=0, group=_runtime_group)
    if rank != 0:
        return None
    results, traces, reports, offsets = zip(*gathered)
    merged = Trace.merge(Trace(events=list(ev)) for ev in traces)
    out = LaunchResult(list(results), merged, list(reports), [""] * world_size, backend)
    out.clock_offsets = list(offsets)
    return out
