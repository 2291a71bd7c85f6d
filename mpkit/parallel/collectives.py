"""Collectives written by hand from point-to-point messages, to see where their bytes go.

``ring_all_reduce(ctx, tensor)`` is the ring algorithm NCCL and gloo use for large all-reduces
(Patarasuk & Yuan 2009), built from ``ctx.comm.isend`` / ``ctx.comm.irecv`` so every message is
one traced ``send`` event whose bytes are what really left the rank. Lab 05 runs it and checks
the measured bytes against the formula 2(N-1)/N·S of ``mpkit.simulator.formulas.ring_allreduce_bytes``.

The other five collectives of ``torch.distributed`` are here too, each in its textbook
bandwidth-optimal form, so lab 05 can define all six side by side and measure them:
``ring_reduce_scatter`` and ``ring_all_gather`` (the two phases of the ring all-reduce, each
(N-1)/N·S per rank), ``chain_broadcast`` and ``chain_reduce`` (a chain through the ranks: every
rank sends S once, except the chain's end), and ``pairwise_all_to_all`` (every rank sends each
other rank its block: (N-1)/N·S). ``six_collectives(ctx)`` runs all six on small tensors that
show where every value came from, next to ``torch.distributed``'s own collectives.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

RING_OPS = ("sum", "avg")
COLLECTIVES = ("broadcast", "reduce", "all_reduce", "reduce_scatter", "all_gather", "all_to_all")


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


def _ring_phase(ctx, chunks, shift, wire, reduce):
    """One phase of the ring: N-1 steps in which rank r sends to r+1 and receives from r-1.

    ``shift`` picks the chunk each rank finishes with: rank r ends a reduce-scatter phase holding
    the complete sum of chunk (r + shift), and starts an all-gather phase holding that chunk.
    Reduce-scatter (``reduce=True``): in step k send chunk (r+shift-k-1), add what arrives into
    chunk (r+shift-k-2). All-gather: send chunk (r+shift-k), store what arrives as chunk
    (r+shift-k-1). Messages go on the wire as ``wire`` and are named ``reduce-scatter k`` /
    ``all-gather k``.
    """
    n, rank = ctx.world_size, ctx.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    first = rank + shift - (1 if reduce else 0)
    for k in range(n - 1):
        send, into = chunks[(first - k) % n], chunks[(first - k - 1) % n]
        outgoing = send if wire == send.dtype else send.to(wire)
        incoming = torch.empty(into.shape, dtype=wire, device=into.device)
        _exchange(ctx, outgoing, incoming, right, left, f"{'reduce-scatter' if reduce else 'all-gather'} {k}")
        if reduce:
            into.add_(incoming.to(into.dtype))
        else:
            into.copy_(incoming)


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
    _check_tensor(tensor)
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
    _ring_phase(ctx, chunks, shift=1, wire=wire, reduce=True)
    done = chunks[(rank + 1) % n]
    if wire != done.dtype:  # keep exactly what the other ranks will receive
        done.copy_(done.to(wire))
    _ring_phase(ctx, chunks, shift=1, wire=wire, reduce=False)
    if op == "avg":
        work.div_(n)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def ring_reduce_scatter(ctx, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of the sum over all ranks: chunk ``rank`` of N (like
    ``dist.reduce_scatter_tensor``); ``tensor`` is left unchanged. The first phase of
    ``ring_all_reduce``: every rank sends (N-1)/N·S bytes (S = ``tensor``'s bytes)."""
    _check_tensor(tensor)
    chunks = tensor.detach().clone().view(-1).tensor_split(ctx.world_size)
    _ring_phase(ctx, chunks, shift=0, wire=tensor.dtype, reduce=True)
    return chunks[ctx.rank].clone()


def ring_all_gather(ctx, piece: torch.Tensor) -> torch.Tensor:
    """Every rank's ``piece`` (all the same size), concatenated in rank order, on every rank (like
    ``dist.all_gather_into_tensor``). The second phase of ``ring_all_reduce``: every rank sends
    (N-1)/N·S bytes, S = the gathered result's bytes."""
    _check_tensor(piece)
    n = ctx.world_size
    out = torch.empty(n * piece.numel(), dtype=piece.dtype, device=piece.device)
    chunks = out.split(piece.numel())
    chunks[ctx.rank].copy_(piece.reshape(-1))
    _ring_phase(ctx, chunks, shift=0, wire=piece.dtype, reduce=False)
    return out


def _chain(src: int, n: int) -> list[int]:
    """The ranks in ring order starting at ``src``."""
    return [(src + i) % n for i in range(n)]


def chain_broadcast(ctx, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Copy ``src``'s ``tensor`` into ``tensor`` on every rank; returns it. The data walks the chain
    src → src+1 → ... : each rank receives S once and passes it on, so every rank sends S bytes
    but the last one, which sends nothing (NCCL pipelines the same chain in pieces)."""
    _check_tensor(tensor)
    order = _chain(_check_root(ctx, src), ctx.world_size)
    at = order.index(ctx.rank)
    if at > 0:
        ctx.comm.recv(tensor, order[at - 1], name="broadcast")
    if at < len(order) - 1:
        ctx.comm.send(tensor, order[at + 1], name="broadcast")
    return tensor


def chain_reduce(ctx, tensor: torch.Tensor, dst: int = 0):
    """The sum of every rank's ``tensor`` on ``dst`` (a new tensor), ``None`` on the other ranks.
    Partial sums walk the chain dst+1 → dst+2 → ... → dst, each rank adding its own: every rank
    sends S bytes once except ``dst``, which only receives."""
    _check_tensor(tensor)
    order = _chain(_check_root(ctx, dst), ctx.world_size)[1:] + [dst]
    at = order.index(ctx.rank)
    partial = tensor.detach().clone()
    if at > 0:
        incoming = torch.empty_like(partial)
        partial += ctx.comm.recv(incoming, order[at - 1], name="reduce")
    if at < len(order) - 1:
        ctx.comm.send(partial, order[at + 1], name="reduce")
        return None
    return partial


def pairwise_all_to_all(ctx, tensor: torch.Tensor) -> torch.Tensor:
    """Block j of every rank's ``tensor`` goes to rank j: the result on rank j is block j of rank 0,
    1, ..., N-1 (like ``dist.all_to_all_single``). All N-1 sends and receives are posted at once;
    every rank sends (N-1)/N·S bytes, keeping its own block."""
    _check_tensor(tensor)
    n, rank = ctx.world_size, ctx.rank
    if tensor.numel() % n:
        raise ValueError(f"all-to-all: {tensor.numel()} elements cannot be cut into {n} equal blocks, "
                         "one per rank; use a multiple of the world size")
    blocks = tensor.detach().reshape(-1).split(tensor.numel() // n)
    out = torch.empty(tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    received = out.split(tensor.numel() // n)
    received[rank].copy_(blocks[rank])
    works = []
    for peer in range(n):
        if peer != rank:
            works.append(ctx.comm.isend(blocks[peer].contiguous(), peer, name="all-to-all"))
            works.append(ctx.comm.irecv(received[peer], peer, name="all-to-all"))
    for work in works:
        work.wait()
    return out


def bytes_per_rank(collective: str, size: int, world_size: int, rank: int, root: int = 0) -> int:
    """Bytes ``rank`` sends in the hand-written ``collective`` over ``size`` bytes: S the tensor each
    rank holds (reduce-scatter: its input; all-gather: the gathered result; all-to-all: its input).
    all-reduce 2(N-1)/N·S; reduce-scatter, all-gather, all-to-all (N-1)/N·S; broadcast S except the
    chain's last rank (root-1); reduce S except the root."""
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) * size // n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) * size // n
    if collective == "broadcast":
        return 0 if n == 1 or rank == (root - 1) % n else size
    if collective == "reduce":
        return 0 if rank == root else size
    raise ValueError(f"unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}")


def six_collectives(ctx, root: int = 0):
    """Run the six collectives by hand and with ``torch.distributed`` on tiny float tensors.

    Rank r starts with x_r = [1, 2, ..., N] · 10^r, so a value's power of ten names the rank it
    came from and a sum shows every rank as a digit (N=4: rank 0 [1, 2, 3, 4], rank 3
    [1000, ..., 4000]; their sum [1111, 2222, 3333, 4444]). All-gather starts from the pieces a
    reduce-scatter leaves. Each collective runs as its own trace step (0..5, in ``COLLECTIVES``
    order), so its ``send`` events give the bytes it sent. Returns ``{collective: {"before": list,
    "after": list or None, "torch": list or None}}``; "after" is None where the collective leaves
    nothing defined (reduce off the root).
    """
    n, rank = ctx.world_size, ctx.rank
    x = torch.arange(1, n + 1, dtype=torch.float32) * 10.0 ** rank
    out, piece = {}, None
    for step, name in enumerate(COLLECTIVES):
        ctx.set_step(step)
        if name == "broadcast":  # only the root has something to send
            before = x.clone() if rank == root else torch.zeros_like(x)
        elif name == "all_gather":  # the pieces the reduce-scatter left
            before = piece
        else:
            before = x.clone()
        reference = before.clone()
        if name == "broadcast":
            after = chain_broadcast(ctx, before.clone(), root)
            dist.broadcast(reference, root)
        elif name == "reduce":
            after = chain_reduce(ctx, before, root)
            dist.reduce(reference, root)
            reference = reference if rank == root else None  # other ranks' buffers are undefined
        elif name == "all_reduce":
            after = ring_all_reduce(ctx, before.clone())
            dist.all_reduce(reference)
        elif name == "reduce_scatter":
            after = piece = ring_reduce_scatter(ctx, before)
            reference = torch.empty(before.numel() // n)
            dist.reduce_scatter_tensor(reference, before.clone())
        elif name == "all_gather":
            after = ring_all_gather(ctx, before)
            reference = torch.empty(n * before.numel())
            dist.all_gather_into_tensor(reference, before.clone())
        else:
            after = pairwise_all_to_all(ctx, before)
            reference = torch.empty_like(before)
            dist.all_to_all_single(reference, before.clone())
        out[name] = {"before": before.tolist(), "after": None if after is None else after.tolist(),
                     "torch": None if reference is None else reference.tolist()}
    return out


def _check_tensor(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor: expected a torch.Tensor, got {type(tensor).__name__}")


def _check_root(ctx, root):
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < ctx.world_size:
        raise ValueError(f"root rank {root!r} is not a rank of this world (0..{ctx.world_size - 1})")
    return root


__all__ = ["ring_all_reduce", "ring_reduce_scatter", "ring_all_gather", "chain_broadcast", "chain_reduce",
           "pairwise_all_to_all", "six_collectives", "bytes_per_rank", "ring_bytes_sent", "ring_chunks",
           "RING_OPS", "COLLECTIVES"]
