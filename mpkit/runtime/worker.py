"""The child side of a launch: join the group, run ``fn``, send back one pickled message.

Runs in a forked (CPU) or spawned (CUDA) process. It must never run the parent's atexit
handlers (a Jupyter kernel's!), so it always leaves through ``os._exit``, or is killed.

After sending its result a rank does no synchronisation of its own: it waits to be stopped by
the caller, which has every result by then. A barrier here would pair with a user's stray
collective (ranks 1..n-1 in ``dist.barrier()``, rank 0 returning without one) and hide the
wrong program; waiting is all the store host (rank 0) and peers that may still read from this
rank's connections need.
"""
from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import traceback
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

from mpkit.errors import DeviceOutOfMemory, MpkitWarning
from mpkit.observe.active import recording
from mpkit.runtime.context import make_context
from mpkit.runtime.lifeline import become_subreaper, die_with_parent, kill_descendants


_BACKSTOP_S = 10.0


def _message(kind, **payload) -> bytes:
    return pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)


class _Warnings:
    """``warnings.showwarning`` for a rank: each warning goes into the rank's output as it is
    raised (where an unhandled one goes, so it stays in order and survives a failing ``fn``), and
    the texts of mpkit's own (``MpkitWarning``: a ShardedOptimizer's bias correction, say) are kept
    for the caller to show; torch's own stay only in ``output``, since every rank would repeat them."""

    def __init__(self, output):
        self.output, self.own = output, []

    def show(self, message, category, filename, lineno, file=None, line=None):
        self.output.write(warnings.formatwarning(message, category, filename, lineno, line))
        if issubclass(category, MpkitWarning):
            self.own.append(str(message))


def _store(rank, world_size, port, listen_fd, timeout):
    """Rank 0 serves the store on the socket the parent is already listening on (when forked)."""

    if listen_fd is not None and rank != 0:
        os.close(listen_fd)  # inherited by fork; only rank 0 serves it
        listen_fd = None
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, timeout=timeout,
                         master_listen_fd=listen_fd)


def _wait_to_be_stopped():
    """Block (no CPU, no collective) until the caller kills this rank's process group."""
    while True:
        signal.pause()


def run_rank(rank, world_size, master_port, backend, fn, args, conn, options):
    os.setpgid(0, 0)  # own process group: the parent can kill this rank and anything it started
    die_with_parent(options["parent_pid"])
    become_subreaper()  # what fn starts in a session of its own stays below this rank, to be stopped with it
    if options["guardian_fd"] is not None:
        os.close(options["guardian_fd"])  # inherited by fork: only the caller may hold the guardian's pipe
    torch.set_num_threads(1)  # GNU OpenMP after fork hangs without this (the parent ran threaded torch ops)
    captured = io.StringIO()
    sys.stdout = sys.stderr = captured  # a forked Jupyter kernel's streams must not be touched
    code, sent = 0, False
    try:
        # The caller enforces ``timeout`` and kills the world; the group's own timeout is a later
        # backstop, so a deadlock reads as LaunchTimeout and not as a gloo error racing it.
        group_timeout = timedelta(seconds=options["timeout"] + _BACKSTOP_S)
        store = _store(rank, world_size, master_port, options["listen_fd"], group_timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=group_timeout)
        ctx = make_context(rank, world_size, rank, backend, device_memory=options["device_memory"],
                           trace=options["trace"], memory=options["memory"])
        conn.send_bytes(_message("joined"))  # lets a timeout say whether the world ever came up
        shown = _Warnings(captured)
        with recording(ctx), warnings.catch_warnings():
            warnings.showwarning = shown.show
            result = fn(ctx, *args)
        try:
            blob = _message("ok", result=result, events=ctx.trace.events, memory=ctx.memory.report(),
                            output=captured.getvalue(), warnings=shown.own)
        except Exception as exc:  # noqa: BLE001 - reported to the caller as a TypeError
            blob = _message("unpicklable", error=f"{type(exc).__name__}: {exc}", type_name=type(result).__name__,
                            output=captured.getvalue())
        conn.send_bytes(blob)
        sent = True
        _wait_to_be_stopped()
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        code = 1
        if not sent:
            kind = "oom" if isinstance(exc, DeviceOutOfMemory) else "error"
            conn.send_bytes(_message(kind, traceback=traceback.format_exc(), exc_type=type(exc).__name__,
                                     summary=f"{type(exc).__name__}: {exc}", output=captured.getvalue()))
    finally:
        conn.close()
        kill_descendants([os.getpid()])  # a rank that fails ends here: nothing fn started outlives it
        os._exit(code)
