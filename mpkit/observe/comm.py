"""``ctx.comm``: torch.distributed collectives and p2p ops that log one trace event each.

``bytes`` on an event is what this rank put on the wire: exact for send/recv (payload), and for
collectives the payload size S the op was called with (the name says which algorithm bytes apply,
e.g. ring all-reduce moves 2(N-1)/N·S; see ``mpkit.sim.formulas``). Async ops record their
real completion time (the Work's future, or wait()), so overlap with compute shows in the timeline.
"""
from __future__ import annotations

import threading

import torch
import torch.distributed as dist

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "product": dist.ReduceOp.PRODUCT}


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class TracedWork:
    """A ``dist.Work`` whose completion is logged as one event (start at issue, end when done).

    The end comes from the Work's future where the backend has one (gloo collectives), else
    from ``wait()`` (gloo isend/irecv raise "getFuture not implemented"). ``wait()`` records too
    when the callback has not run yet, since gloo may return from wait before running it.
    """

    def __init__(self, work, trace, kind, start, **event):
        self._work = work
        self._pending = (trace, kind, start, event)
        self._lock = threading.Lock()
        try:
            work.get_future().then(lambda _f: self._record())
        except RuntimeError:
            pass

    def _record(self):
        with self._lock:
            if self._pending is not None:
                trace, kind, start, event = self._pending
                self._pending = None
                trace.record(kind, start, trace.now(), **event)

    def wait(self):
        self._work.wait()
        self._record()
        return True

    def is_completed(self):
        return self._work.is_completed()


class Comm:
    def __init__(self, ctx):
        self._ctx = ctx

    @property
    def trace(self):
        return self._ctx.trace

    def _run(self, kind, op, size, async_op, *, stage=None, micro_batch=None, name=""):
        start = self.trace.now()
        with self._ctx.memory.communicating():
            work = op(async_op)
        event = dict(stage=stage, micro_batch=micro_batch, bytes=size, name=name)
        if async_op:
            return TracedWork(work, self.trace, kind, start, **event)
        self.trace.record(kind, start, self.trace.now(), **event)
        return None

    def all_reduce(self, tensor, op="sum", group=None, async_op=False, **tags):
        """``op="avg"`` divides by the group size after summing (gloo has no AVG), so it is sync only."""
        if op == "avg" and async_op:
            raise ValueError("all_reduce(op='avg', async_op=True): use op='sum' and divide after wait()")
        reduce_op = _REDUCE_OPS["sum" if op == "avg" else op]
        work = self._run("all_reduce", lambda a: dist.all_reduce(tensor, reduce_op, group, a),
                         nbytes(tensor), async_op, **tags)
        if op == "avg":
            tensor.div_(dist.get_world_size(group))
        return work

    def broadcast(self, tensor, src, group=None, async_op=False, **tags):
        return self._run("broadcast", lambda a: dist.broadcast(tensor, src, group, a), nbytes(tensor), async_op, **tags)

    def all_gather_into_tensor(self, output, input, group=None, async_op=False, **tags):
        return self._run("all_gather", lambda a: dist.all_gather_into_tensor(output, input, group, a),
                         nbytes(output), async_op, **tags)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False, **tags):
        return self._run("all_gather", lambda a: dist.all_gather(tensor_list, tensor, group, a),
                         sum(nbytes(t) for t in tensor_list), async_op, **tags)

    def reduce_scatter_tensor(self, output, input, op="sum", group=None, async_op=False, **tags):
        return self._run("reduce_scatter",
                         lambda a: dist.reduce_scatter_tensor(output, input, _REDUCE_OPS[op], group, a),
                         nbytes(input), async_op, **tags)

    def send(self, tensor, dst, group=None, **tags):
        self._run("send", lambda a: dist.send(tensor, dst, group), nbytes(tensor), False, **tags)

    def recv(self, tensor, src, group=None, **tags):
        """Blocking receive; its event spans the wait, so a stalled stage shows as recv time."""
        self._run("recv", lambda a: dist.recv(tensor, src, group), 0, False, **tags)
        return tensor

    def isend(self, tensor, dst, group=None, **tags):
        return self._run("send", lambda a: dist.isend(tensor, dst, group), nbytes(tensor), True, **tags)

    def irecv(self, tensor, src, group=None, **tags):
        return self._run("recv", lambda a: dist.irecv(tensor, src, group), 0, True, **tags)

    def barrier(self, group=None, **tags):
        self._run("barrier", lambda a: dist.barrier(group, async_op=a), 0, False, **tags)
