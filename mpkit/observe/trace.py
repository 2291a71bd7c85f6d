"""One event log per run: every compute span and every message, on a clock shared by all ranks.

Plots, bubble measurement, the Chrome trace and the cost-model comparison all read this log, so
the recorder is deliberately tiny: a list of ``Event`` tuples with start/end in seconds.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

COMPUTE_KINDS = ("forward", "backward", "optimizer", "compute")
COMM_KINDS = (
    "send", "recv", "all_reduce", "all_gather", "reduce_scatter", "broadcast",
    "reduce", "barrier", "all_to_all", "rpc", "wait",
)
IDLE_KIND = "idle"
KINDS = (*COMPUTE_KINDS, *COMM_KINDS, IDLE_KIND)


def category(kind: str) -> str:
    """'compute', 'comm' or 'idle' for an event kind."""
    if kind in COMPUTE_KINDS:
        return "compute"
    if kind in COMM_KINDS:
        return "comm"
    if kind == IDLE_KIND:
        return "idle"
    raise ValueError(f"unknown event kind {kind!r}; use one of {', '.join(KINDS)}")


def merged_spans(events) -> list[list[float]]:
    """The events' [start, end] spans in time order, overlapping (or touching) ones merged into one."""
    spans = []
    for start, end in sorted((e.start, e.end) for e in events):
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    return spans


def union_seconds(events) -> float:
    """Seconds covered by the events' [start, end] spans; overlapping spans count once."""
    return sum(end - start for start, end in merged_spans(events))


@dataclass(frozen=True)
class Event:
    """One timed operation on one rank. ``bytes`` is what this rank put on the wire (0 for compute);
    ``group`` names the process group a communication ran in ("dp", "tp", "pp" on a 3D mesh; "" for
    the whole world), so plots can tell the dimensions apart."""

    rank: int
    kind: str
    start: float
    end: float
    stage: int | None = None
    micro_batch: int | None = None
    bytes: int = 0
    name: str = ""
    step: int | None = None
    group: str = ""

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def category(self) -> str:
        return category(self.kind)


@dataclass
class Trace:
    """The events of all ranks of one run (or the recorder of one rank while it runs)."""

    events: list[Event] = field(default_factory=list)
    rank: int = 0
    enabled: bool = True
    clock: callable = time.perf_counter
    step: int | None = None
    t0: float = 0.0  # clock value subtracted by merge(), to align memory samples with events

    # ---- recording (inside a rank) ----
    def record(self, kind, start, end, *, stage=None, micro_batch=None, bytes=0, name="", rank=None, group="",
               step=None):
        """One event; ``step`` defaults to the current one (``set_step``). Code on another thread
        than the rank's loop (an rpc handler) passes the step its work belongs to instead."""
        if self.enabled:
            category(kind)
            self.events.append(Event(self.rank if rank is None else rank, kind, start, end,
                                     stage, micro_batch, int(bytes), name, self.step if step is None else step, group))

    @contextmanager
    def span(self, kind, *, stage=None, micro_batch=None, bytes=0, name=""):
        """Time the body as one event: ``with ctx.trace.span("forward", stage=1, micro_batch=0): ...``."""
        start = self.clock()
        try:
            yield
        finally:
            self.record(kind, start, self.clock(), stage=stage, micro_batch=micro_batch, bytes=bytes, name=name)

    def now(self) -> float:
        return self.clock()

    # ---- analysis (on the merged trace) ----
    @classmethod
    def merge(cls, traces) -> "Trace":
        """One trace from per-rank ones, times shifted so the earliest event starts at 0 (the
        shift is kept as ``t0``: ``MemoryReport.timeline(trace.t0)`` puts memory on the same axis)."""
        events = [e for t in traces for e in t.events]
        t0 = min((e.start for e in events), default=0.0)
        shifted = [Event(**{**asdict(e), "start": e.start - t0, "end": e.end - t0}) for e in events]
        shifted.sort(key=lambda e: (e.rank, e.start))
        return cls(events=shifted, enabled=False, t0=t0)

    @property
    def ranks(self) -> list[int]:
        return sorted({e.rank for e in self.events})

    def of_rank(self, rank: int) -> list[Event]:
        """``rank``'s events, from an index built once per list of events (a scan per rank made
        every per-rank sum quadratic: 2.2 s of a 1,024-rank prediction)."""
        key = (id(self.events), len(self.events))
        if getattr(self, "_by_rank_key", None) != key:
            index: dict[int, list[Event]] = {}
            for e in self.events:
                index.setdefault(e.rank, []).append(e)
            self._by_rank, self._by_rank_key = index, key
        return list(self._by_rank.get(rank, ()))

    def filter(self, *, kind=None, category=None, step=None) -> "Trace":
        keep = [e for e in self.events
                if (kind is None or e.kind == kind)
                and (category is None or e.category == category)
                and (step is None or e.step == step)]
        return Trace(events=keep, enabled=False)

    def window(self) -> tuple[float, float]:
        """(first start, last end) over all ranks."""
        if not self.events:
            return (0.0, 0.0)
        return (min(e.start for e in self.events), max(e.end for e in self.events))

    def busy_time(self, rank: int, category_name: str) -> float:
        """Seconds in which ``rank`` did work of a category; overlapping spans count once."""
        return union_seconds(e for e in self.of_rank(rank) if e.category == category_name)

    def bubble_share(self) -> float:
        """Share of rank-time not spent computing, inside the trace window: the pipeline bubble
        (plus any communication not hidden behind compute)."""
        start, end = self.window()
        span = end - start
        if span <= 0 or not self.ranks:
            return 0.0
        busy = sum(self.busy_time(r, "compute") for r in self.ranks)
        return 1.0 - busy / (span * len(self.ranks))

    def pipeline_bubble(self, step: int) -> float:
        """Share of rank-time not in forward/backward over one step's window (first forward to
        last backward on any rank): the pipeline bubble as (p-1)/(m+p-1) counts it, i.e. only the
        fill and drain of forwards and backwards, without the optimizer."""
        events = [e for e in self.events if e.step == step and e.kind in ("forward", "backward")]
        return Trace(events=events, enabled=False).bubble_share()

    def comm_share(self) -> float:
        """Share of rank-time during which communication was in flight."""
        start, end = self.window()
        span = end - start
        if span <= 0 or not self.ranks:
            return 0.0
        return sum(self.busy_time(r, "comm") for r in self.ranks) / (span * len(self.ranks))

    def bytes_by_kind(self) -> dict[int, dict[str, int]]:
        """{rank: {kind: bytes sent}} for communication events."""
        out: dict[int, dict[str, int]] = {}
        for e in self.events:
            if e.category == "comm" and e.bytes:
                out.setdefault(e.rank, {}).setdefault(e.kind, 0)
                out[e.rank][e.kind] += e.bytes
        return out

    # ---- export ----
    def to_chrome(self, path) -> str:
        """Write a Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev): one process per rank."""
        records = []
        for rank in self.ranks:
            records.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                            "args": {"name": f"rank {rank}"}})
            for tid, cat in enumerate(("compute", "comm", "idle")):
                records.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                                "args": {"name": cat}})
        lanes = {"compute": 0, "comm": 1, "idle": 2}
        for e in self.events:
            label = e.kind if e.micro_batch is None else f"{e.kind} mb{e.micro_batch}"
            # stage 0 / micro-batch 0 / step 0 are real values; only "no bytes" and "no name" are dropped
            args = {k: v for k, v in (("stage", e.stage), ("micro_batch", e.micro_batch), ("step", e.step),
                                      ("bytes", e.bytes or None), ("name", e.name or None),
                                      ("group", e.group or None)) if v is not None}
            records.append({"name": label, "cat": e.category, "ph": "X", "pid": e.rank,
                            "tid": lanes[e.category], "ts": e.start * 1e6, "dur": max(e.duration, 0.0) * 1e6,
                            "args": args})
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"traceEvents": records, "displayTimeUnit": "ms"}, fh)
        return str(path)

    def __len__(self):
        return len(self.events)
