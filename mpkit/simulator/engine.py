"""The one simulator: play per-rank instruction lists forward in time and return their ``Trace``.

A strategy's step is data (as in ShallowSpeed / LLM-Training-Puzzles): for each rank, the ops
it issues in program order. This executor gives every op its start and end: compute runs when
the rank is free; a message moves once both sides have posted it (rendezvous, like gloo), and a
batch waits for its receives (and its sends, unless deferred to the next batch); a collective
starts when the last member reaches it. Events span only the data movement: waiting for a peer
is left as a gap, so a predicted timeline shows the bubble as idle time (a measured one shows it
inside recv or the collective); an async collective runs on the rank's communication lane and
``Wait`` joins it.

It also checks what makes a program wrong rather than slow, and raises ``ProgramError`` instead
of hanging: a deadlock (every unfinished rank waits), a receive that a different message would
match (gloo matches the messages between two ranks in posting order), and — where instructions
say what data they need and produce (the pipeline schedules do) — a computation that runs
without its input or produces the same thing twice. Times are whatever numbers the costs are:
``Fraction`` unit costs give exact bubbles, seconds give a predicted timeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from mpkit.observe.trace import Event, Trace


class ProgramError(RuntimeError):
    """The instruction lists cannot run: deadlock, mismatched messages or a missing input."""


@dataclass(frozen=True)
class Compute:
    """``needs``/``produces``: data keys this computation reads / makes on its rank (optional)."""

    kind: str
    seconds: float
    stage: int | None = None
    micro_batch: int | None = None
    name: str = ""
    needs: tuple = ()
    produces: tuple = ()
    source: object = None  # the instruction this was made from, for messages


class Msg(NamedTuple):
    """One side of a message: ``side`` "send"|"recv", the peer rank, the message ``key`` (the same on
    both sides), bytes, transfer seconds; ``data``: the key a send needs or a receive produces;
    ``kind``: the event it records (default: its side; "rpc" for a remote call), ``name``; ``record``:
    False for a side the real run does not trace (the server side of an rpc request)."""

    side: str
    peer: int
    key: object
    nbytes: int
    seconds: float
    stage: int | None = None
    micro_batch: int | None = None
    data: object = None
    kind: str | None = None
    name: str = ""
    record: bool = True


@dataclass(frozen=True)
class P2P:
    """One communication batch, posted together (the pp executor's isend/irecv batches; a lone
    blocking send or recv is a batch of one). Receives are waited at once; sends too unless
    ``defer_sends``, in which case they are waited at the rank's next batch or ``WaitSends``
    (the executor lets a send overlap the next computation)."""

    ops: tuple
    defer_sends: bool = False
    source: object = None


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


def _describe(ins):
    return getattr(ins, "source", None) or ins


class _Channels:
    """Messages between two ranks, in posting order on each side: the k-th receive must be the
    k-th send, or gloo would hand it the wrong message."""

    def __init__(self):
        self.posted = {}  # (src, dst) -> ([send keys], [recv keys])

    def post(self, src, dst, side, key, rank, ins):
        sends, recvs = self.posted.setdefault((src, dst), ([], []))
        mine, theirs = (sends, recvs) if side == "send" else (recvs, sends)
        mine.append(key)
        k = len(mine) - 1
        if k < len(theirs) and theirs[k] != key:
            expected, got = (theirs[k], key) if side == "recv" else (key, theirs[k])
            raise ProgramError(f"rank {rank}: {_describe(ins)} would be matched by {expected} instead of {got} "
                               f"(messages between ranks {src} and {dst} are matched in posting order)")


def simulate(programs: list[list], step: int = 0, late_wait=None) -> Trace:
    """Run ``programs[rank]`` (lists of the instructions above) and return their events.

    ``late_wait(s)``: seconds a message whose receive is posted after its send costs beyond its
    transfer, when the sender's event loop has been idle ``s`` seconds (None: nothing). gloo's
    sends are rendezvous: a send posted first waits in the sender's queue, and the receive's
    notice must wake the sender's event-loop thread to send the data, a wake-up of its own on
    cores shared with busy processes. One loop serves all of a rank's messages, so it last ran at
    the later of the send's post and the end of the sender's latest message before the receive:
    a burst of sends (GPipe's forwards) wakes it once, not once per message. Each end compares
    the time it waits from with the other's post: a deferred send waits from its rank's next
    batch, so in a pipeline it is mostly the receive that pays. Remote calls (``kind="rpc"``,
    TensorPipe) are not rendezvous and pay nothing."""
    n = len(programs)
    pc = [0] * n
    clock = [0] * n            # compute lane: when the rank is next free
    comm_clock = [0] * n       # communication lane (async collectives)
    posted: dict = {}          # (message key, side, rank) -> time that side was posted
    entered: set = set()       # (rank, pc) of P2P batches already posted
    deferred = [[] for _ in range(n)]  # per rank: (op, post time) of sends not waited yet
    messaged = [[] for _ in range(n)]  # per rank: when its messages ended (its event loop ran)
    joined: dict = {}          # collective key -> {rank: (ready time, instruction)}
    finished: dict = {}        # collective key -> end time
    have = [set() for _ in range(n)]  # data keys each rank holds
    channels = _Channels()
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

    def run_compute(r, ins):
        for key in ins.needs:
            if key not in have[r]:
                raise ProgramError(f"rank {r}: {_describe(ins)} runs without {key}")
        for key in ins.produces:
            if key in have[r]:
                raise ProgramError(f"rank {r}: {_describe(ins)} runs twice")
            have[r].add(key)
        emit(r, ins.kind, clock[r], clock[r] + ins.seconds, ins, name=ins.name)
        clock[r] += ins.seconds

    def run_p2p(r, ins) -> bool:
        ops = getattr(ins, "ops", ())
        if (r, pc[r]) not in entered:
            entered.add((r, pc[r]))
            for op in ops:
                if op.side == "send" and op.data is not None and op.data not in have[r]:
                    raise ProgramError(f"rank {r}: {_describe(ins)} sends {op.data}, which it does not hold")
                src, dst = (r, op.peer) if op.side == "send" else (op.peer, r)
                channels.post(src, dst, op.side, op.key, r, ins)
                posted[(op.key, op.side, r)] = clock[r]
        now = [(op, clock[r]) for op in ops if not (op.side == "send" and ins.defer_sends)]
        waited = deferred[r] + now
        peers = [posted.get((op.key, "recv" if op.side == "send" else "send", op.peer)) for op, _ in waited]
        if None in peers:
            return False
        for (op, post), peer in zip(waited, peers):
            begin = max(post, peer)
            end = begin + op.seconds
            late = peer < post if op.side == "recv" else post < peer  # the receive was posted after the send
            if late_wait is not None and op.kind != "rpc":
                if late:  # the sender's wake-up, after its loop idled since the send or its last message
                    (sender, sent), received = ((op.peer, peer), post) if op.side == "recv" else ((r, post), peer)
                    ran = max((t for t in messaged[sender] if t <= received), default=sent)
                    end += late_wait(received - max(sent, ran))
                messaged[r].append(end)
                messaged[op.peer].append(end)
            if op.record:
                events.append(Event(r, op.kind or op.side, begin, end, op.stage, op.micro_batch,
                                    int(op.nbytes) if op.side == "send" else 0, op.name, step))
            clock[r] = max(clock[r], end)
            if op.side == "recv" and op.data is not None:
                have[r].add(op.data)
        deferred[r] = [(op, clock[r]) for op in ops if op.side == "send" and ins.defer_sends]
        return True

    progress = True
    while progress:
        progress = False
        for r in range(n):
            while pc[r] < len(programs[r]):
                ins = programs[r][pc[r]]
                if isinstance(ins, Compute):
                    run_compute(r, ins)
                elif isinstance(ins, (P2P, WaitSends)):
                    if not run_p2p(r, ins):
                        break
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
        raise ProgramError("deadlock: " + "; ".join(
            f"rank {r} waits at {_describe(programs[r][pc[r]])}" for r in stuck))
    events.sort(key=lambda e: (e.rank, e.start, e.end))
    return Trace(events=events, enabled=False)
