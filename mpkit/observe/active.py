"""The recorders of the rank this process is running, so ``mpkit.parallel`` logs into them.

``mpkit.launch`` (and its torchrun path) makes every rank's ``RankContext`` current while ``fn``
runs. Code that takes no context (``DataParallel``, ``ShardedOptimizer``, tensor-parallel layers,
``pipeline``) asks here for the communicator and trace: inside mpkit they record into
``ctx.trace`` / ``ctx.memory`` so the plots work on a user's model; in a user's own
``init_process_group`` world they get a pass-through that records nothing.
"""
from __future__ import annotations

from contextlib import contextmanager

from mpkit.observe.comm import Comm
from mpkit.observe.memory import MemoryTracker
from mpkit.observe.trace import Trace

_NULL_TRACE = Trace(enabled=False)
_NULL_MEMORY = MemoryTracker(enabled=False)
_NULL_COMM = Comm(_NULL_TRACE, _NULL_MEMORY)
_current = None  # the RankContext (anything with .comm, .trace and .memory) of this process's rank


@contextmanager
def recording(ctx):
    """Make ``ctx`` this process's current rank context inside the block. With a device capacity
    (``device_memory``) the whole block is memory-tracked, so every tensor the rank allocates
    counts toward it, not only those inside the strategy's ``ctx.memory.track``."""
    global _current
    previous, _current = _current, ctx
    try:
        if ctx.memory.capacity is not None:
            with ctx.memory.track():
                yield ctx
        else:
            yield ctx
    finally:
        _current = previous


@contextmanager
def quiet():
    """Inside, mpkit.parallel's communication records nothing (its own bookkeeping, such as the
    pipeline's shape handshake, is not part of the run a student looks at)."""
    global _current
    previous, _current = _current, None
    try:
        yield
    finally:
        _current = previous


def current():
    """The current rank context, or None outside ``mpkit.launch``/torchrun runs."""
    return _current


def comm() -> Comm:
    return _NULL_COMM if _current is None else _current.comm


def trace() -> Trace:
    return _NULL_TRACE if _current is None else _current.trace


def memory() -> MemoryTracker:
    return _NULL_MEMORY if _current is None else _current.memory
