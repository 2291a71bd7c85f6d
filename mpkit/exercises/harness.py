"""Running a learner's code on simulated devices, watched.

Each case runs in its own ``mpkit.launch`` world, so a learner's crash or deadlock costs only the
case it happened in. Inside a rank, every message and collective the learner makes is recorded at
the process group (``ProcessGroup``/``Backend`` methods, so ``dist.all_reduce``, a function imported
with ``from torch.distributed import ...`` before the check, ``group.allreduce([t])`` and
``batch_isend_irecv`` are all seen) — kind, global peer rank, elements, which phase of the step — so a checker
can tell a ring from an all-reduce, count the all-reduces of a forward, or see a bucket that is
too large. Before a call blocks, the rank writes what it waits on to a status file: when every rank
still running is blocked in a call that nothing can complete (``_Hopeless``), or the world does not
finish within ``timeout`` (a loop), the checker says which ranks waited on what. An exception in
the learner's code comes back with the learner's own lines, not mpkit's or torch's.

The harness itself makes no collective on the learner's group (the comparison happens in the
caller, on the tensors the ranks return, turned into plain tensors first: a subclass that lies in
its arithmetic is judged by its data), so its bookkeeping never matches a learner's message. A
learner's code that calls mpkit's own mechanism or reference solution fails the case
(``reference_use``).
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d_c

from mpkit.errors import LaunchError, LaunchTimeout
from mpkit.exercises.reference_use import ReferenceWatch, UsedReference
from mpkit.exercises.result import Text
from mpkit.runtime.launch import launch

# ProcessGroup/Backend method -> the torch.distributed name a Call records (what the checkers count)
KINDS = {"send": "send", "recv": "recv", "recv_anysource": "recv", "allreduce": "all_reduce",
         "allreduce_coalesced": "all_reduce", "broadcast": "broadcast", "reduce": "reduce", "allgather": "all_gather",
         "allgather_coalesced": "all_gather", "_allgather_base": "all_gather_into_tensor",
         "all_gather_single": "all_gather_into_tensor", "allgather_into_tensor_coalesced": "all_gather_into_tensor",
         "all_gather_single_coalesced": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter",
         "_reduce_scatter_base": "reduce_scatter_tensor", "reduce_scatter_single": "reduce_scatter_tensor",
         "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
         "reduce_scatter_single_coalesced": "reduce_scatter_tensor", "alltoall": "all_to_all",
         "alltoall_base": "all_to_all_single", "all_to_all_single": "all_to_all_single", "barrier": "barrier",
         "monitored_barrier": "barrier", "scatter": "scatter", "gather": "gather"}
# torch's operators a learner may call without a ProcessGroup method (functional collectives, the c10d
# ops themselves): namespace -> {operator: kind}; torch's C++ side calls them without this lookup
OPERATORS = {
    "_c10d_functional": {"all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
                         "all_gather_into_tensor": "all_gather_into_tensor",
                         "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
                         "reduce_scatter_tensor": "reduce_scatter_tensor",
                         "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
                         "all_to_all_single": "all_to_all_single", "broadcast": "broadcast", "isend": "send",
                         "irecv": "recv", "batch_p2p_ops": "send"},
    "c10d": {"send": "send", "recv_": "recv", "recv_any_source_": "recv", "allreduce_": "all_reduce",
             "allreduce_coalesced_": "all_reduce", "broadcast_": "broadcast", "reduce_": "reduce",
             "allgather_": "all_gather", "_allgather_base_": "all_gather_into_tensor",
             "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather_into_tensor",
             "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
             "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor", "alltoall_": "all_to_all",
             "alltoall_base_": "all_to_all_single", "barrier": "barrier", "monitored_barrier_": "barrier",
             "scatter_": "scatter", "gather_": "gather"},
}
RUNNING, RETURNED = "running your code", "returned from your code"
_STATES_KO = {RUNNING: "코드를 실행 중(통신을 기다리지 않음)", RETURNED: "코드에서 돌아옴",
              "had not started (a busy machine?)": "시작하지 못함(바쁜 컴퓨터?)"}
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

    def describe_ko(self) -> str:
        where = f" 랭크 {self.peer}{'에게' if self.kind == 'send' else '에게서'}" if self.peer is not None else ""
        return f"{self.kind}{where} (원소 {self.numel}개)"


class LearnerCrashed(Exception):
    """The learner's code raised on ``rank``; ``text`` is the traceback with their own lines."""

    def __init__(self, rank: int, text: str, world_size: int | None = None):
        super().__init__(text)
        self.rank, self.text, self.world_size = rank, text, world_size


class Stuck(Exception):
    """No rank could go on, or the world did not finish in time; ``waits[rank]`` is what that rank was
    doing (``waits_ko``: the same in Korean). In a world of one process there is no learner's rank to
    name: that process is the checker running the learner's function."""

    def __init__(self, waits: dict, waits_ko: dict | None = None):
        super().__init__(str(waits))
        self.waits = waits
        self.waits_ko = waits_ko or {r: _STATES_KO.get(what, what) for r, what in waits.items()}

    def ranks(self, state: str) -> list:
        """The ranks in ``state``: "waiting" (blocked in a message or collective), RUNNING (inside the
        learner's code, not communicating: a loop), RETURNED (done with the learner's code)."""
        return sorted(r for r, what in self.waits.items() if (state in what if state == "waiting" else what == state))

    def describe(self) -> str:
        return self.text().en

    def text(self) -> Text:
        """What each rank was doing, e.g. "rank 0: send to rank 1 (12 elements), waiting"."""
        if len(self.waits) == 1:
            (rank, what), = self.waits.items()
            if what == RUNNING:
                return Text("여러분의 코드가 아직 실행 중이었습니다(통신을 기다리지 않음).",
                            "your code was still running (not waiting on any message).")
            return Text(f"여러분의 코드: {self.waits_ko[rank]}.", f"your code: {what}.")
        return Text("; ".join(f"랭크 {r}: {self.waits_ko[r]}" for r in sorted(self.waits)),
                    "; ".join(f"rank {r}: {what}" for r, what in sorted(self.waits.items())))


def _first_tensor(value):
    """The first tensor of a ProcessGroup argument (a tensor, or lists of lists of them): what the
    op moves per rank, as torch.distributed's own first tensor argument."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _global(group, rank):
    """A group rank as a rank of the world (a Call's peers are global)."""
    if rank is None or rank < 0:
        return None
    try:
        return dist.get_global_rank(group, rank)
    except (ValueError, RuntimeError, TypeError, KeyError):  # the world, or a backend called directly
        return rank


def _peer(method, group, args, kwargs):
    if method in ("send", "recv"):
        rank = args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("srcRank"))
        return _global(group, int(rank)) if isinstance(rank, int) else None
    opts = next((a for a in (*args, *kwargs.values()) if hasattr(a, "rootRank")), None)
    return None if opts is None else _global(group, opts.rootRank)


def _blocking(frame) -> bool:
    """Whether torch.distributed's function that made this process-group call waits for it: ``send``
    and ``recv``, or a collective with ``async_op=False``; a call made on the group directly returns
    its Work and does not."""
    while frame is not None and (frame.f_globals.get("__name__") or "").startswith("torch.distributed"):
        if frame.f_code.co_name in ("send", "recv"):
            return True
        if "async_op" in frame.f_code.co_varnames:
            return not frame.f_locals.get("async_op", False)
        frame = frame.f_back
    return False


class Recorder:
    """Watches this rank's process groups while ``active``; see the module doc."""

    def __init__(self, rank: int, status_dir: str):
        self.rank, self.calls, self.active, self.inside, self.phase = rank, [], False, False, None
        self.pending = set()   # asynchronous works not waited on yet
        self.seq = 0
        self.status = Path(status_dir) / f"rank{rank}.json"
        self.errors = Path(status_dir) / f"error{rank}.json"
        self.reference = ReferenceWatch()

    def install(self) -> "Recorder":
        """Wrap the methods of ``ProcessGroup`` and ``Backend`` (what every torch.distributed function,
        however imported, and a learner's own ``group.allreduce`` end in); torch's C++ side calls
        the backend directly, so one call is recorded once."""
        for cls in (c10d_c.ProcessGroup, c10d_c.Backend):
            for method in KINDS:
                original = cls.__dict__.get(method)
                if original is not None:
                    setattr(cls, method, self._wrap(method, original))
        for namespace, kinds in OPERATORS.items():
            ops = getattr(torch.ops, namespace)
            for name, kind in kinds.items():
                try:
                    setattr(ops, name, _WatchedOperator(getattr(ops, name), kind, self))
                except (AttributeError, RuntimeError):  # not in this torch
                    pass
        return self

    def record(self, kind, peer, tensor, blocking, caller) -> Call:
        """File one call (after checking that the learner's code did not reach it through mpkit's own)."""
        if self.reference.look(caller):
            raise self.used_reference()
        call = Call(kind, peer, 0 if tensor is None else tensor.numel(), 0 if tensor is None else tensor.element_size(),
                    self.phase, blocking)
        self.calls.append(call)
        return call

    def _set_status(self, what: str, ko: str | None = None, waits_on: Call | None = None) -> None:
        """Write what this rank does; ``seq`` changes with every write, ``on`` is the call it blocks in and
        ``posted`` its calls not completed yet (what :class:`_Hopeless` matches against its peers')."""
        self.seq += 1
        on = None if waits_on is None else [waits_on.kind, waits_on.peer]
        posted = [[w._call.kind, w._call.peer] for w in self.pending] + ([on] if on else [])
        self.status.write_text(json.dumps({"what": what, "ko": ko or _STATES_KO.get(what, what), "seq": self.seq,
                                           "on": on, "posted": posted}), encoding="utf-8")

    def _waiting(self, call: Call, in_wait: bool) -> None:
        if in_wait:
            self._set_status(f"{call.describe()}, waiting in wait()", f"{call.describe_ko()}의 wait()에서 기다리는 중",
                             call)
        else:
            self._set_status(f"{call.describe()}, waiting", f"{call.describe_ko()}에서 기다리는 중", call)

    def _wrap(self, method, original):
        recorder, kind = self, KINDS[method]

        def watched(group, *args, **kwargs):
            if not recorder.active or recorder.inside:
                return original(group, *args, **kwargs)
            caller = sys._getframe(1)
            call = recorder.record(kind, _peer(method, group, args, kwargs), _first_tensor((args, kwargs)),
                                   _blocking(caller), caller)
            recorder.inside = True
            recorder._waiting(call, in_wait=False)  # gloo may block in the call itself (a peer that does not exist)
            try:
                work = original(group, *args, **kwargs)
            finally:
                recorder.inside = False
                recorder._set_status(RUNNING)
            return work if work is None else _Watched(work, recorder, call)
        watched.__name__ = watched.__qualname__ = method
        return watched

    def used_reference(self) -> UsedReference:
        return UsedReference(self.rank, *self.reference.found)

    def call(self, fn, *args, **kwargs):
        """Run the learner's ``fn`` with recording on; on an exception, file the learner's lines."""
        self.reference.provide((fn, *args, *kwargs.values()))
        self.reference.handed(fn)
        self.active = True
        self._set_status(RUNNING)
        self.reference.start()
        try:
            if self.reference.found:
                raise self.used_reference()
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._file_error(exc)
            raise
        finally:
            self.reference.stop()
            self.active = False
            self._set_status(RETURNED)
        if self.reference.found:  # a result computed by mpkit's own code, caught or not on the way
            exc = self.used_reference()
            self._file_error(exc)
            raise exc
        return result

    def _file_error(self, exc) -> None:
        found = self.reference.found
        self.errors.write_text(json.dumps({"text": learner_traceback(exc), "at": time.time(),
                                           "reference": list(found) if found else None}), encoding="utf-8")


class _WatchedOperator:
    """One of torch's communication operators (``torch.ops._c10d_functional.all_reduce``...), recorded
    when the learner's code calls it directly; everything else (``.default``, the schema) is the operator's."""

    def __init__(self, op, kind, recorder):
        self._op, self._kind, self._recorder = op, kind, recorder

    def __call__(self, *args, **kwargs):
        recorder = self._recorder
        if not recorder.active or recorder.inside:
            return self._op(*args, **kwargs)
        peer = None
        if self._kind in ("send", "recv") and len(args) > 3 and isinstance(args[1], int):  # (tensor, peer, tag, group)
            peer = _global(_group_named(args[3]), args[1])
        recorder.record(self._kind, peer, _first_tensor((args, kwargs)), False, sys._getframe(1))
        recorder.inside = True
        try:
            return self._op(*args, **kwargs)
        finally:
            recorder.inside = False

    def __getattr__(self, name):
        return getattr(self._op, name)


def _group_named(name):
    try:
        return dist.distributed_c10d._resolve_process_group(name) if isinstance(name, str) else name
    except (ValueError, RuntimeError, KeyError, AttributeError):
        return None


class _Watched:
    """A Work whose ``wait()`` says, while it blocks, what it waits on."""

    def __init__(self, work, recorder, call):
        self._work, self._recorder, self._call = work, recorder, call
        recorder.pending.add(self)

    def wait(self, *args, **kwargs):
        self._recorder._waiting(self._call, in_wait=not self._call.blocking)
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


def plain(value):
    """``value`` as the checker may judge it: every tensor a plain, detached ``torch.Tensor`` copy of
    its data (a subclass that overrides ``__eq__``, ``sub`` or ``allclose`` lies no more), builtin
    numbers and strings of their exact type, lists, tuples and dicts rebuilt."""
    if isinstance(value, torch.Tensor):
        with torch._C.DisableTorchFunction():
            return torch.Tensor.as_subclass(value, torch.Tensor).detach().clone()
    if isinstance(value, bool):
        return bool(value)
    for base, exact in _EXACT.items():
        if isinstance(value, base):
            return exact(value)  # the base type's own slot: a subclass's overrides are not called
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in dict.items(value)}
    if isinstance(value, list):
        return [plain(v) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        items = [plain(v) for v in tuple.__iter__(value)]
        if (type(value).__module__ or "").partition(".")[0] not in ("mpkit", "torch"):
            return tuple(items)  # a learner's tuple subclass
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)  # a named tuple, Size
    return value


_EXACT = {int: int.__int__, float: float.__float__, complex: complex.__complex__, str: str.__str__,
          bytes: bytes.__bytes__}


# status files are written around every recorded call: in memory where Linux offers it (25 us a write, not 100-400)
_MEMORY_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
SETTLE_S = 1.0  # how long a hopeless picture must stay the same: far above a small message's latency on a busy machine


class _Hopeless:
    """Whether no rank can go on any more, from the status files: every rank still running is blocked in
    a message or collective that nothing can complete (its peer returned, or waits on something else, and
    posted nothing that matches; or one of them messages a rank that does not exist), and no rank wrote
    a new status for ``SETTLE_S``. A rank running the learner's code (a loop, real work, a sleep before
    a send) keeps the world alive until the timeout."""

    def __init__(self, status_dir, world_size):
        self.status_dir, self.world_size = status_dir, world_size
        self.picture, self.since = None, 0.0

    def __call__(self, running) -> bool:
        statuses = _statuses(self.status_dir, self.world_size, "status")
        picture = (running, tuple(statuses.get(r, {}).get("seq") for r in range(self.world_size)))
        now = time.monotonic()
        if picture != self.picture:
            self.picture, self.since = picture, now
        if not all(statuses.get(r, {}).get("on") for r in running):
            return False
        if not any(self._to_nobody(statuses[r]["on"]) for r in running) and \
                any(self._can_finish(r, statuses, running) for r in running):
            return False
        return now - self.since >= SETTLE_S

    def _to_nobody(self, on) -> bool:
        """A message to or from a rank that does not exist: gloo never completes it (or worse)."""
        kind, peer = on
        return kind in ("send", "recv") and peer is not None and not 0 <= peer < self.world_size

    def _can_finish(self, rank, statuses, running) -> bool:
        kind, peer = statuses[rank]["on"]
        if kind not in ("send", "recv"):  # a collective: only if every rank is in one of the same kind
            return len(running) == self.world_size and all(statuses[r]["on"][0] == kind for r in running)
        match = ["recv" if kind == "send" else "send", rank]
        return any(match in statuses[p].get("posted", []) or [match[0], None] in statuses[p].get("posted", [])
                   for p in (statuses if peer is None else [peer]) if p != rank and p in statuses)


def run(body, world_size: int, args=(), timeout: float = 6.0) -> list[dict]:
    """``body(ctx, recorder, *args)`` on ``world_size`` ranks; per rank ``{"out", "calls"}``, made
    :func:`plain`. Raises :class:`LearnerCrashed`, :class:`Stuck` (at ``timeout``, or as soon as
    :class:`_Hopeless` sees a deadlock) or ``UsedReference`` (the learner called mpkit's own
    mechanism); a failure of mpkit's own code propagates."""
    with tempfile.TemporaryDirectory(prefix="mpkit-exercise-", dir=_MEMORY_DIR) as status_dir:
        try:
            results = list(launch(_rank_main, world_size, args=(body, status_dir, tuple(args)), timeout=timeout,
                                  backend="gloo", trace=False, memory=False,  # simulated devices, also beside GPUs
                                  hopeless=_Hopeless(status_dir, world_size)))
        except LaunchTimeout:
            statuses = _statuses(status_dir, world_size, "status")
            late = "had not started (a busy machine?)"
            waits = {r: statuses[r]["what"] if r in statuses else late for r in range(world_size)}
            raise Stuck(waits, {r: statuses[r].get("ko", waits[r]) if r in statuses else _STATES_KO[late]
                                for r in range(world_size)}) from None
        except LaunchError:
            errors = _statuses(status_dir, world_size, "error")
            used = {r: e for r, e in errors.items() if e.get("reference")}
            if used:
                rank = min(used, key=lambda r: used[r]["at"])
                raise UsedReference(rank, *used[rank]["reference"]) from None
            if errors:  # the first learner error is the cause; later ones are other ranks seeing it
                rank = min(errors, key=lambda r: errors[r]["at"])
                raise LearnerCrashed(rank, errors[rank]["text"], world_size) from None
            raise
    return [{"out": plain(r["out"]), "calls": r["calls"]} for r in results]


def _statuses(folder, world_size, kind) -> dict:
    out = {}
    for rank in range(world_size):
        path = Path(folder) / (f"rank{rank}.json" if kind == "status" else f"error{rank}.json")
        try:
            out[rank] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return out
