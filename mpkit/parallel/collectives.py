"""Collectives written by hand from point-to-point messages, to see where their bytes go.

``ring_all_reduce(ctx, tensor)`` is the ring algorithm NCCL and gloo use for large all-reduces
(Patarasuk & Yuan 2009), built from ``ctx.comm.isend`` / ``ctx.comm.irecv`` so every message is
one traced ``send`` event whose bytes are what really left the rank. Lab 05 runs it and checks
the measured bytes against the formula 2(N-1)/N·S of ``mpkit.sim.formulas.ring_allreduce_bytes``.
"""
from __future__ import annotations

import torch

RING_OPS = ("sum", "avg")


def ring_chunks(numel: int, world_size: int) -> list[int]:
    """Element counts of the N ring chunks of a tensor with ``numel`` elements (``tensor_split``:
    the first ``numel % N`` chunks are one element longer)."""
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


def ring_bytes_sent(numel: int, element_size: int, world_size: int, rank: int) -> int:
    """Bytes ``rank`` sends in ``ring_all_reduce``: every chunk but one in each phase.

    Reduce-scatter: rank r sends chunks r, r-1, ..., r-N+2 (all but chunk r+1); all-gather: chunks
    r+1, r, ..., r-N+3 (all but chunk r+2), indices mod N. With c_i the chunk bytes that is
    2S - c_(r+1) - c_(r+2), which is exactly 2(N-1)/N·S when N divides the element count.
    """
    if world_size == 1:
        return 0
    sizes = [c * element_size for c in ring_chunks(numel, world_size)]
    return 2 * sum(sizes) - sizes[(rank + 1) % world_size] - sizes[(rank + 2) % world_size]


def _exchange(ctx, send, recv, right, left, name):
    """Send ``send`` to the right neighbour while receiving ``recv`` from the left one.

    Both are posted before either is waited on: with blocking send/recv every rank would send
    first and, once messages outgrow the transport's buffers, all of them would wait forever.
    """
    works = []
    if send.numel():  # ranks agree on chunk sizes, so an empty chunk is skipped on both sides
        works.append(ctx.comm.isend(send, right, name=name))
    if recv.numel():
        works.append(ctx.comm.irecv(recv, left, name=name))
    for work in works:
        work.wait()


def ring_all_reduce(ctx, tensor: torch.Tensor, op: str = "sum", wire_dtype: torch.dtype | None = None):
    """All-reduce ``tensor`` in place over all ranks with the ring algorithm; returns ``tensor``.

    The tensor is cut into N chunks (N = world size). Rank r talks only to its neighbours: it
    sends to r+1 and receives from r-1 (mod N).

    1. **Reduce-scatter**, N-1 steps: in step k rank r sends chunk (r-k) and adds the chunk
       (r-k-1) it receives into its own copy. Each chunk travels once around the ring collecting
       one contribution per hop, so after N-1 steps rank r holds the complete sum of chunk (r+1).
    2. **All-gather**, N-1 steps: in step k rank r sends chunk (r+1-k) — first the one it
       completed, then each one it just received — and stores the chunk (r-k) it receives. After
       N-1 steps every rank has every summed chunk.

    That is 2(N-1) steps of one S/N message each, so every rank sends 2(N-1)/N·S bytes (S the
    tensor's bytes): nearly 2S however many ranks there are, which is why the ring scales in
    bandwidth; the latency, 2(N-1) message start-ups, grows with N. Each message is one ``send``
    event (named ``reduce-scatter k`` / ``all-gather k``) on ``ctx.trace``.

    ``op="avg"`` divides the sum by N. ``wire_dtype`` (e.g. ``torch.float16``) compresses what is
    sent: each chunk is cast before it leaves and added back in ``tensor``'s dtype, halving the
    bytes from fp32, at the cost of rounding every partial sum to the wire precision. A rank's
    finished chunk is rounded the same way before the all-gather, so all ranks still end up
    with identical values.
    """
    if op not in RING_OPS:
        raise ValueError(f"op={op!r} is unknown; use one of {', '.join(RING_OPS)}")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor: expected a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point() and (op == "avg" or wire_dtype is not None):
        raise ValueError(f"op='avg' and wire_dtype need a floating-point tensor, got {tensor.dtype}")
    n, rank = ctx.world_size, ctx.rank
    if n == 1:
        if op == "avg":
            tensor.div_(1)
        return tensor
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    chunks = work.view(-1).tensor_split(n)
    wire = tensor.dtype if wire_dtype is None else wire_dtype
    right, left = (rank + 1) % n, (rank - 1) % n

    def outgoing(chunk):
        return chunk if wire == chunk.dtype else chunk.to(wire)

    for k in range(n - 1):  # reduce-scatter
        send, into = chunks[(rank - k) % n], chunks[(rank - k - 1) % n]
        incoming = torch.empty(into.shape, dtype=wire, device=into.device)
        _exchange(ctx, outgoing(send), incoming, right, left, f"reduce-scatter {k}")
        into.add_(incoming.to(into.dtype))

    done = chunks[(rank + 1) % n]
    if wire != done.dtype:  # keep exactly what the other ranks will receive
        done.copy_(done.to(wire))
    for k in range(n - 1):  # all-gather
        send, into = chunks[(rank + 1 - k) % n], chunks[(rank - k) % n]
        incoming = torch.empty(into.shape, dtype=wire, device=into.device)
        _exchange(ctx, outgoing(send), incoming, right, left, f"all-gather {k}")
        into.copy_(incoming)

    if op == "avg":
        work.div_(n)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


__all__ = ["ring_all_reduce", "ring_bytes_sent", "ring_chunks", "RING_OPS"]
