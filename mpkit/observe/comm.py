"""Traced communication: torch.distributed collectives and p2p ops that log one trace event each.

``bytes`` on an event is what this rank put on the wire: exact for send/recv (payload), and for
collectives the payload size S the op was called with (the name says which algorithm bytes apply,
e.g. ring all-reduce moves 2(N-1)/N·S; see ``mpkit.simulator.formulas``). Async ops record their
real completion time (the Work's future, or wait()), so overlap with compute shows in the timeline.
An event names its process group ("dp", "tp", "pp": the group's ``group_desc``, as DeviceMesh sets
it) so a 3D run's plots can colour the dimensions apart.

``Comm`` works in any process group. Without recorders (a user's own ``init_process_group`` world)
it is a thin pass-through to ``torch.distributed``; ``mpkit.observe.active.comm()`` hands out the
recording one of the rank mpkit is running, or that pass-through.
"""
from __future__ import annotations

import threading

import torch
import torch.distributed as dist

BROADCAST_BUCKET_BYTES = 250 * 2**20  # DDP's broadcast_bucket_size (torch/nn/parallel/distributed.py)
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "product": dist.ReduceOp.PRODUCT}


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def group_label(group) -> str:
    """"tp" for a DeviceMesh group described "mesh_tp", the description of a named group, "" for the world."""
    if group is None or group is dist.group.WORLD:
        return ""
    desc = getattr(group, "group_desc", "") or ""
    if desc.startswith("mesh_"):
        return desc[len("mesh_"):]
    return "" if desc in ("undefined", "default_pg") else desc


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
    """Collectives and messages that record into ``trace`` (and file their buffers under "other"
    in ``memory``); with disabled recorders it only calls ``torch.distributed``."""

    def __init__(self, trace, memory):
        self.trace = trace
        self.memory = memory

    def _run(self, kind, op, size, async_op, group=None, *, stage=None, micro_batch=None, name=""):
        start = self.trace.now()
        with self.memory.communicating():
            work = op(async_op)
        if not self.trace.enabled:
            return work
        event = dict(stage=stage, micro_batch=micro_batch, bytes=size, name=name, group=group_label(group))
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
                         nbytes(tensor), async_op, group, **tags)
        if op == "avg":
            tensor.div_(dist.get_world_size(group))
        return work

    def reduce(self, tensor, dst, op="sum", group=None, async_op=False, **tags):
        return self._run("reduce", lambda a: dist.reduce(tensor, dst, _REDUCE_OPS[op], group, a),
                         nbytes(tensor), async_op, group, **tags)

    def broadcast(self, tensor, src, group=None, async_op=False, **tags):
        return self._run("broadcast", lambda a: dist.broadcast(tensor, src, group, a), nbytes(tensor), async_op,
                         group, **tags)

    def broadcast_coalesced(self, tensors, src, group=None, bucket_bytes=BROADCAST_BUCKET_BYTES, name=""):
        """Broadcast ``tensors`` in place with one broadcast per bucket, not one per tensor: DDP's
        ``dist._broadcast_coalesced`` (its buffer sync before a forward and its state sync at
        construction), done here in Python so every bucket is a traced event. Tensors are grouped
        by (device, dtype) in order of first appearance and packed into flat buckets of at most
        ``bucket_bytes`` (DDP's ``broadcast_bucket_size``, 250 MiB; a larger tensor gets one of its
        own). A bucket of one contiguous tensor is sent as it is; otherwise it is copied into one
        flat tensor (a communication buffer, "other" in memory) and back. Returns the buckets sent."""
        groups = {}
        for t in tensors:
            groups.setdefault((t.device, t.dtype), []).append(t)
        buckets = []
        for same in groups.values():
            current, size = [], 0
            for t in same:
                if current and size + nbytes(t) > bucket_bytes:
                    buckets.append(current)
                    current, size = [], 0
                current.append(t)
                size += nbytes(t)
            buckets.append(current)
        receiving = dist.get_rank() != src  # src is a global rank, as in dist.broadcast
        for bucket in buckets:
            label = f"{name} ({len(bucket)} {str(bucket[0].dtype).removeprefix('torch.')} tensors)"
            if len(bucket) == 1 and bucket[0].is_contiguous():
                self.broadcast(bucket[0], src, group, name=label)
                continue
            with self.memory.communicating():
                flat = torch.cat([t.reshape(-1) for t in bucket])
            self.broadcast(flat, src, group, name=label)
            if receiving:
                offset = 0
                for t in bucket:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()
        return buckets

    def all_gather_into_tensor(self, output, input, group=None, async_op=False, **tags):
        return self._run("all_gather", lambda a: dist.all_gather_into_tensor(output, input, group, a),
                         nbytes(output), async_op, group, **tags)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False, **tags):
        return self._run("all_gather", lambda a: dist.all_gather(tensor_list, tensor, group, a),
                         sum(nbytes(t) for t in tensor_list), async_op, group, **tags)

    def reduce_scatter_tensor(self, output, input, op="sum", group=None, async_op=False, **tags):
        return self._run("reduce_scatter",
                         lambda a: dist.reduce_scatter_tensor(output, input, _REDUCE_OPS[op], group, a),
                         nbytes(input), async_op, group, **tags)

    def all_to_all_single(self, output, input, group=None, async_op=False, output_split_sizes=None,
                          input_split_sizes=None, **tags):
        """Split sizes (rows of dim 0 to and from each rank) as ``dist.all_to_all_single``'s: an
        uneven exchange (Ulysses' uneven heads, a dropless MoE's tokens)."""
        return self._run("all_to_all", lambda a: dist.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, group=group, async_op=a),
            nbytes(input), async_op, group, **tags)

    def send(self, tensor, dst, group=None, **tags):
        self._run("send", lambda a: dist.send(tensor, dst, group), nbytes(tensor), False, group, **tags)

    def recv(self, tensor, src, group=None, **tags):
        """Blocking receive; its event spans the wait, so a stalled stage shows as recv time."""
        self._run("recv", lambda a: dist.recv(tensor, src, group), 0, False, group, **tags)
        return tensor

    def isend(self, tensor, dst, group=None, **tags):
        return self._run("send", lambda a: dist.isend(tensor, dst, group), nbytes(tensor), True, group, **tags)

    def irecv(self, tensor, src, group=None, **tags):
        return self._run("recv", lambda a: dist.irecv(tensor, src, group), 0, True, group, **tags)

    def barrier(self, group=None, **tags):
        self._run("barrier", lambda a: dist.barrier(group, async_op=a), 0, False, group, **tags)
