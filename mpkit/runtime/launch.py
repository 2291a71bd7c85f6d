"""``mpkit.launch``: run ``fn(ctx, *args)`` on N ranks and return their results in rank order.

CPU worlds are forked (0.1 s instead of ~10 s for spawn, and ``fn`` may live in a notebook
cell). Every rank gets its own process group so teardown kills it and anything it started, also
when the caller itself is killed (``lifeline``); results travel as plain pickles over pipes (no
torch shared memory left behind).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import threading
import time
import warnings
from multiprocessing.connection import wait

import torch

from mpkit.config import is_number, is_whole
from mpkit.errors import LaunchError, LaunchTimeout, MpkitWarning, RankOutOfMemory
from mpkit.observe.active import current
from mpkit.observe.memory import parse_bytes
from mpkit.observe.trace import Trace
from mpkit.runtime import torchrun
from mpkit.runtime.devices import check_world_size, cuda_count
from mpkit.runtime.env import in_torchrun
from mpkit.runtime.lifeline import Guardian, kill_descendants
from mpkit.runtime.result import LaunchResult
from mpkit.runtime.worker import run_rank

BACKENDS = ("gloo", "nccl")


def store_socket() -> socket.socket:
    """A listening socket on a port the OS picks, for rank 0's TCPStore.

    It listens before any rank exists, so peers that come up first wait in its backlog instead
    of being refused (torch's client then backs off for seconds), and no other notebook on this
    host can take the port in between.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def _check_not_nested():
    ctx = current()
    if ctx is not None:
        raise RuntimeError(f"mpkit.launch (or mpkit.train) was called inside rank {ctx.rank} of a running launch: a "
                           f"rank cannot start a world of its own. Call it from the notebook or script that "
                           f"started the first one; inside fn, the ranks talk through ctx.comm / torch.distributed")


def _check_args(fn, world_size, args, timeout, backend):
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(ctx, *args); got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args={args!r}: pass fn's extra arguments as a tuple, e.g. args=({args!r},)")
    if not is_whole(world_size) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: pass a whole number of ranks >= 1, e.g. world_size=4")
    if not is_number(timeout) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout={timeout!r}: pass a positive, finite number of seconds, e.g. timeout=60")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is unknown; use one of {', '.join(BACKENDS)} or None (choose for me)")


def choose_backend(world_size, backend=None) -> str:
    """nccl when there are enough GPUs, gloo (simulated CPU devices) otherwise — only if allowed."""
    gpus = cuda_count()
    if backend == "gloo" or (backend is None and gpus == 0):
        return "gloo"
    if gpus == 0:
        raise ValueError("backend='nccl' needs CUDA GPUs and this machine has none; use backend='gloo' "
                         "(simulated CPU devices) or backend=None")
    if world_size > gpus:
        raise ValueError(f"world_size={world_size} is more than the {gpus} GPU(s) here; use world_size<={gpus}, "
                         f"or backend='gloo' to run on simulated CPU devices instead")
    return "nccl"


def _start_method(backend, fn):
    if backend == "gloo":
        return "fork"
    if not torch.cuda.is_initialized():
        return "fork"  # children initialise CUDA themselves; the parent never did
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise TypeError("CUDA is already initialised in this process, so ranks must be spawned and fn must be "
                        "importable (defined in a .py module, not a notebook cell); or restart the kernel "
                        f"and launch before touching CUDA ({exc})") from None
    return "spawn"


# multiprocessing reaps children without a lock: Process.start() polls (waitpid) every child of
# the process, so a launch starting ranks in one thread could reap a rank another thread was
# joining; that join then saw no exit code and close() raised ValueError (seen once in CI,
# 2026-12-05: test_two_launches_at_once_from_two_threads, and the guardian was left behind).
# Everything here that may call waitpid on a rank holds this lock.
_REAPING = threading.Lock()


def _kill_all(procs):
    """SIGKILL what each rank started in a session of its own, then every rank's process group, also
    when the rank itself already exited: what it started (a ``subprocess.Popen``) is still in that
    group. Then reap and close each rank."""
    with _REAPING:
        kill_descendants([proc.pid for proc in procs if proc.exitcode is None], stop=True)
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if proc.is_alive():  # its group did not exist yet: kill the process itself
                proc.kill()
        for proc in procs:
            proc.join(timeout=5)
            if proc.exitcode is None:  # pragma: no cover - stuck in the kernel; one last try
                proc.kill()
                proc.join()
            proc.close()  # release its sentinel fd now, not at the next launch


def _own_group(pid):
    """Put a new rank in its own process group from this side too (the child does the same), so
    killpg works even if the rank is stopped before it ran a line."""
    try:
        os.setpgid(pid, pid)
    except OSError:  # already exited, or spawned and exec'd: it sets its own group
        pass


def _death_reason(exitcode):
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode} before returning a result"


def launch(fn, world_size=4, args=(), timeout=60.0, backend=None, *, device_memory=None, trace=True,
           memory=True, hopeless=None) -> LaunchResult:
    """Run ``fn(ctx, *args)`` on ``world_size`` ranks; return ``[result of rank 0, rank 1, ...]``.

    A rank that raises -> ``LaunchError`` naming it, with its traceback; a rank that dies ->
    ``LaunchError`` with its exit code; no result within ``timeout`` s -> ``LaunchTimeout``
    naming the ranks still running. In every case all ranks are gone when this returns.
    Inside a torchrun world this rank joins it instead (result on rank 0, None elsewhere).
    ``device_memory="64MiB"`` gives each simulated device a capacity (out-of-memory like a GPU).
    ``hopeless(running)``, asked every ``POLL_S`` with the ranks that have not returned, may end
    the world before ``timeout`` (``LaunchTimeout`` the same): the exercise checker's deadlock watch.
    """
    _check_not_nested()
    _check_args(fn, world_size, args, timeout, backend)
    world_size = int(world_size)
    capacity = parse_bytes(device_memory)
    if in_torchrun():
        return _in_torchrun(fn, world_size, args, timeout, backend, capacity, trace, memory)
    backend = choose_backend(world_size, backend)
    if backend == "gloo":
        check_world_size(world_size)
    method = _start_method(backend, fn)
    context = mp.get_context(method)
    guardian = Guardian()
    listener = store_socket()
    port = listener.getsockname()[1]
    forked = method == "fork"
    options = {"timeout": float(timeout), "device_memory": capacity, "trace": trace, "memory": memory,
               "listen_fd": listener.fileno() if forked else None, "parent_pid": os.getpid(),
               "guardian_fd": guardian.write_fd if forked else None}
    if not forked:
        listener.close()  # a spawned rank 0 cannot inherit it and binds the port itself
    procs, conns = [], []
    try:
        for rank in range(world_size):
            reader, writer = context.Pipe(duplex=False)
            proc = context.Process(target=run_rank, name=f"mpkit-rank-{rank}",
                                   args=(rank, world_size, port, backend, fn, tuple(args), writer, options))
            with _REAPING:  # start() reaps finished children of every launch in this process
                proc.start()
            _own_group(proc.pid)
            guardian.guard(proc.pid)
            writer.close()
            procs.append(proc)
            conns.append(reader)
        listener.close()  # rank 0 holds its own copy
        messages = _collect(procs, conns, float(timeout), hopeless)
    finally:
        listener.close()
        try:
            _kill_all(procs)
        finally:
            guardian.release()  # even if stopping the ranks failed: the guardian must not outlive the launch
            for conn in conns:
                conn.close()
    _show_rank_warnings([m.get("warnings", []) for m in messages])
    results = [m["result"] for m in messages]
    merged = Trace.merge(Trace(events=m["events"]) for m in messages)
    return LaunchResult(results, merged, [m["memory"] for m in messages],
                        [m["output"] for m in messages], backend)


def _show_rank_warnings(per_rank) -> None:
    """mpkit's warnings from the ranks, once each, with the ranks that raised them."""
    ranks = {}
    for rank, texts in enumerate(per_rank):
        for text in texts:
            ranks.setdefault(text, []).append(rank)
    for text, where in ranks.items():
        warnings.warn(f"rank{'s' if len(where) > 1 else ''} {', '.join(map(str, where))}: {text}", MpkitWarning,
                      stacklevel=3)


def check_torchrun_world(world_size) -> None:
    """Inside a torchrun world, a ValueError unless ``world_size`` is its WORLD_SIZE (``train``
    asks before it checks anything else: no batch size fixes a world of the wrong size)."""
    env_size = int(os.environ["WORLD_SIZE"])
    if world_size != env_size:
        raise ValueError(f"launch(world_size={world_size}) inside a torchrun world of WORLD_SIZE={env_size}: "
                         f"pass world_size={env_size}, or start torchrun with {world_size} processes in all "
                         f"(--nnodes x --nproc-per-node)")


def _in_torchrun(fn, world_size, args, timeout, backend, capacity, trace, memory):
    """The same call under torchrun: the world already exists, so join it instead of forking."""
    check_torchrun_world(world_size)
    return torchrun.run_in_torchrun(fn, tuple(args), capacity, trace, memory, backend=backend, timeout=timeout)


# What a rank's error says when a peer went away under it (gloo's tcp transport, NCCL): the
# consequence of another rank's failure, not a cause of its own.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket closed",
             "remote process exited or there was a network error")
PEER_GRACE = 2.0  # seconds to wait, after such an error, for the rank whose failure caused it


def _peer_lost(kind, payload) -> bool:
    return kind not in ("ok", "died", "unpicklable") and any(s in payload.get("summary", "") for s in PEER_LOST)


POLL_S = 0.1  # how often a launch with ``hopeless`` asks it


def _collect(procs, conns, timeout, hopeless=None):
    """Wait for each rank's result; raise on the first failure, death or the deadline.
    A rank first reports that it joined the process group, then its result: a timeout can then
    tell a world that never came up from ranks stuck inside ``fn``. A rank whose error only says a
    peer went away ("Connection reset by peer") is not taken as the cause at once: for up to
    ``PEER_GRACE`` s a rank that died or failed of its own error is looked for, and named first.
    """
    deadline = time.monotonic() + timeout
    messages = [None] * len(procs)
    pending, joined = set(range(len(procs))), set()
    consequence = None  # (rank, kind, payload) of the first peer-lost error, while waiting for its cause
    while pending:
        remaining = deadline - time.monotonic()
        if consequence is not None:
            if remaining <= 0 or time.monotonic() >= consequence[3]:
                _raise_for(*consequence[:3])
            remaining = min(remaining, consequence[3] - time.monotonic())
        if remaining <= 0 or (hopeless is not None and consequence is None and hopeless(frozenset(pending))):
            raise _timeout(sorted(pending), joined, len(procs), timeout)
        if hopeless is not None:
            remaining = min(remaining, POLL_S)
        ready = wait([conns[r] for r in pending] + [procs[r].sentinel for r in pending], timeout=remaining)
        for rank in sorted(pending):
            conn, proc = conns[rank], procs[rank]
            if conn in ready or (proc.sentinel in ready and conn.poll()):
                try:
                    kind, payload = pickle.loads(conn.recv_bytes())
                except EOFError:
                    kind, payload = "died", {}
            elif proc.sentinel in ready:
                kind, payload = "died", {}
            else:
                continue
            if kind == "joined":
                joined.add(rank)
                continue
            if kind == "died":
                with _REAPING:
                    proc.join(timeout=1)
                after = "" if consequence is None else (f" (then rank {consequence[0]} failed: "
                                                        f"{consequence[2]['summary']})")
                raise LaunchError(f"rank {rank} {_death_reason(proc.exitcode)}{after}", rank=rank,
                                  traceback=f"rank {rank} {_death_reason(proc.exitcode)}", exc_type="died")
            if _peer_lost(kind, payload):
                pending.discard(rank)
                if consequence is None:
                    consequence = (rank, kind, payload, time.monotonic() + PEER_GRACE)
                continue
            _raise_for(kind, rank, payload)
            messages[rank] = payload
            pending.discard(rank)
    if consequence is not None:  # every other rank finished: the peer-lost error is all there is
        _raise_for(*consequence[:3])
    return messages


def _timeout(pending, joined, world_size, timeout) -> LaunchTimeout:
    outside = [rank for rank in pending if rank not in joined]
    inside = [rank for rank in pending if rank in joined]
    returned = sorted(set(range(world_size)) - set(pending))
    parts = []
    if inside:
        early = (f"; ranks {returned} had returned, so a collective or recv that they never joined is a likely cause"
                 if returned else "")
        parts.append(f"ranks {inside} had not finished after timeout={timeout:g}s{early} (a deadlock: mismatched "
                     f"collectives, a missing send/recv; or work that needs a longer timeout)")
    if outside:
        parts.append(f"ranks {outside} had not joined the process group after timeout={timeout:g}s (starting "
                     f"{world_size} ranks took longer than that: a busy machine, or too many ranks for it; raise timeout)")
    return LaunchTimeout("; ".join(parts) + "; all ranks were stopped", ranks=pending)


def _raise_for(kind, rank, payload):
    if kind == "ok":
        return
    output = payload.get("output", "")
    if kind == "unpicklable":
        raise TypeError(f"rank {rank} returned a {payload['type_name']} that cannot be sent back "
                        f"({payload['error']}); return plain Python values, numbers, lists/dicts or tensors")
    error_cls = RankOutOfMemory if kind == "oom" else LaunchError
    raise error_cls(f"rank {rank} failed: {payload['summary']}\n\n--- traceback of rank {rank} ---\n"
                    f"{payload['traceback']}", rank=rank, traceback=payload["traceback"], output=output,
                    exc_type=payload["exc_type"])
