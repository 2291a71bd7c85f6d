"""ctx.comm: every traced op does the real collective and logs exactly one event with its bytes."""
import pytest
import torch

import mpkit


def _each_op_once(ctx):
    """Run every op; return {op: (new events as (kind, bytes), result values)} for this rank."""
    log = {}

    def record(op, run):
        before = len(ctx.trace.events)
        value = run()
        log[op] = ([(e.kind, e.bytes) for e in ctx.trace.events[before:]], value)

    rank, peer = ctx.rank, 1 - ctx.rank
    if rank == 0:
        record("p2p", lambda: ctx.comm.send(torch.arange(10.0), 1))
    else:
        record("p2p", lambda: ctx.comm.recv(torch.zeros(10), 0).tolist())
    record("all_reduce", lambda: _apply(ctx.comm.all_reduce, torch.full((6,), rank + 1.0)))
    record("avg", lambda: _apply(lambda t: ctx.comm.all_reduce(t, op="avg"), torch.full((2,), rank + 1.0)))
    record("broadcast", lambda: _apply(lambda t: ctx.comm.broadcast(t, src=1), torch.full((5,), float(rank))))
    out = torch.zeros(6)
    record("all_gather", lambda: (ctx.comm.all_gather_into_tensor(out, torch.full((3,), float(rank))),
                                  out.tolist())[1])
    parts = [torch.zeros(2), torch.zeros(2)]
    record("all_gather_list", lambda: (ctx.comm.all_gather(parts, torch.full((2,), float(rank))),
                                       [p.tolist() for p in parts])[1])
    small = torch.zeros(2)
    record("reduce_scatter", lambda: (ctx.comm.reduce_scatter_tensor(small, torch.arange(4.0) * (rank + 1)),
                                      small.tolist())[1])
    record("barrier", ctx.comm.barrier)
    return log, peer


def _apply(op, tensor):
    op(tensor)
    return tensor.tolist()


EXPECTED = {  # op: (events on rank 0, events on rank 1, values on rank 0, values on rank 1)
    "p2p": ([("send", 40)], [("recv", 0)], None, [float(i) for i in range(10)]),
    "all_reduce": ([("all_reduce", 24)], [("all_reduce", 24)], [3.0] * 6, [3.0] * 6),
    "avg": ([("all_reduce", 8)], [("all_reduce", 8)], [1.5] * 2, [1.5] * 2),
    "broadcast": ([("broadcast", 20)], [("broadcast", 20)], [1.0] * 5, [1.0] * 5),
    "all_gather": ([("all_gather", 24)], [("all_gather", 24)], [0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1]),
    "all_gather_list": ([("all_gather", 16)], [("all_gather", 16)], [[0, 0], [1, 1]], [[0, 0], [1, 1]]),
    "reduce_scatter": ([("reduce_scatter", 16)], [("reduce_scatter", 16)], [0.0, 3.0], [6.0, 9.0]),
    "barrier": ([("barrier", 0)], [("barrier", 0)], None, None),
}


@pytest.mark.timeout(30)
def test_each_op_logs_one_event_with_its_bytes():
    (log0, _), (log1, _) = mpkit.launch(_each_op_once, 2, timeout=20)
    assert set(log0) == set(log1) == set(EXPECTED)
    for op, (events0, events1, values0, values1) in EXPECTED.items():
        assert (log0[op][0], log1[op][0]) == (events0, events1), op
        assert (log0[op][1], log1[op][1]) == (values0, values1), op


def _async_ops(ctx):
    """Async all_reduce and isend/irecv: the event exists once wait() returned, and only once."""
    issued = ctx.trace.now()
    t = torch.full((4,), ctx.rank + 1.0)
    work = ctx.comm.all_reduce(t, async_op=True)
    work.wait()
    waited = ctx.trace.now()
    after_wait = [e for e in ctx.trace.events if e.kind == "all_reduce"]
    if ctx.rank == 0:
        p2p = ctx.comm.isend(torch.arange(3.0), 1)
        p2p.wait()
        received = None
    else:
        buf = torch.zeros(3)
        p2p = ctx.comm.irecv(buf, 0)
        p2p.wait()
        received = buf.tolist()
    ctx.comm.barrier()  # by now any future callback has run: it must not add a second event
    kinds = [e.kind for e in ctx.trace.events]
    return {"sum": t.tolist(), "after_wait": [(e.start, e.end, e.bytes) for e in after_wait],
            "issued": issued, "waited": waited, "kinds": kinds, "received": received,
            "p2p_completed": p2p.is_completed()}


@pytest.mark.timeout(30)
def test_async_ops_record_their_completion():
    out = mpkit.launch(_async_ops, 2, timeout=20)
    for rank, r in enumerate(out):
        assert r["sum"] == [3.0] * 4
        [(start, end, n_bytes)] = r["after_wait"]
        assert r["issued"] <= start <= end <= r["waited"] and n_bytes == 16
        assert r["kinds"] == ["all_reduce", "send" if rank == 0 else "recv", "barrier"]
        assert r["p2p_completed"]
    assert out[1]["received"] == [0.0, 1.0, 2.0]
    sends = out.trace.filter(kind="send").events
    assert [(e.rank, e.bytes) for e in sends] == [(0, 12)]


def _avg_async(ctx):
    ctx.comm.all_reduce(torch.ones(1), op="avg", async_op=True)


@pytest.mark.timeout(30)
def test_async_avg_is_refused_with_the_alternative():
    with pytest.raises(mpkit.LaunchError) as info:
        mpkit.launch(_avg_async, 2, timeout=20)
    assert "use op='sum' and divide after wait()" in str(info.value)
