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
import os
import time
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import get_error_handler

from mpkit.observe.active import recording
from mpkit.observe.memory import parse_bytes
from mpkit.observe.trace import Trace
from mpkit.runtime.context import make_context
from mpkit.runtime.env import env_int
from mpkit.runtime.lifeline import die_with_parent
from mpkit.runtime.result import LaunchResult

_CLOCK_ROUNDS = 10  # exchanges per rank; the shortest round trip is kept
_runtime_group = None  # the private group of this process's torchrun world (see the module docstring)


def torchrun_backend(local_rank: int) -> str:
    """nccl when this rank has a GPU of its own, gloo otherwise."""
    if torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return "nccl"
    return "gloo"


def clock_offset(group) -> tuple[float, float]:
    """(offset, error): this rank's ``perf_counter`` minus rank 0's, in seconds, and a bound on how
    far the estimate can be off (``group``: a gloo group of all ranks; rank 0 gets (0, 0)).

    NTP's symmetric estimate: the rank sends at t0 (its clock), rank 0 receives at t1 and replies
    at t2 (rank 0's clock), the reply arrives at t3. With a = t1 - t0 and b = t3 - t2 (each one
    way's delay plus or minus the offset), the offset is (b - a) / 2, off by at most (a + b) / 2,
    the round trip minus rank 0's turnaround, halved: exact if both ways took equally long, and
    never wrong by more than that whatever the delays were. Of several exchanges the one with the
    shortest round trip is kept (a rank descheduled mid-exchange only lengthens its round trip).
    """
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    ping, reply = torch.zeros(1, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    if rank == 0:
        for peer in range(1, world_size):  # one rank at a time: the others wait for their turn
            for _ in range(_CLOCK_ROUNDS):
                dist.recv(ping, peer, group=group)
                reply[0] = time.perf_counter()
                reply[1] = time.perf_counter()
                dist.send(reply, peer, group=group)
        return 0.0, 0.0
    best = None
    for _ in range(_CLOCK_ROUNDS):
        t0 = time.perf_counter()
        dist.send(ping, 0, group=group)
        dist.recv(reply, 0, group=group)
        t3 = time.perf_counter()
        t1, t2 = reply.tolist()
        a, b = t1 - t0, t3 - t2
        if best is None or a + b < best[0] + best[1]:
            best = (a, b)
    a, b = best
    return (b - a) / 2, (a + b) / 2


def _shifted(events, memory, offset):
    """Events and memory samples moved onto rank 0's clock."""
    if not offset:
        return events, memory
    events = [replace(e, start=e.start - offset, end=e.end - offset) for e in events]
    memory.samples = [(t - offset, values) for t, values in memory.samples]
    return events, memory


def _tell_torchrun(exc: BaseException) -> None:
    """Write ``exc`` with its traceback and time to the error file torchrun gave this rank (what
    ``@record`` does for a script's main): torchrun's closing summary then shows it under this
    rank instead of 'To enable traceback see ...'. (Its root cause is the earliest file in whole
    seconds: a peer that only saw the connection close in the same second may be named.)"""
    get_error_handler().record_exception(exc)  # nothing without TORCHELASTIC_ERROR_FILE


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def join_world(backend=None, timeout=None) -> str:
    """Join the torchrun world once per process and return its backend; later calls reuse it.

    Destroying and re-creating the group would reuse the first group's keys in torchrun's
    store (it outlives the group), and ranks then race on stale addresses; so the group lives
    until the process exits. The runtime's private group is made here too, once, by every rank.
    A rank that torchrun's agent started dies with the agent (``lifeline.die_with_parent``).
    """
    global _runtime_group
    kwargs = {} if timeout is None else {"timeout": timedelta(seconds=timeout)}
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's agent started this rank in a session of its own:
        die_with_parent(os.getppid())  # a SIGKILLed agent forwards nothing, so the kernel stops the rank
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
    on one host; ``.clock_errors``: how far each offset can be off, see ``clock_offset``) and
    ``None`` on the others; ``.output`` is empty, as prints already went to
    torchrun's console. A rank that raises lets the exception propagate, recorded in torchrun's
    error file first: torchrun then stops the world and its summary lists each failed rank
    with its traceback.
    """
    backend = join_world(backend, timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    ctx = make_context(rank, world_size, env_int("LOCAL_RANK", 0), backend,
                       device_memory=parse_bytes(device_memory), trace=trace, memory=memory,
                       launcher="torchrun")
    with recording(ctx):
        try:
            result = fn(ctx, *args)
        except Exception as exc:
            _tell_torchrun(exc)
            raise
    # One host shares one perf_counter; across hosts, move every rank onto rank 0's clock.
    multi_host = env_int("LOCAL_WORLD_SIZE", world_size) != world_size
    offset, error = clock_offset(_runtime_group) if multi_host else (0.0, 0.0)
    events, report = _shifted(ctx.trace.events, ctx.memory.report(), offset)
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object((result, events, report, offset, error), gathered, dst=0, group=_runtime_group)
    if rank != 0:
        return None
    results, traces, reports, offsets, errors = zip(*gathered)
    merged = Trace.merge(Trace(events=list(ev)) for ev in traces)
    out = LaunchResult(list(results), merged, list(reports), [""] * world_size, backend)
    out.clock_offsets = list(offsets)
    out.clock_errors = list(errors)
    return out
