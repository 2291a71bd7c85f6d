"""Pipeline schedules as data (ShallowSpeed / LLM-Training-Puzzles style).

``schedule(name, stages, micro_batches, virtual)`` returns one instruction list per rank. The
same lists are checked by ``simulate`` (no deadlock, every micro-batch once per stage, in-flight
activations, bubble), drawn by the labs, and run for real by ``executor.PipelineExecutor``.

Stages are numbered globally: with ``p`` ranks and ``v`` virtual stages (model chunks) per rank
there are ``p·v`` stages and stage ``s`` lives on rank ``s % p`` (Megatron's interleaving:
rank 0 holds stages 0, p, 2p, ...). Without interleaving (v = 1) stage = rank.

Communication semantics (what the executor does and the simulator models): the communication
instructions between two computations form one *batch*, posted together (isend/irecv), like
torch's ``batch_isend_irecv`` and Megatron's ``send_forward_recv_backward``. Its receives are
waited at once; its sends at the rank's next batch (or before the optimizer step), so a send
overlaps the next computation. A send completes only once the receiver posted the receive
(gloo sends are rendezvous: data moves when the receive is posted). Messages between two ranks
are matched in the order they were posted, so the receiver must post them in the sender's order.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from fractions import Fraction

SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class Forward:
    mb: int
    stage: int


@dataclass(frozen=True)
class Backward:
    mb: int
    stage: int


@dataclass(frozen=True)
class SendAct:
    """Send the output activation of ``stage`` to rank ``to`` (which holds stage + 1)."""
    mb: int
    stage: int
    to: int


@dataclass(frozen=True)
class RecvAct:
    """Receive the input activation of ``stage`` from rank ``frm`` (which holds stage - 1)."""
    mb: int
    stage: int
    frm: int


@dataclass(frozen=True)
class SendGrad:
    """Send the gradient w.r.t. the input of ``stage`` to rank ``to`` (which holds stage - 1)."""
    mb: int
    stage: int
    to: int


@dataclass(frozen=True)
class RecvGrad:
    """Receive the gradient w.r.t. the output of ``stage`` from rank ``frm`` (stage + 1)."""
    mb: int
    stage: int
    frm: int


@dataclass(frozen=True)
class OptimizerStep:
    pass


COMPUTE = (Forward, Backward)
COMM = (SendAct, RecvAct, SendGrad, RecvGrad)


def check_schedule_args(name, stages, micro_batches, virtual=1) -> None:
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r} is unknown; use one of {', '.join(map(repr, SCHEDULES))}")
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r}: pass a whole number >= 1")
    if name != "interleaved":
        return
    if not isinstance(virtual, int) or virtual < 2:
        raise ValueError(f"virtual_stages={virtual!r}: schedule='interleaved' needs virtual_stages >= 2 "
                         f"model chunks per rank (with 1 it is plain '1f1b')")
    if stages < 2:
        raise ValueError("schedule='interleaved' needs world_size >= 2 (on one rank the chunks would pass "
                         "activations to themselves); use schedule='gpipe' or '1f1b'")
    if micro_batches % stages:
        raise ValueError(f"schedule='interleaved' needs micro_batches to be a multiple of world_size={stages} "
                         f"(micro-batches go round the ranks in groups of {stages}); got micro_batches={micro_batches}")


def _compute_order(name, p, m, v, rank):
    """The Forward/Backward sequence of one rank."""
    if name == "gpipe":  # fill, then drain: all m activations alive at once
        return [Forward(i, rank) for i in range(m)] + [Backward(i, rank) for i in range(m)]
    if name == "1f1b":
        def fwd(k):
            return Forward(k, rank)

        def bwd(k):
            return Backward(k, rank)
        total, warmup = m, min(p - 1 - rank, m)
    else:  # Megatron interleaved 1F1B: micro-batches in groups of p visit chunk 0, 1, ..., v-1
        def virtual_mb(k, backward):
            chunk = (k // p) % v
            return (k // (p * v)) * p + k % p, (v - 1 - chunk if backward else chunk) * p + rank

        def fwd(k):
            return Forward(*virtual_mb(k, False))

        def bwd(k):
            return Backward(*virtual_mb(k, True))
        total, warmup = m * v, min((p - rank - 1) * 2 + (v - 1) * p, m * v)
    order = [fwd(k) for k in range(warmup)]  # warm-up
    for k in range(total - warmup):  # steady state: one forward, one backward
        order += [fwd(warmup + k), bwd(k)]
    return order + [bwd(k) for k in range(total - warmup, total)]  # cool-down


def schedule(name: str, stages: int, micro_batches: int, virtual: int = 1) -> list[list]:
    """Instruction lists, one per rank, for ``stages`` ranks and ``micro_batches`` micro-batches.

    A receive goes right before the computation that needs it, a send right after the one
    that produced it, so the sends of one computation and the receives of the next form a batch.
    """
    check_schedule_args(name, stages, micro_batches, virtual)
    p, v = stages, (virtual if name == "interleaved" else 1)
    last = p * v - 1
    programs = []
    for rank in range(p):
        program = []
        for op in _compute_order(name, p, micro_batches, v, rank):
            s = op.stage
            if isinstance(op, Forward):
                program += [RecvAct(op.mb, s, (s - 1) % p)] if s > 0 else []
                program += [op] + ([SendAct(op.mb, s, (s + 1) % p)] if s < last else [])
            else:
                program += [RecvGrad(op.mb, s, (s + 1) % p)] if s < last else []
                program += [op] + ([SendGrad(op.mb, s, (s - 1) % p)] if s > 0 else [])
        programs.append(program + [OptimizerStep()])
    return programs


def batches(program):
    """Split a program into items: a compute/optimizer instruction, or a list (one comm batch)."""
    out, pending = [], []
    for ins in program:
        if isinstance(ins, COMM):
            pending.append(ins)
            continue
        if pending:
            out.append(pending)
            pending = []
        out.append(ins)
    return out + ([pending] if pending else [])


# ---------------------------------------------------------------------------------------------
# The simulator: run the lists with the executor's semantics, on a clock of unit costs.

class ScheduleError(RuntimeError):
    """The instruction lists cannot run: deadlock, mismatched messages or a missing input."""


@dataclass
class Simulation:
    makespan: Fraction
    spans: list = field(default_factory=list)  # (rank, instruction, start, end) for compute
    peak_in_flight: list = field(default_factory=list)  # per rank: max forwards - backwards done
    compute_time: list = field(default_factory=list)  # per rank

    @property
    def bubble(self) -> Fraction:
        """Share of rank-time inside the makespan not spent in forward/backward."""
        return 1 - sum(self.compute_time) / (self.makespan * len(self.compute_time))


def _message(ins):
    """The identity of a message, the same on sender and receiver."""
    if isinstance(ins, SendAct):
        return ("act", ins.mb, ins.stage + 1)
    if isinstance(ins, RecvAct):
        return ("act", ins.mb, ins.stage)
    if isinstance(ins, SendGrad):
        return ("grad", ins.mb, ins.stage - 1)
    return ("grad", ins.mb, ins.stage)


def simulate(programs, forward=1, backward=2, comm=0) -> Simulation:
    """Run per-rank instruction lists; ``forward``/``backward``: time of one Forward/Backward.

    Raises ``ScheduleError`` on a deadlock (every unfinished rank waits), on a receive matched
    by a different message than it expects (posting order differs), or on an instruction whose
    input is missing (e.g. a Backward before its Forward, or one that runs twice).
    """
    p = len(programs)
    items = [batches(prog) for prog in programs]
    pc, clock = [0] * p, [Fraction(0)] * p
    channels = {}  # (src, dst) -> deque of (message, time posted), in posting order
    receives = {}  # (message, receiver) -> time the receive was posted
    arrived = set()  # (rank, item index) of batches already posted
    have = [set() for _ in range(p)]  # ("in"|"out"|"grad"|"dx", mb, stage) held by each rank
    sending = [[] for _ in range(p)]  # sends of each rank's last batch, not yet waited
    in_flight, peak = [0] * p, [0] * p
    busy, spans = [Fraction(0)] * p, []
    last = max((ins.stage for prog in programs for ins in prog if isinstance(ins, Forward)), default=0)

    def need(rank, key, ins):
        if key not in have[rank]:
            raise ScheduleError(f"rank {rank}: {ins} runs without {key[0]} of micro-batch {key[1]} stage {key[2]}")

    def produce(rank, key, ins):
        if key in have[rank]:
            raise ScheduleError(f"rank {rank}: {ins} runs twice")
        have[rank].add(key)

    def run_batch(rank, batch) -> bool:
        """Post the batch (once); finish it if every peer has posted its side. False: blocked."""
        if (rank, pc[rank]) not in arrived:
            arrived.add((rank, pc[rank]))
            for ins in batch:
                if isinstance(ins, (SendAct, SendGrad)):
                    need(rank, ("out" if isinstance(ins, SendAct) else "dx", ins.mb, ins.stage), ins)
                    channels.setdefault((rank, ins.to), deque()).append((_message(ins), clock[rank]))
                else:
                    receives[(_message(ins), rank)] = clock[rank]
        done = sends_done(rank)
        if done is None:
            return False
        taken = {}
        for ins in batch:
            if isinstance(ins, (SendAct, SendGrad)):
                continue  # waited at the next batch
            if isinstance(ins, (RecvAct, RecvGrad)):  # the next unmatched message must be ours
                channel, index = channels.get((ins.frm, rank), ()), taken.get(ins.frm, 0)
                if index >= len(channel):
                    return False
                message, when = channel[index]
                if message != _message(ins):
                    raise ScheduleError(f"rank {rank}: {ins} would be matched by {message} from rank {ins.frm} "
                                        f"(messages between two ranks are matched in posting order)")
                taken[ins.frm] = index + 1
            done = max(done, when)
        for frm, count in taken.items():
            for _ in range(count):
                channels[(frm, rank)].popleft()
        for ins in batch:
            if isinstance(ins, (RecvAct, RecvGrad)):
                have[rank].add(("in" if isinstance(ins, RecvAct) else "grad", ins.mb, ins.stage))
        sending[rank] = [ins for ins in batch if isinstance(ins, (SendAct, SendGrad))]
        clock[rank] = done + comm
        return True

    def sends_done(rank):
        """When the sends of the rank's previous batch completed (None: not yet received)."""
        done = clock[rank]
        for ins in sending[rank]:  # rendezvous: the receiver must have posted the receive
            when = receives.get((_message(ins), ins.to))
            if when is None:
                return None
            done = max(done, when)
        return done

    def run_compute(rank, ins):
        s, mb = ins.stage, ins.mb
        if isinstance(ins, Forward):
            if s > 0:
                need(rank, ("in", mb, s), ins)
            produce(rank, ("out", mb, s), ins)
            in_flight[rank] += 1
            peak[rank] = max(peak[rank], in_flight[rank])
            cost = forward
        else:
            need(rank, ("out", mb, s), ins)
            if s < last:
                need(rank, ("grad", mb, s), ins)
            produce(rank, ("dx", mb, s), ins)
            in_flight[rank] -= 1
            cost = backward
        spans.append((rank, ins, clock[rank], clock[rank] + cost))
        clock[rank] += cost
        busy[rank] += cost

    progress = True
    while progress:
        progress = False
        for rank in range(p):
            while pc[rank] < len(items[rank]):
                item = items[rank][pc[rank]]
                if isinstance(item, list):
                    if not run_batch(rank, item):
                        break
                elif isinstance(item, COMPUTE):
                    run_compute(rank, item)
                else:  # OptimizerStep: the last sends must be through first
                    done = sends_done(rank)
                    if done is None:
                        break
                    clock[rank], sending[rank] = done, []
                pc[rank] += 1
                progress = True
    stuck = [r for r in range(p) if pc[r] < len(items[r])]
    if stuck:
        raise ScheduleError("deadlock: " + "; ".join(f"rank {r} waits at {items[r][pc[r]]}" for r in stuck))
    makespan = max((end for *_, end in spans), default=Fraction(0))
    return Simulation(Fraction(makespan), spans, peak, busy)
