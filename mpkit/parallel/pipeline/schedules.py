"""Pipeline schedules as data (ShallowSpeed / LLM-Training-Puzzles style).

``schedule(name, stages, micro_batches, virtual)`` returns one instruction list per rank. The
same lists are checked and timed by the one simulator, ``mpkit.sim.engine`` (``simulate`` here:
no deadlock, every micro-batch once per stage, in-flight activations, bubble, on unit costs;
the cost model: on a machine's prices), drawn by the labs, and run for real by
``executor.PipelineExecutor``.

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

from dataclasses import dataclass, field, replace
from fractions import Fraction

from mpkit.sim.engine import Compute, Msg, P2P, ProgramError, WaitSends
from mpkit.sim.engine import simulate as run_programs

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
# Checking and timing the lists: converted to the one simulator's instructions (mpkit.sim.engine).

ScheduleError = ProgramError  # the lists cannot run: deadlock, mismatched messages or a missing input


def message(ins) -> tuple:
    """The identity of a message, the same on sender and receiver: (kind, micro-batch, stage it feeds)."""
    if isinstance(ins, SendAct):
        return ("act", ins.mb, ins.stage + 1)
    if isinstance(ins, RecvAct):
        return ("act", ins.mb, ins.stage)
    if isinstance(ins, SendGrad):
        return ("grad", ins.mb, ins.stage - 1)
    return ("grad", ins.mb, ins.stage)


def _data(ins) -> tuple:
    """What a message instruction needs (send) or produces (receive) on its rank."""
    if isinstance(ins, SendAct):
        return ("out", ins.mb, ins.stage)
    if isinstance(ins, SendGrad):
        return ("dx", ins.mb, ins.stage)
    return ("in" if isinstance(ins, RecvAct) else "grad", ins.mb, ins.stage)


def _phase(kind, value, stage, mb, needs, produces, source) -> list:
    """A computation as instructions: ``value`` seconds, or a list of instructions (compute pieces
    and the collectives between them, as tensor parallelism issues them) whose first compute
    needs the inputs and whose last produces the outputs."""
    if not isinstance(value, list):
        return [Compute(kind, value, stage, mb, needs=needs, produces=produces, source=source)]
    pieces = [replace(ins, kind=kind, stage=stage, micro_batch=mb) if isinstance(ins, Compute) else ins for ins in value]
    computes = [i for i, ins in enumerate(pieces) if isinstance(ins, Compute)]
    pieces[computes[0]] = replace(pieces[computes[0]], needs=needs, source=source)
    pieces[computes[-1]] = replace(pieces[computes[-1]], produces=produces)
    return pieces


def engine_program(program, rank, forward, backward, message_cost, optimizer=None, peers=None, last=None):
    """One rank's schedule list as the simulator's instructions.

    ``forward(stage, mb)``/``backward(stage, mb)`` -> seconds, or a list of instructions (see
    ``_phase``); ``message_cost(kind 'act'|'grad', stage it feeds, src, dst)`` -> (bytes, seconds);
    ``optimizer(rank)`` -> seconds or a list of instructions (None: no optimizer step);
    ``peers[r]``: the global rank of pipeline rank r (default: r); ``last``: the last stage.
    Each communication batch stays one batch, as the executor runs it: receives waited at once,
    sends at the next batch or before the optimizer step."""
    peers = peers or list(range(max(rank + 1, 1 + max((getattr(i, "to", getattr(i, "frm", 0)) for i in program
                                                        if isinstance(i, COMM)), default=0))))
    if last is None:
        last = max(ins.stage for ins in program if isinstance(ins, Forward))
    me, out = peers[rank], []
    for item in batches(program):
        if isinstance(item, list):
            ops = []
            for ins in item:
                send = isinstance(ins, (SendAct, SendGrad))
                peer = peers[ins.to if send else ins.frm]
                key = message(ins)
                nbytes, seconds = message_cost(key[0], key[2], *((me, peer) if send else (peer, me)))
                ops.append(Msg("send" if send else "recv", peer, key, nbytes, seconds, ins.stage, ins.mb, _data(ins)))
            out.append(P2P(tuple(ops), defer_sends=True, source=item))
        elif isinstance(item, Forward):
            s, mb = item.stage, item.mb
            out += _phase("forward", forward(s, mb), s, mb, (("in", mb, s),) if s > 0 else (), (("out", mb, s),), item)
        elif isinstance(item, Backward):
            s, mb = item.stage, item.mb
            needs = (("out", mb, s),) + ((("grad", mb, s),) if s < last else ())
            out += _phase("backward", backward(s, mb), s, mb, needs, (("dx", mb, s),), item)
        elif isinstance(item, OptimizerStep):
            out.append(WaitSends())
            if optimizer is not None:
                step = optimizer(rank)
                out += step if isinstance(step, list) else [Compute("optimizer", step)]
    return out


def engine_programs(lists, forward, backward, message_cost, optimizer=None):
    """Every rank's list (ranks 0..p-1 of one pipeline) as the simulator's programs."""
    last = max((ins.stage for prog in lists for ins in prog if isinstance(ins, Forward)), default=0)
    peers = list(range(len(lists)))
    return [engine_program(program, rank, forward, backward, message_cost, optimizer, peers, last)
            for rank, program in enumerate(lists)]


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


def simulate(programs, forward=1, backward=2, comm=0) -> Simulation:
    """Run per-rank instruction lists on unit costs: ``forward``/``backward`` per Forward/Backward,
    ``comm`` per message. Raises ``ScheduleError`` on a deadlock, on a receive matched by a
    different message than it expects (posting order differs), or on an instruction whose input
    is missing (e.g. a Backward before its Forward, or one that runs twice)."""
    trace = run_programs(engine_programs(programs, lambda s, mb: Fraction(forward), lambda s, mb: Fraction(backward),
                                         lambda *key: (0, Fraction(comm))))
    p = len(programs)
    spans, peak, busy, in_flight = [], [0] * p, [Fraction(0)] * p, [0] * p
    for e in trace.events:  # sorted by rank, then time
        if e.kind not in ("forward", "backward"):
            continue
        instruction = (Forward if e.kind == "forward" else Backward)(e.micro_batch, e.stage)
        spans.append((e.rank, instruction, e.start, e.end))
        busy[e.rank] += e.end - e.start
        in_flight[e.rank] += 1 if e.kind == "forward" else -1
        peak[e.rank] = max(peak[e.rank], in_flight[e.rank])
    makespan = max((end for *_, end in spans), default=Fraction(0))
    return Simulation(Fraction(makespan), spans, peak, busy)


def validate(programs) -> None:
    """Raise ``ScheduleError`` unless the lists run to the end (see ``simulate``)."""
    simulate(programs)
