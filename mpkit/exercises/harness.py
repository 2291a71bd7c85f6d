"""Running a learner's code on simulated devices, watched.

Each case runs in its own ``mpkit.launch`` world, so a learner's crash or deadlock costs only the
case it happened in. Inside a rank, every ``torch.distributed`` call the learner makes (directly or
through ``ctx.comm``) is recorded — kind, peer, elements, which phase of the step — so a checker
can tell a ring from an all-reduce, count the all-reduces of a forward, or see a bucket that is
too large. Before a call blocks, the rank writes what it waits on to a status file: when the world
does not finish within ``timeout``, the checker says which ranks waited on what. An exception in
the learner's code comes back with the learner's own lines, not mpkit's or torch's.

The harness itself makes no collective on the learner's group (the comparison happens in the
caller, on the tensors the ranks return), so its bookkeeping never matches a learner's message.
"""
from __future__ import annotations

import inspect
import json
import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from mpkit.errors import LaunchError, LaunchTimeout
from mpkit.runtime.launch import launch

# The torch.distributed functions a learner may call; mpkit's Comm calls the same names.
WATCHED = ("send", "recv", "isend", "irecv", "all_reduce", "broadcast", "reduce", "all_gather",
           "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
           "all_to_all_single", "barrier", "scatter", "gather")
P2P = ("send", "recv", "isend", "irecv")
RUNNING, RETURNED = "running your code", "returned from your code"
_HIDDEN = (str(Path(__file__).resolve().parents[1]), str(Path(torch.__file__).resolve().parent),
           os.path.dirname(inspect.__file__))


@dataclass(frozen=True)
class Call:
    """One recorded call: ``kind`` (``send``/``recv`` for every point-to-point flavour), the peer
    rank for messages, the elements moved and the phase of the step it was made in."""
    kind: str
    peer: int | None
    numel: int
    element_size: int
    phase: str | None
    blocking: bool

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size

    def describe(self) -> str:
        where = f" {'to' if self.kind == 'send' else 'from'} rank {self.peer}" if self.peer is not None else ""
        return f"{self.kind}{where} ({self.numel} elements)"


class LearnerCrashed(Exception):
    """The learner's code raised on ``rank``; ``text`` is the traceback with their own lines."""

    def __init__(self, rank: int, text: str):
        super().__init__(text)
        self.rank, self.text = rank, text


class Stuck(Exception):
    """The world did not finish in time; ``waits[rank]`` is what that rank was doing."""

    def __init__(self, waits: dict):
        super().__init__(str(waits))
        self.waits = waits

    def ranks(self, state: str) -> list:
        """The ranks in ``state``: "waiting" (blocked in a message or collective), RUNNING (inside the
        learner's code, not communicating: a loop), RETURNED (done with the learner's code)."""
        return sorted(r for r, what in self.waits.items() if (state in what if state == "waiting" else what == state))

    def describe(self) -> str:
        return "; ".join(f"rank {rank}: {what}" for rank, what in sorted(self.waits.items()))


def _tensor_args(name, bound):
    """The tensor an op moves (its first tensor argument, or the list's first) and the peer rank."""
    peer = bound.get("dst", bound.get("src"))
    for value in bound.values():
        if isinstance(value, torch.Tensor):
            return value, peer
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0], peer
    return None, peer


class Recorder:
    """Wraps ``torch.distributed``'s functions in this rank while ``active``; see the module doc."""

    def __init__(self, rank: int, status_dir: str):
        self.rank, self.calls, self.active, self.inside, self.phase = rank, [], False, False, None
        self.pending = set()   # asynchronous works not waited on yet
        self.status = Path(status_dir) / f"rank{rank}.json"
        self.errors = Path(status_dir) / f"error{rank}.json"

    def install(self) -> "Recorder":
        """Wrap each function in both namespaces: ``torch.distributed`` (what a learner calls) and
        ``distributed_c10d`` (what ``P2POp`` compares its op with and ``batch_isend_irecv`` calls)."""
        for name in WATCHED:
            original = getattr(c10d, name)
            watched = self._wrap(name, original)
            setattr(c10d, name, watched)
            setattr(dist, name, watched)
        return self

    def _set_status(self, what: str) -> None:
        self.status.write_text(json.dumps({"what": what}), encoding="utf-8")

    def _wrap(self, name, original):
        signature = inspect.signature(original)
        recorder = self

        def watched(*args, **kwargs):
            if not recorder.active or recorder.inside:  # torch's send calls its own isend: count it once
                return original(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs).arguments
            tensor, peer = _tensor_args(name, bound)
            kind = name.removeprefix("i") if name in P2P else name
            blocking = name not in ("isend", "irecv") and not bound.get("async_op", False)
            call = Call(kind, None if peer is None else int(peer), 0 if tensor is None else tensor.numel(),
                        0 if tensor is None else tensor.element_size(), recorder.phase, blocking)
            recorder.calls.append(call)
            recorder.inside = True
            try:
                if not blocking:
                    work = original(*args, **kwargs)
                    return work if work is None else _Watched(work, recorder, call)
                recorder._set_status(f"{call.describe()}, waiting")
                result = original(*args, **kwargs)
                recorder._set_status(RUNNING)
                return result
            finally:
                recorder.inside = False
        return watched

    def call(self, fn, *args, **kwargs):
        """Run the learner's ``fn`` with recording on; on an exception, file the learner's lines."""
        self.active = True
        self._set_status(RUNNING)
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            self.errors.write_text(json.dumps({"text": learner_traceback(exc), "at": time.time()}),
                                   encoding="utf-8")
            raise
        finally:
            self.active = False
            self._set_status(RETURNED)


class _Watched:
    """A Work whose ``wait()`` says, while it blocks, what it waits on."""

    def __init__(self, work, recorder, call):
        self._work, self._recorder, self._call = work, recorder, call
        recorder.pending.add(self)

    def wait(self, *args, **kwargs):
        self._recorder._set_status(f"{self._call.describe()}, waiting in wait()")
        result = self._work.wait(*args, **kwargs)
        self._recorder.pending.discard(self)
        self._recorder._set_status(RUNNING if self._recorder.active else RETURNED)
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)


def learner_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` with only the learner's frames (not mpkit's, torch's or Python's)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not any(os.path.abspath(f.filename).startswith(hidden) for hidden in _HIDDEN)]
    lines = traceback.format_list(frames) if frames else []
    return "".join(lines) + "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _rank_main(ctx, body, status_dir, args):
    recorder = Recorder(ctx.rank, status_dir).install()
    out = body(ctx, recorder, *args)
    return {"out": out, "calls": recorder.calls}


def run(body, world_size: int, args=(), timeout: float = 6.0) -> list[dict]:
    """``body(ctx, recorder, *args)`` on ``world_size`` ranks; per rank ``{"out", "calls"}``.
    Raises :class:`LearnerCrashed` or :class:`Stuck`; a failure of mpkit's own code propagates."""
    with tempfile.TemporaryDirectory(prefix="mpkit-exercise-") as status_dir:
        try:
            return list(launch(_rank_main, world_size, args=(body, status_dir, tuple(args)), timeout=timeout,
                               backend="gloo", trace=False, memory=False))  # simulated devices, also beside GPUs
        except LaunchTimeout:
            waits = _statuses(status_dir, world_size, "status")
            waits.update({r: "had not started (a busy machine?)" for r in range(world_size) if r not in waits})
            raise Stuck(waits) from None
        except LaunchError:
            errors = _statuses(status_dir, world_size, "error")
            if errors:  # the first learner error is the cause; later ones are other ranks seeing it
                rank = min(errors, key=lambda r: errors[r]["at"])
                raise LearnerCrashed(rank, errors[rank]["text"]) from None
            raise


def _statuses(folder, world_size, kind) -> dict:
    out = {}
    for rank in range(world_size):
        path = Path(folder) / (f"rank{rank}.json" if kind == "status" else f"error{rank}.json")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        out[rank] = data["what"] if kind == "status" else data
    return out
