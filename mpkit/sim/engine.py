"""Play per-rank instruction lists forward in time and return the predicted ``Trace``.

A strategy's step is data (as in ShallowSpeed / LLM-Training-Puzzles): for each rank, the ops
it issues in program order. This executor gives every op its start and end: compute runs when
the rank is free; a message moves once both sides have posted it (rendezvous, like gloo), and a
batch waits for its receives (and its sends, unless deferred to the next batch); a collective
starts when the last member reaches it. Events span only the data movement: waiting for a peer
is left as a gap, so a predicted timeline shows the bubble as idle time (a measured one shows it
inside recv or the collective); an async
collective runs on the rank's communication lane and ``Wait`` joins it. A program that cannot
finish (a recv nobody sends) raises instead of hanging.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpkit.observe.trace import Event, Trace


@dataclass(frozen=True)
class Compute:
    kind: str
    seconds: float
    stage: int | None = None
    micro_batch: int | None = None
    name: str = ""


@dataclass(frozen=True)
class P2P:
    """One communication batch, posted together (the pp executor's isend/irecv batches; a lone
    blocking send or recv is a batch of one). ``ops``: tuples (side "send"|"recv", peer rank,
    message key, bytes, transfer seconds, stage, micro_batch). gloo sends are rendezvous: a
    message moves once both sides have posted it. Receives are waited at once; sends too unless
    ``defer_sends``, in which case they are waited at the rank's next batch or ``WaitSends``
    (the executor lets a send overlap the next computation)."""

    ops: tuple
    defer_sends: bool = False


@dataclass(frozen=True)
class WaitSends:
    """Wait for this rank's deferred sends (before the optimizer step)."""


@dataclass(frozen=True)
class Collective:
    kind: str
    group: tuple
    nbytes: int
    seconds: float
    key: tuple
    async_op: bool = False
    name: str = ""
    stage: int | None = None
    micro_batch: int | None = None


@dataclass(frozen=True)
class Wait:
    key: tuple


def simulate(programs: list[list], step: int = 0) -> Trace:
    """Run ``programs[rank]`` (lists of the instructions above) and return their events."""
    n = len(programs)
    pc = [0] * n
    clock = [0.0] * n          # compute lane: when the rank is next free
    comm_clock = [0.0] * n     # communication lane (async collectives)
    posted: dict = {}          # (message key, side, rank) -> time that side was posted
    entered: set = set()       # (rank, pc) of P2P batches already posted
    deferred = [[] for _ in range(n)]  # per rank: (op, post time) of sends not waited yet
    joined: dict = {}          # collective key -> {rank: (ready time, instruction)}
    finished: dict = {}        # collective key -> end time
    events: list[Event] = []

    def emit(rank, kind, start, end, ins, nbytes=0, name=""):
        events.append(Event(rank, kind, start, end, getattr(ins, "stage", None),
                            getattr(ins, "micro_batch", None), int(nbytes), name, step))

    def run_collective(key):
        members = joined[key]
        start = max(ready for ready, _ in members.values())
        ins = next(iter(members.values()))[1]
        end = start + max(member.seconds for _, member in members.values())  # ranks may price it apart
        finished[key] = end
        for rank, (ready, member_ins) in members.items():
            emit(rank, ins.kind, start, end, member_ins, ins.nbytes, ins.name)
            if member_ins.async_op:
                comm_clock[rank] = end
            else:
                clock[rank] = end
                pc[rank] += 1

    progress = True
    while progress:
        progress = False
        for r in range(n):
            while pc[r] < len(programs[r]):
                ins = programs[r][pc[r]]
                if isinstance(ins, Compute):
                    emit(r, ins.kind, clock[r], clock[r] + ins.seconds, ins, name=ins.name)
                    clock[r] += ins.seconds
                elif isinstance(ins, (P2P, WaitSends)):
                    ops = getattr(ins, "ops", ())
                    if (r, pc[r]) not in entered:
                        entered.add((r, pc[r]))
                        for op in ops:
                            posted[(op[2], op[0], r)] = clock[r]
                    now = [(op, clock[r]) for op in ops if not (op[0] == "send" and ins.defer_sends)]
                    waited = deferred[r] + now
                    peers = [posted.get((op[2], "recv" if op[0] == "send" else "send", op[1])) for op, _ in waited]
                    if None in peers:
                        break
                    for (op, post), peer in zip(waited, peers):
                        side, _, _, nbytes, seconds, stage, mb = op
                        begin = max(post, peer)
                        events.append(Event(r, side, begin, begin + seconds, stage, mb,
                                            int(nbytes) if side == "send" else 0, "", step))
                        clock[r] = max(clock[r], begin + seconds)
                    deferred[r] = [(op, clock[r]) for op in ops if op[0] == "send" and ins.defer_sends]
                elif isinstance(ins, Collective):
                    members = joined.setdefault(ins.key, {})
                    if r not in members:
                        ready = max(clock[r], comm_clock[r]) if ins.async_op else clock[r]
                        members[r] = (ready, ins)
                        if len(members) == len(ins.group):
                            run_collective(ins.key)
                            progress = True
                            if not ins.async_op:
                                continue
                    if not ins.async_op:
                        break  # blocked until every member has joined (run_collective advances pc)
                elif isinstance(ins, Wait):
                    if ins.key not in finished:
                        break
                    clock[r] = max(clock[r], finished[ins.key])
                else:
                    raise TypeError(f"unknown instruction {ins!r}")
                pc[r] += 1
                progress = True
    stuck = [r for r in range(n) if pc[r] < len(programs[r])]
    if stuck:
        raise RuntimeError("predicted program deadlocks: " + "; ".join(
            f"rank {r} waits at {programs[r][pc[r]]}" for r in stuck))
    events.sort(key=lambda e: (e.rank, e.start, e.end))
    return Trace(events=events, enabled=False)
