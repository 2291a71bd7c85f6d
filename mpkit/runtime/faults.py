"""What a rank sees when its peer dies in the middle of a collective: measured on gloo.

``dead_peer(kind, timeout)`` starts a two-rank gloo world of its own (not ``mpkit.launch``, which
stops every rank the moment one dies: here the survivor must live on to report), runs one
all-reduce so both are connected, then rank 1 fails and rank 0 all-reduces again:

- ``"exit"``: rank 1's process ends (a crash, an OOM kill, a lost machine's process). Its sockets
  close, gloo's pair sees the connection go, and rank 0's collective raises at once ("Connection
  closed by peer"), long before any timeout.
- ``"hang"``: rank 1 stays alive and never joins (a deadlock, a stuck GPU kernel, a rank waiting on
  another collective). Nothing tells rank 0: it waits out the process group's ``timeout``
  (``init_process_group(timeout=...)``; gloo's default is 30 minutes) and raises "Timed out".

NCCL (no GPU here, taught from torch 2.13's sources) has no connection to lose in the same way:
its kernels spin on the GPU, so ProcessGroupNCCL runs a watchdog thread that checks each
collective against the timeout (10 minutes by default for NCCL) and, with
``TORCH_NCCL_ASYNC_ERROR_HANDLING=3`` (the default), tears the process down so torchrun can
restart the job; ``TORCH_NCCL_BLOCKING_WAIT=1`` makes ``wait()`` raise the timeout in the caller
instead.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from mpkit.runtime.lifeline import die_with_parent

KINDS = ("exit", "hang")


@dataclass(frozen=True)
class PeerFailure:
    """What rank 0 saw: ``seconds`` from entering the all-reduce to its error, and the error."""

    kind: str
    timeout: float
    seconds: float
    error: str


def dead_peer(kind: str = "exit", timeout: float = 2.0) -> PeerFailure:
    """Rank 1 ``"exit"``s or ``"hang"``s before a gloo all-reduce; what rank 0 saw, and when."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: use 'exit' (the peer's process ends) or 'hang' (it lives and never joins)")
    if not isinstance(timeout, (int, float)) or not 0.1 <= timeout <= 60:
        raise ValueError(f"timeout={timeout!r}: pass the process group's timeout in seconds, 0.1 to 60")
    context = mp.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    with tempfile.TemporaryDirectory() as folder:
        store = os.path.join(folder, "store")
        ranks = [context.Process(target=_rank, args=(r, store, kind, timeout, send, os.getpid()), daemon=True)
                 for r in range(2)]
        for p in ranks:
            p.start()
        send.close()
        try:
            if not receive.poll(timeout + 30.0):
                raise RuntimeError(f"dead_peer({kind!r}): rank 0 reported nothing within {timeout + 30.0:.0f} s")
            seconds, error = receive.recv()
        finally:
            for p in ranks:
                p.kill()
                p.join()
    return PeerFailure(kind, float(timeout), seconds, error)


def _rank(rank, store, kind, timeout, send, parent) -> None:
    die_with_parent(parent)
    torch.set_num_threads(1)  # a forked child of a torch process (DESIGN: OpenMP after fork)
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=timeout))
    x = torch.ones(1)
    dist.all_reduce(x)  # both connected
    if rank == 1:
        if kind == "exit":
            os._exit(1)
        time.sleep(timeout + 30.0)  # alive, never joining; the parent ends it
        os._exit(0)
    time.sleep(0.2)  # let rank 1 be gone (or settled in its sleep) first
    start = time.perf_counter()
    try:
        dist.all_reduce(x)
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    send.send((time.perf_counter() - start, error))
    os._exit(0)
