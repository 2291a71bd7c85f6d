"""The event log: merged across ranks on one clock, its measures on timelines with known answers,
and the Chrome export."""
import json
import statistics
import time

import pytest

import mpkit
from mpkit.observe.trace import KINDS, Event, Trace


def _barriers_after_a_late_start(ctx):
    ctx.set_step(7)
    if ctx.rank == 1:
        time.sleep(0.2)  # rank 1 arrives late: rank 0's first barrier must wait for it
    for i in range(5):
        with ctx.trace.span("compute", micro_batch=i):
            sum(range(1000))
        ctx.comm.barrier()


@pytest.mark.timeout(30)
def test_merged_trace_has_every_rank_on_one_clock():
    trace = mpkit.launch(_barriers_after_a_late_start, 2, timeout=20).trace
    assert trace.ranks == [0, 1]
    assert min(e.start for e in trace.events) == 0.0
    assert all(e.end >= e.start >= 0 for e in trace.events)
    assert {e.step for e in trace.events} == {7}
    ends = {r: [e.end for e in trace.of_rank(r) if e.kind == "barrier"] for r in (0, 1)}
    assert len(ends[0]) == len(ends[1]) == 5
    # A barrier ends at one moment on every rank; a per-rank shift would show up as ~200 ms here.
    # 50 ms: far above a wake-up's lag on a busy machine (0.6-3.2 ms each, BENCHMARKS.md), far below it.
    assert statistics.median(abs(a - b) for a, b in zip(ends[0], ends[1])) < 0.05
    first = trace.filter(kind="barrier").of_rank(0)[0]
    assert first.duration > 0.15  # rank 0 really waited for the late rank
    assert [e.micro_batch for e in trace.filter(kind="compute").of_rank(1)] == [0, 1, 2, 3, 4]


@pytest.mark.timeout(30)
def test_trace_off_records_nothing():
    assert len(mpkit.launch(_barriers_after_a_late_start, 2, timeout=20, trace=False).trace) == 0


def test_span_records_kind_stage_micro_batch_and_step():
    ticks = iter([1.0, 3.5])
    trace = Trace(rank=3, clock=lambda: next(ticks))
    trace.step = 2
    with trace.span("forward", stage=1, micro_batch=4, name="block0"):
        pass
    assert trace.events == [Event(rank=3, kind="forward", start=1.0, end=3.5, stage=1, micro_batch=4,
                                  bytes=0, name="block0", step=2)]


def test_span_is_recorded_even_when_the_body_raises():
    trace = Trace()
    with pytest.raises(ZeroDivisionError):
        with trace.span("backward"):
            1 / 0
    assert [e.kind for e in trace.events] == ["backward"]


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        Trace().record("teleport", 0.0, 1.0)
    assert "teleport" in str(info.value)
    assert all(kind in str(info.value) for kind in KINDS)


def _ev(rank, kind, start, end, **kw):
    return Event(rank, kind, float(start), float(end), **kw)


def test_bubble_share_of_a_half_idle_rank():
    trace = Trace(events=[_ev(0, "forward", 0, 10), _ev(1, "forward", 5, 10)])
    assert trace.bubble_share() == pytest.approx(0.25)  # 5 idle rank-seconds of 20


def test_comm_share_and_busy_time():
    trace = Trace(events=[_ev(0, "forward", 0, 10), _ev(1, "recv", 0, 5, bytes=0),
                          _ev(1, "backward", 5, 10), _ev(1, "send", 8, 10, bytes=64)])
    assert trace.comm_share() == pytest.approx(7 / 20)
    assert trace.bubble_share() == pytest.approx(5 / 20)  # comm not hidden behind compute counts
    assert trace.busy_time(1, "comm") == pytest.approx(7)
    assert trace.bytes_by_kind() == {1: {"send": 64}}


def test_overlapping_spans_count_once():
    trace = Trace(events=[_ev(0, "forward", 0, 4), _ev(0, "backward", 2, 6), _ev(0, "compute", 3, 5),
                          _ev(0, "optimizer", 8, 9)])
    assert trace.busy_time(0, "compute") == pytest.approx(7)  # [0, 6] and [8, 9]


@pytest.mark.parametrize("p, m", [(2, 1), (4, 4), (4, 8)])
def test_gpipe_timeline_has_the_textbook_bubble(p, m):
    """Unit-time GPipe: forward of micro-batch i on stage s at s+i, backward mirrored after."""
    events = []
    for s in range(p):
        for i in range(m):
            events.append(_ev(s, "forward", s + i, s + i + 1, stage=s, micro_batch=i))
            b = (m + p - 1) + (p - 1 - s) + i
            events.append(_ev(s, "backward", b, b + 1, stage=s, micro_batch=i))
    assert Trace(events=events).bubble_share() == pytest.approx((p - 1) / (m + p - 1))


def test_merge_shifts_to_zero_and_orders_by_rank():
    a = Trace(events=[_ev(1, "forward", 105, 106)])
    b = Trace(events=[_ev(0, "forward", 101, 102), _ev(0, "send", 100, 101)])
    merged = Trace.merge([a, b])
    assert [(e.rank, e.kind, e.start, e.end) for e in merged.events] == [
        (0, "send", 0.0, 1.0), (0, "forward", 1.0, 2.0), (1, "forward", 5.0, 6.0)]
    assert merged.window() == (0.0, 6.0)


def test_chrome_trace_has_one_process_per_rank_in_microseconds(tmp_path):
    trace = Trace(events=[_ev(0, "forward", 1.5, 1.75, stage=0, micro_batch=2),
                          _ev(1, "all_reduce", 0.5, 1.0, bytes=4096), _ev(2, "idle", 0, 2)])
    path = trace.to_chrome(tmp_path / "trace.json")
    data = json.loads(open(path).read())
    records = data["traceEvents"]
    names = {r["pid"]: r["args"]["name"] for r in records if r["ph"] == "M" and r["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2"}
    spans = {r["pid"]: r for r in records if r["ph"] == "X"}
    assert spans[0]["ts"] == pytest.approx(1.5e6) and spans[0]["dur"] == pytest.approx(2.5e5)
    assert spans[0]["name"] == "forward mb2" and spans[0]["args"] == {"stage": 0, "micro_batch": 2}
    assert spans[1]["cat"] == "comm" and spans[1]["args"]["bytes"] == 4096
    assert {r["tid"] for r in spans.values()} == {0, 1, 2}  # compute, comm, idle lanes
