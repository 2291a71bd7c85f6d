"""Collectives written by hand from point-to-point messages, to see where their bytes go.

The mechanism in ~20 lines: the ring all-reduce (Patarasuk & Yuan 2009), which NCCL and gloo use
for large tensors. N ranks in a ring; rank r sends only to r+1 and receives only from r-1 (mod N).

    chunks = tensor.view(-1).tensor_split(N)
    # 1. reduce-scatter, N-1 steps: each chunk travels once around the ring, one rank's part added per hop
    for k in range(N - 1):
        send chunks[r - k] to r+1, receive `incoming` from r-1 (both posted at once)
        chunks[r - k - 1] += incoming
    # rank r now holds the complete sum of chunk r+1
    # 2. all-gather, N-1 steps: pass the complete chunks on around the ring
    for k in range(N - 1):
        send chunks[r + 1 - k] to r+1, receive chunks[r - k] from r-1
    # every rank holds every summed chunk: 2(N-1) messages of S/N bytes, 2(N-1)/N·S per rank

That is nearly 2S per rank however many ranks there are (S the tensor's bytes), which is why the
ring scales in bandwidth; its latency, 2(N-1) message start-ups, grows with N.

``ring_all_reduce(tensor, group=None)`` is that code, with ``reduce_scatter_phase`` and
``all_gather_phase`` its two steps; each message goes through ``mpkit.observe.active.comm()``, so
inside ``mpkit.launch`` it is one traced ``send`` event whose bytes are what really left the rank
(lab 05 checks them against ``mpkit.simulator.formulas.ring_allreduce_bytes``). The other five
collectives of ``torch.distributed`` are here too, in their textbook bandwidth-optimal forms:
``ring_reduce_scatter`` and ``ring_all_gather`` (one phase each, (N-1)/N·S per rank),
``chain_broadcast`` and ``chain_reduce`` (a chain through the ranks: every rank sends S once, except
the chain's end) and ``pairwise_all_to_all`` ((N-1)/N·S). Like ``torch.distributed`` they run in
any process group (``group=None``: the whole world) and take roots as global ranks.
``six_collectives(ctx)`` runs all six on small tensors next to ``torch.distributed``'s own.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from mpkit.observe import active
from mpkit.parallel.checks import global_rank, require_process_group

RING_OPS = ("sum", "avg")
COLLECTIVES = ("broadcast", "reduce", "all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def ring_all_reduce(tensor: torch.Tensor, op: str = "sum", group=None, wire_dtype: torch.dtype | None = None):
    """All-reduce ``tensor`` in place over the ranks of ``group`` with the ring; returns ``tensor``.

    A reduce-scatter phase then an all-gather phase, each N-1 steps of one S/N message (see the
    module's sketch): 2(N-1)/N·S bytes per rank. Each message is one ``send`` event named
    ``reduce-scatter k`` / ``all-gather k``. ``op="avg"`` divides the sum by N. ``wire_dtype``
    (e.g. ``torch.float16``) compresses what is sent (``Wire``): half the bytes from fp32, at the
    cost of rounding every partial sum to the wire's precision; all ranks still end up identical.
    """
    _check_all_reduce(tensor, op, wire_dtype)
    ring = Ring(group)
    if ring.size == 1:
        return tensor
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    chunks = work.view(-1).tensor_split(ring.size)
    wire = Wire(tensor.dtype, wire_dtype)
    reduce_scatter_phase(ring, chunks, wire, first=ring.rank)  # ends with chunk r+1 complete here
    wire.round(chunks[(ring.rank + 1) % ring.size])  # keep exactly what the other ranks will receive
    all_gather_phase(ring, chunks, wire, first=ring.rank + 1)
    if op == "avg":
        work.div_(ring.size)
    if work is not tensor:
        tensor.copy_(work)
    return tensor


def reduce_scatter_phase(ring, chunks, wire, first):
    """N-1 steps: in step k send chunk (first - k) to the right, add what arrives from the left
    into chunk (first - k - 1). Rank r ends holding the complete sum of chunk (first + 1)."""
    n = ring.size
    for k in range(n - 1):
        send, into = chunks[(first - k) % n], chunks[(first - k - 1) % n]
        into.add_(ring.exchange(send, into, wire, f"reduce-scatter {k}"))


def all_gather_phase(ring, chunks, wire, first):
    """N-1 steps: in step k send chunk (first - k) to the right — first the one this rank holds
    complete, then each one it just received — and store what arrives as chunk (first - k - 1)."""
    n = ring.size
    for k in range(n - 1):
        send, into = chunks[(first - k) % n], chunks[(first - k - 1) % n]
        into.copy_(ring.exchange(send, into, wire, f"all-gather {k}"))


def ring_reduce_scatter(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's piece of the sum over the group: chunk ``rank`` of N (like
    ``dist.reduce_scatter_tensor``); ``tensor`` is left unchanged. The ring all-reduce's first
    phase: every rank sends (N-1)/N·S bytes (S = ``tensor``'s bytes)."""
    _check_tensor(tensor)
    ring = Ring(group)
    chunks = tensor.detach().clone().view(-1).tensor_split(ring.size)
    reduce_scatter_phase(ring, chunks, Wire(tensor.dtype), first=ring.rank - 1)  # ends with chunk r complete
    return chunks[ring.rank].clone()


def ring_all_gather(piece: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's ``piece`` (all the same size), concatenated in rank order, on every rank (like
    ``dist.all_gather_into_tensor``). The ring all-reduce's second phase: every rank sends
    (N-1)/N·S bytes, S = the gathered result's bytes."""
    _check_tensor(piece)
    ring = Ring(group)
    out = torch.empty(ring.size * piece.numel(), dtype=piece.dtype, device=piece.device)
    chunks = out.split(piece.numel())
    chunks[ring.rank].copy_(piece.reshape(-1))
    all_gather_phase(ring, chunks, Wire(piece.dtype), first=ring.rank)
    return out


def chain_broadcast(tensor: torch.Tensor, src: int = 0, group=None) -> torch.Tensor:
    """Copy ``src``'s ``tensor`` into ``tensor`` on every rank of the group; returns it. The data
    walks the chain src → src+1 → ... (in group order): each rank receives S once and passes it
    on, so every rank sends S bytes but the last one, which sends nothing (NCCL pipelines the same
    chain in pieces). ``src`` is a global rank, as in ``dist.broadcast``."""
    _check_tensor(tensor)
    ring = Ring(group)
    order = ring.chain_from(_check_root(ring, src))
    at = order.index(ring.rank)
    if at > 0:
        ring.comm.recv(tensor, ring.global_rank(order[at - 1]), group=group, name="broadcast")
    if at < len(order) - 1:
        ring.comm.send(tensor, ring.global_rank(order[at + 1]), group=group, name="broadcast")
    return tensor


def chain_reduce(tensor: torch.Tensor, dst: int = 0, group=None):
    """The sum of every rank's ``tensor`` on ``dst`` (a new tensor), ``None`` on the other ranks.
    Partial sums walk the chain dst+1 → dst+2 → ... → dst, each rank adding its own: every rank
    sends S bytes once except ``dst``, which only receives. ``dst`` is a global rank."""
    _check_tensor(tensor)
    ring = Ring(group)
    root = _check_root(ring, dst)
    order = ring.chain_from(root)[1:] + [root]
    at = order.index(ring.rank)
    partial = tensor.detach().clone()
    if at > 0:
        partial += ring.comm.recv(torch.empty_like(partial), ring.global_rank(order[at - 1]), group=group,
                                  name="reduce")
    if at < len(order) - 1:
        ring.comm.send(partial, ring.global_rank(order[at + 1]), group=group, name="reduce")
        return None
    return partial


def pairwise_all_to_all(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Block j of every rank's ``tensor`` goes to rank j: the result on rank j is block j of rank
    0, 1, ..., N-1 (like ``dist.all_to_all_single``). All N-1 sends and receives are posted at
    once; every rank sends (N-1)/N·S bytes, keeping its own block."""
    _check_tensor(tensor)
    ring = Ring(group)
    n, rank = ring.size, ring.rank
    _check_blocks(tensor, n)
    blocks = tensor.detach().reshape(-1).split(tensor.numel() // n)
    out = torch.empty(tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    received = out.split(tensor.numel() // n)
    received[rank].copy_(blocks[rank])
    works = []
    for peer in range(n):
        if peer != rank:
            works.append(ring.comm.isend(blocks[peer].contiguous(), ring.global_rank(peer), group=group,
                                        name="all-to-all"))
            works.append(ring.comm.irecv(received[peer], ring.global_rank(peer), group=group, name="all-to-all"))
    for work in works:
        work.wait()
    return out


# ---- the ring's plumbing: who the neighbours are, how a message is exchanged, what the wire carries ----

class Ring:
    """This rank's place in ``group``: ``rank`` and ``size`` in the group, the global ranks of its
    neighbours (``torch.distributed``'s messages address global ranks), and the communicator
    (``active.comm()``: traced inside ``mpkit.launch``, plain ``torch.distributed`` elsewhere)."""

    def __init__(self, group=None):
        _check_group(group)
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.right = self.global_rank((self.rank + 1) % self.size)
        self.left = self.global_rank((self.rank - 1) % self.size)
        self.comm = active.comm()

    def global_rank(self, group_rank: int) -> int:
        return global_rank(self.group, group_rank)

    def chain_from(self, root: int) -> list[int]:
        """The group ranks in ring order, starting at ``root`` (a group rank)."""
        return [(root + i) % self.size for i in range(self.size)]

    def post(self, send, recv, name) -> list:
        """Post ``send`` to the right neighbour and ``recv`` from the left one, without waiting (ring
        attention computes while its next block travels); returns the works."""
        return [self.comm.isend(send, self.right, group=self.group, name=name),
                self.comm.irecv(recv, self.left, group=self.group, name=name)]

    def exchange(self, send, into, wire, name):
        """Send ``send`` to the right neighbour while receiving a chunk shaped like ``into`` from the
        left one; returns what arrived, in ``into``'s dtype.

        Both are posted before either is waited on: with blocking send/recv every rank would send
        first and, once messages outgrow the transport's buffers, all of them would wait forever.
        """
        incoming = wire.buffer_like(into)
        works = []
        if send.numel():  # ranks agree on chunk sizes, so an empty chunk is skipped on both sides
            works.append(self.comm.isend(wire.encode(send), self.right, group=self.group, name=name))
        if incoming.numel():
            works.append(self.comm.irecv(incoming, self.left, group=self.group, name=name))
        for work in works:
            work.wait()
        return incoming.to(into.dtype)


class Wire:
    """The dtype chunks travel in: the tensor's own, or ``wire_dtype`` (gradient compression). A
    chunk is cast on its way out (``encode``) and received into a buffer of the wire's dtype
    (``buffer_like``); ``round`` rounds a finished chunk to the wire's precision, so the rank that
    completed it keeps exactly what the others receive."""

    def __init__(self, dtype: torch.dtype, wire_dtype: torch.dtype | None = None):
        self.dtype = dtype if wire_dtype is None else wire_dtype

    def encode(self, chunk):
        return chunk if chunk.dtype == self.dtype else chunk.to(self.dtype)

    def buffer_like(self, chunk):
        return torch.empty(chunk.shape, dtype=self.dtype, device=chunk.device)

    def round(self, chunk):
        if chunk.dtype != self.dtype:
            chunk.copy_(chunk.to(self.dtype))


# ---- lab 05's demonstration ----

def six_collectives(ctx, root: int = 0, group=None):
    """Run the six collectives by hand and with ``torch.distributed`` on tiny float tensors (a
    function for ``mpkit.launch``).

    Rank r of the group starts with x_r = [1, 2, ..., N] · 10^r, so a value's power of ten names
    the rank it came from and a sum shows every rank as a digit (N=4: rank 0 [1, 2, 3, 4], rank 3
    [1000, ..., 4000]; their sum [1111, 2222, 3333, 4444]). All-gather starts from the pieces a
    reduce-scatter leaves. Each collective runs as its own trace step (0..5, in ``COLLECTIVES``
    order), so its ``send`` events give the bytes it sent. ``root``: a global rank of ``group``.
    Returns ``{collective: {"before": list, "after": list or None, "torch": list or None}}``;
    "after" is None where the collective leaves nothing defined (reduce off the root).
    """
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    x = torch.arange(1, n + 1, dtype=torch.float32) * 10.0 ** rank
    out, piece = {}, None
    for step, name in enumerate(COLLECTIVES):
        ctx.set_step(step)
        if name == "broadcast":  # only the root has something to send
            before = x.clone() if ctx.rank == root else torch.zeros_like(x)
        elif name == "all_gather":  # the pieces the reduce-scatter left
            before = piece
        else:
            before = x.clone()
        reference = before.clone()
        if name == "broadcast":
            after = chain_broadcast(before.clone(), root, group)
            dist.broadcast(reference, root, group)
        elif name == "reduce":
            after = chain_reduce(before, root, group)
            dist.reduce(reference, root, group=group)
            reference = reference if ctx.rank == root else None  # other ranks' buffers are undefined
        elif name == "all_reduce":
            after = ring_all_reduce(before.clone(), group=group)
            dist.all_reduce(reference, group=group)
        elif name == "reduce_scatter":
            after = piece = ring_reduce_scatter(before, group)
            reference = torch.empty(before.numel() // n)
            dist.reduce_scatter_tensor(reference, before.clone(), group=group)
        elif name == "all_gather":
            after = ring_all_gather(before, group)
            reference = torch.empty(n * before.numel())
            dist.all_gather_into_tensor(reference, before.clone(), group=group)
        else:
            after = pairwise_all_to_all(before, group)
            reference = torch.empty_like(before)
            dist.all_to_all_single(reference, before.clone(), group=group)
        out[name] = {"before": before.tolist(), "after": None if after is None else after.tolist(),
                     "torch": None if reference is None else reference.tolist()}
    return out


# ---- byte counts: what each collective sends, for the lab's comparison with the trace ----

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


def bytes_per_rank(collective: str, size: int, world_size: int, rank: int, root: int = 0) -> int:
    """Bytes ``rank`` (of the group) sends in the hand-written ``collective`` over ``size`` bytes: S
    the tensor each rank holds (reduce-scatter: its input; all-gather: the gathered result;
    all-to-all: its input). all-reduce 2(N-1)/N·S; reduce-scatter, all-gather, all-to-all
    (N-1)/N·S; broadcast S except the chain's last rank (root-1); reduce S except the root."""
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


# ---- checks: each names the problem and what to change ----

def _check_tensor(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor: expected a torch.Tensor, got {type(tensor).__name__}")


def _check_all_reduce(tensor, op, wire_dtype):
    if op not in RING_OPS:
        raise ValueError(f"op={op!r} is unknown; use one of {', '.join(RING_OPS)}")
    _check_tensor(tensor)
    if not tensor.is_floating_point() and (op == "avg" or wire_dtype is not None):
        raise ValueError(f"op='avg' and wire_dtype need a floating-point tensor, got {tensor.dtype}")


def _check_group(group):
    require_process_group("a hand-written collective")
    if dist.get_rank(group) < 0:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the group it passed; call a collective only "
                         f"on the ranks of its group")


def _check_root(ring, root):
    """``root`` (a global rank, as torch.distributed takes it) as a rank of ``ring``'s group."""
    members = [ring.global_rank(r) for r in range(ring.size)]
    if isinstance(root, bool) or not isinstance(root, int) or root not in members:
        where = "this world (0..{})".format(ring.size - 1) if ring.group is None else f"the group {members}"
        raise ValueError(f"root rank {root!r} is not a rank of {where}; pass the global rank of a member")
    return members.index(root)


def _check_blocks(tensor, n):
    if tensor.numel() % n:
        raise ValueError(f"all-to-all: {tensor.numel()} elements cannot be cut into {n} equal blocks, "
                         "one per rank; use a multiple of the world size")


__all__ = ["ring_all_reduce", "ring_reduce_scatter", "ring_all_gather", "chain_broadcast", "chain_reduce",
           "pairwise_all_to_all", "reduce_scatter_phase", "all_gather_phase", "Ring", "Wire", "six_collectives",
           "bytes_per_rank", "ring_bytes_sent", "ring_chunks", "RING_OPS", "COLLECTIVES"]
