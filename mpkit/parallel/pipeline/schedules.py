"""Pipeline schedules as data (ShallowSpeed / LLM-Training-Puzzles style).

``schedule(name, stages, micro_batches, virtual)`` returns one instruction list per rank. The
same lists are checked and timed by the one simulator, ``mpkit.simulator.engine`` (``simulate`` here:
no deadlock, every micro-batch once per stage, in-flight activations, bubble, on unit costs;
the cost model, through ``mpkit.pricing.pipeline_program``: on a machine's prices), drawn by the labs, and run for real by
``executor.PipelineExecutor``.

Stages are numbered globally: with ``p`` ranks and ``v`` virtual stages (model chunks) per rank
there are ``p·v`` stages and stage ``s`` lives on rank ``s % p`` (Megatron's interleaving:
rank 0 holds stages 0, p, 2p, ...). Without interleaving (v = 1) stage = rank. ``zbv`` and
``dualpipev`` place their two chunks per rank in a V (``placement``). Zero-bubble lists split a
stage's ``Backward`` into ``BackwardInput`` (B) and ``BackwardWeight`` (W); their order comes from
playing the F/B order on unit costs with W filling the waits (``_play``, ``_zbv``), deadlock-free
by construction and checked again by ``simulate``. ``dualpipev``'s order is DeepSeek's, as torch
builds it (``_dualpipev``).

Communication semantics (what the executor does and the simulator models): the communication
instructions between two computations form one *batch*, posted together (isend/irecv), like
torch's ``batch_isend_irecv`` and Megatron's ``send_forward_recv_backward``. Its receives are
waited at once; its sends at the rank's next batch (or before the optimizer step), so a send
overlaps the next computation. A send completes only once the receiver posted the receive
(gloo sends are rendezvous: data moves when the receive is posted). Messages between two ranks
are matched in the order they were posted, so the receiver must post them in the sender's order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from mpkit.simulator.engine import Compute, Msg, P2P, ProgramError, WaitSends
from mpkit.simulator.engine import simulate as run_programs

SCHEDULES = ("gpipe", "1f1b", "interleaved", "looped_bfs", "interleaved_zb", "zbv", "dualpipev")
MULTI_CHUNK = ("interleaved", "looped_bfs", "interleaved_zb")  # virtual_stages chunks per rank, stage s on rank s % p
V_SHAPED = ("zbv", "dualpipev")  # two chunks per rank in a V: rank r holds stages r and 2p-1-r
SPLIT_BACKWARD = ("interleaved_zb", "zbv")  # backward split into B (input gradient) and W (weight gradient)


@dataclass(frozen=True)
class Forward:
    mb: int
    stage: int


@dataclass(frozen=True)
class Backward:
    """The whole backward of a stage for one micro-batch: input gradient and weight gradients."""
    mb: int
    stage: int


@dataclass(frozen=True)
class BackwardInput:
    """B of a zero-bubble schedule: only the gradient w.r.t. the stage's input (what the previous
    stage waits for); the weight gradients are left for a later ``BackwardWeight``."""
    mb: int
    stage: int


@dataclass(frozen=True)
class BackwardWeight:
    """W: the weight gradients of a stage for one micro-batch, after its ``BackwardInput``. Nobody
    waits for it, so a zero-bubble schedule runs it where the rank would otherwise idle."""
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


COMPUTE = (Forward, Backward, BackwardInput, BackwardWeight)
COMM = (SendAct, RecvAct, SendGrad, RecvGrad)


def chunks_per_rank(name, virtual=1) -> int:
    """Model chunks (stages) each rank holds under schedule ``name``."""
    return virtual if name in MULTI_CHUNK else 2 if name in V_SHAPED else 1


def placement(name, ranks, virtual=1) -> list[int]:
    """The rank of each stage: round robin (stage s on rank s % p), or a V for ``zbv`` and
    ``dualpipev`` (rank r holds stages r and 2p-1-r, so the first and the last stage share rank 0
    and the middle two share rank p-1, where an activation passes without a message)."""
    count = ranks * chunks_per_rank(name, virtual)
    if name in V_SHAPED:
        return [s if s < ranks else count - 1 - s for s in range(count)]
    return [s % ranks for s in range(count)]


def check_schedule_args(name, stages, micro_batches, virtual=1) -> None:
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r} is unknown; use one of {', '.join(map(repr, SCHEDULES))}")
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r}: pass a whole number >= 1")
    if name in V_SHAPED and stages < 2:
        raise ValueError(f"schedule={name!r} needs world_size >= 2 (its V folds the stages back over the ranks)")
    if name == "dualpipev" and micro_batches < 2 * stages:
        raise ValueError(f"schedule='dualpipev' needs micro_batches >= 2*(pipeline ranks)={2 * stages} (at least one "
                         f"micro-batch per stage, as torch's ScheduleDualPipeV); got micro_batches={micro_batches}")
    if name not in MULTI_CHUNK:
        return
    least = 1 if name == "interleaved_zb" else 2
    if not isinstance(virtual, int) or virtual < least:
        raise ValueError(f"virtual_stages={virtual!r}: schedule={name!r} needs virtual_stages >= {least} "
                         f"model chunks per rank" + (" (with 1 it is plain '1f1b')" if name == "interleaved" else ""))
    if stages < 2 and virtual > 1:
        raise ValueError(f"schedule={name!r} needs world_size >= 2 (on one rank the chunks would pass "
                         f"activations to themselves); use schedule='gpipe' or '1f1b'")
    if name != "looped_bfs" and virtual > 1 and micro_batches % stages:
        raise ValueError(f"schedule={name!r} needs micro_batches to be a multiple of world_size={stages} "
                         f"(micro-batches go round the ranks in groups of {stages}); got micro_batches={micro_batches}")


def _compute_order(name, p, m, v, rank):
    """The Forward/Backward sequence of one rank (for the zero-bubble ones: before the split)."""
    if name == "gpipe":  # fill, then drain: all m activations alive at once
        return [Forward(i, rank) for i in range(m)] + [Backward(i, rank) for i in range(m)]
    if name == "looped_bfs":  # GPipe chunk by chunk: every micro-batch through the rank's first chunk first
        mine = range(rank, p * v, p)
        return ([Forward(i, s) for s in mine for i in range(m)]
                + [Backward(i, s) for s in reversed(mine) for i in reversed(range(m))])
    if name == "1f1b" or (name == "interleaved_zb" and v == 1):
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


def _ready(op, done, t, last):
    """Whether ``op``'s inputs were computed before time ``t`` (``done``: op -> finish time)."""
    def by(dep):
        return done.get(dep, t + 1) <= t
    if isinstance(op, Forward):
        return op.stage == 0 or by(Forward(op.mb, op.stage - 1))
    if isinstance(op, BackwardWeight):
        return by(BackwardInput(op.mb, op.stage))
    up = Forward(op.mb, op.stage) if op.stage == last else next(
        (k(op.mb, op.stage + 1) for k in (Backward, BackwardInput) if (k(op.mb, op.stage + 1)) in done),
        Backward(op.mb, op.stage + 1))
    return by(up) and by(Forward(op.mb, op.stage))


def _play(orders, last, split):
    """Play the F/B orders on unit costs (one slot per computation), slot by slot; returns the
    orders run and each computation's start slot. ``split``: zero bubble — every Backward becomes
    B, and a rank runs a pending W (oldest first) in each slot where its next F or B is not ready
    yet (the time 1F1B spends waiting), and the W left at the end; at most as many W wait as the
    rank's warm-up forwards (a pending W keeps its activations alive: ZB-H1 keeps 1F1B's memory).
    Deadlock-free by construction."""
    todo = [[BackwardInput(op.mb, op.stage) if split and isinstance(op, Backward) else op for op in order]
            for order in orders]
    cap = [max(1, next((i for i, op in enumerate(order) if not isinstance(op, Forward)), len(order)))
           for order in orders]
    out, pending, done, start, t = [[] for _ in orders], [[] for _ in orders], {}, {}, 0
    while any(todo) or any(pending):
        finished = {}
        for r in range(len(orders)):
            if len(pending[r]) >= cap[r]:
                op = pending[r].pop(0)
            elif todo[r] and _ready(todo[r][0], done, t, last):
                op = todo[r].pop(0)
                if split and isinstance(op, BackwardInput):
                    pending[r].append(BackwardWeight(op.mb, op.stage))
            elif pending[r]:
                op = pending[r].pop(0)
            else:
                continue
            out[r].append(op)
            start[op], finished[op] = t, t + 1
        if not finished:
            raise ScheduleError(f"the compute orders wait on each other at slot {t}: no rank can go on")
        done.update(finished)
        t += 1
    return out, start


def _zbv(p, m):
    """ZB-V (Qi et al. 2024) on the V placement, played greedily on unit costs: in each slot a
    rank runs the first ready of B (the later stage first: it unblocks the rank below), F (the
    later stage first, at most 2p micro-batch chunks alive, ZB-V's memory: as 1F1B's), else its
    oldest pending W. Deadlock-free by construction, like ``_play``."""
    where, last = placement("zbv", p), 2 * p - 1
    mine = [sorted((s for s in range(last + 1) if where[s] == r), reverse=True) for r in range(p)]
    nxt_f = [{s: 0 for s in mine[r]} for r in range(p)]
    nxt_b = [{s: 0 for s in mine[r]} for r in range(p)]
    out, pending, done, alive, t = [[] for _ in range(p)], [[] for _ in range(p)], {}, [0] * p, 0
    while any(len(o) < 6 * m for o in out):
        finished = {}
        for r in range(p):
            bs = [BackwardInput(nxt_b[r][s], s) for s in mine[r] if nxt_b[r][s] < m]
            fs = [Forward(nxt_f[r][s], s) for s in mine[r] if nxt_f[r][s] < m]
            op = next((b for b in bs if _ready(b, done, t, last)), None)
            if op is None and alive[r] < 2 * p:
                op = next((f for f in fs if _ready(f, done, t, last)), None)
            if op is None and pending[r]:
                op = pending[r].pop(0)
            if op is None:
                continue
            if isinstance(op, BackwardInput):
                nxt_b[r][op.stage] += 1
                pending[r].append(BackwardWeight(op.mb, op.stage))
            elif isinstance(op, Forward):
                nxt_f[r][op.stage] += 1
                alive[r] += 1
            else:
                alive[r] -= 1
            out[r].append(op)
            finished[op] = t + 1
        if not finished:
            raise ScheduleError(f"zbv: no rank can go on at slot {t}")
        done.update(finished)
        t += 1
    return out


def _dualpipev(p, m, rank):
    """One rank's order under DualPipeV (DeepSeek-V3's DualPipe folded in a V), step for step as
    torch 2.13's ``ScheduleDualPipeV._calculate_single_rank_operations`` builds it. Rank r holds
    chunk 0 = stage r and chunk 1 = stage 2p-1-r. In its main phase it pairs the forward of one
    chunk with the whole backward (B and W at once) of the other chunk, for two different
    micro-batches (torch's OVERLAP_F_B action: here the two in order, as torch's runtime also runs
    them unless a custom function overlaps their compute and communication). W is split off only
    at the edges: where a B would otherwise leave the rank idle (after the warm-up and in the
    cool-down, the pending W filling the waits)."""
    c0, c1 = rank, 2 * p - 1 - rank
    nxt, weights, out = {}, [], []  # (stage, kind) -> next micro-batch; pending W, oldest first

    def take(stage, kind):
        mb = nxt.get((stage, kind), 0)
        nxt[(stage, kind)] = mb + 1
        return mb

    def f(stage):
        out.append(Forward(take(stage, Forward), stage))

    def b(stage, split=False):  # a whole backward, or its B with the W queued
        mb = take(stage, Backward)
        out.append(BackwardInput(mb, stage) if split else Backward(mb, stage))
        if split:
            weights.append(BackwardWeight(mb, stage))

    def w():
        if weights:
            out.append(weights.pop(0))

    for _ in range((p - rank - 1) * 2):  # 1: chunk 0's warm-up forwards
        f(c0)
    for _ in range(rank + 1):  # 2: forwards through both chunks
        f(c0)
        f(c1)
    for _ in range(p - rank - 1):  # 3: B, W, F of chunk 1 (zero bubble)
        b(c1, True)
        w()
        f(c1)
    for _ in range(m - 2 * p + rank + 1):  # 4: the main phase, F0 with B1 then F1 with B0 (each an overlapped pair)
        f(c0)  # torch: a plain F then B on the last rank's first round, an OVERLAP_F_B pair elsewhere
        b(c1)
        f(c1)
        b(c0)
    for _ in range(p - rank - 1):  # 5: B of chunk 1, then F1 with B0
        b(c1)
        f(c1)
        b(c0)
    split = False
    for i in range(rank + 1):  # 6: backwards of both chunks, split into B and W from the middle on
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        b(c1, split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        b(c0, split)
    for _ in range(p - rank - 1):  # 7: a pending W, then B of chunk 0
        w()
        b(c0, split)
    for _ in range(rank + 1):  # 8: the W left
        w()
    return out


def _orders(name, p, m, v):
    return [_compute_order(name, p, m, v, r) for r in range(p)]


def compute_orders(name, ranks, micro_batches, virtual=1) -> list[list]:
    """Every rank's computations in order, without the messages (see ``schedule``)."""
    check_schedule_args(name, ranks, micro_batches, virtual)
    v = chunks_per_rank(name, virtual)
    if name == "dualpipev":
        return [_dualpipev(ranks, micro_batches, r) for r in range(ranks)]
    if name in V_SHAPED:
        return _zbv(ranks, micro_batches)
    orders = _orders(name, ranks, micro_batches, v)
    return _play(orders, ranks * v - 1, True)[0] if name in SPLIT_BACKWARD else orders


def _messages(op, rank, where, last):
    """(receive, send) around computation ``op`` on ``rank``: None where the neighbour stage is
    on the same rank (or there is none)."""
    s = op.stage
    if isinstance(op, Forward):
        recv = RecvAct(op.mb, s, where[s - 1]) if s > 0 and where[s - 1] != rank else None
        return recv, (SendAct(op.mb, s, where[s + 1]) if s < last and where[s + 1] != rank else None)
    if isinstance(op, BackwardWeight):
        return None, None
    recv = RecvGrad(op.mb, s, where[s + 1]) if s < last and where[s + 1] != rank else None
    return recv, (SendGrad(op.mb, s, where[s - 1]) if s > 0 and where[s - 1] != rank else None)


def _producer(recv):
    """The computation (on the sending rank) whose result ``recv`` receives."""
    if isinstance(recv, RecvAct):
        return Forward(recv.mb, recv.stage - 1)
    return recv.mb, recv.stage + 1


def schedule(name: str, stages: int, micro_batches: int, virtual: int = 1) -> list[list]:
    """Instruction lists, one per rank, for ``stages`` ranks and ``micro_batches`` micro-batches.

    A send goes right after the computation that produced it. A receive goes right before the
    computation that needs it — for ``gpipe``, ``1f1b`` and ``interleaved``; the newer schedules
    post it as soon as the sender has sent (on unit costs), since a rank can run a long way ahead
    of its neighbour (looped BFS's whole first chunk) and gloo's sends complete only once received.
    The sends of one computation and the receives of the next form a batch. Two consecutive
    stages on one rank (the turn of ``zbv``'s V) pass their tensors without a message.
    """
    orders = compute_orders(name, stages, micro_batches, virtual)
    where = placement(name, stages, virtual)
    last = len(where) - 1
    early = name not in ("gpipe", "1f1b", "interleaved")
    start = _play(orders, last, False)[1] if early else {}
    finish = {(op.mb, op.stage) if not isinstance(op, Forward) else op: t + 1 for op, t in start.items()
              if not isinstance(op, BackwardWeight)}
    programs = []
    for rank, order in enumerate(orders):
        posted = []  # receives this rank posts ahead of their computation, by the sender's time
        if early:
            posted = sorted((finish[_producer(recv)], i, recv) for i, op in enumerate(order)
                            for recv in [_messages(op, rank, where, last)[0]] if recv is not None)
        program, k = [], 0
        for op in order:
            recv, send = _messages(op, rank, where, last)
            if early:
                while k < len(posted) and (posted[k][0] <= start[op] or posted[k][2] == recv):
                    program.append(posted[k][2])
                    k += 1
            elif recv is not None:
                program.append(recv)
            program += [op] + ([send] if send is not None else [])
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
# Checking and timing the lists: converted to the one simulator's instructions (mpkit.simulator.engine).
# What each instruction needs and produces is the schedule's meaning, so it lives here; what each
# costs is the caller's: ``simulate`` below on unit costs, the cost model on a machine's prices
# (``mpkit.pricing.pipeline_program``, the strategies' ``program``).

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


def dataflow(item, mine, last) -> tuple:
    """(needs, produces) of computation ``item`` on a rank holding stages ``mine`` (``last``: the
    last stage). Two consecutive stages on one rank hand their tensors over in place: the
    computation produces the next one's input (or the previous one's output gradient). B leaves
    ``w`` for its W."""
    s, mb = item.stage, item.mb
    if isinstance(item, Forward):
        return ((("in", mb, s),) if s > 0 else (),
                (("out", mb, s),) + ((("in", mb, s + 1),) if s + 1 in mine else ()))
    if isinstance(item, BackwardWeight):
        return (("w", mb, s),), (("w done", mb, s),)
    needs = (("out", mb, s),) + ((("grad", mb, s),) if s < last else ())
    made = (("dx", mb, s),) + ((("grad", mb, s - 1),) if s - 1 in mine else ())
    return needs, made + ((("w", mb, s),) if isinstance(item, BackwardInput) else ())


_NAMES = {BackwardInput: "B", BackwardWeight: "W"}  # the trace's name of a split backward's two parts


def computation(item, seconds, needs, produces) -> Compute:
    """Computation ``item`` (Forward, Backward, B or W) as one simulator instruction of ``seconds``."""
    return Compute("forward" if isinstance(item, Forward) else "backward", seconds, item.stage, item.mb, needs=needs,
                   produces=produces, source=item, name=_NAMES.get(type(item), ""))


def engine_instructions(program, rank, compute, link, optimizer=None, last=None) -> list:
    """One rank's schedule list as the simulator's instructions, priced by the caller.

    ``compute(item, needs, produces)`` -> the instructions of a computation (``computation``, or
    several); ``link(ins)`` -> (global rank of the peer, bytes, seconds) of a message;
    ``optimizer()`` -> the instructions after the flush (None: no optimizer step); ``last``: the
    last stage (default: this rank's last). Each communication batch stays one batch, as the
    executor runs it: receives waited at once, sends at the next batch or before the optimizer step.
    """
    if last is None:
        last = max(ins.stage for ins in program if isinstance(ins, Forward))
    mine = {ins.stage for ins in program if isinstance(ins, Forward)}
    out = []
    for item in batches(program):
        if isinstance(item, list):
            out.append(P2P(tuple(_msg(ins, link) for ins in item), defer_sends=True, source=item))
        elif isinstance(item, OptimizerStep):
            out += [WaitSends()] + (optimizer() if optimizer is not None else [])
        else:
            out += compute(item, *dataflow(item, mine, last))
    return out


def _msg(ins, link):
    peer, nbytes, seconds = link(ins)
    kind = "send" if isinstance(ins, (SendAct, SendGrad)) else "recv"
    return Msg(kind, peer, message(ins), nbytes, seconds, ins.stage, ins.mb, _data(ins))


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


def simulate(programs, forward=1, backward=2, comm=0, weight=None) -> Simulation:
    """Run per-rank instruction lists on unit costs: ``forward``/``backward`` per Forward/Backward,
    ``weight`` of the backward in W where it is split (default half), ``comm`` per message. Raises ``ScheduleError`` on a deadlock, on a receive matched by a
    different message than it expects (posting order differs), or on an instruction whose input
    is missing (e.g. a Backward before its Forward, or one that runs twice)."""
    _check_lists(programs)
    w = Fraction(backward) / 2 if weight is None else Fraction(weight)
    seconds = {Forward: Fraction(forward), Backward: Fraction(backward), BackwardInput: Fraction(backward) - w,
               BackwardWeight: w}
    last = max((ins.stage for prog in programs for ins in prog if isinstance(ins, Forward)), default=0)

    def compute(item, needs, produces):
        return [computation(item, seconds[type(item)], needs, produces)]

    def link(ins):
        return (ins.to if isinstance(ins, (SendAct, SendGrad)) else ins.frm), 0, Fraction(comm)

    trace = run_programs([engine_instructions(program, rank, compute, link, last=last)
                          for rank, program in enumerate(programs)])
    p = len(programs)
    spans, peak, busy, in_flight = [], [0] * p, [Fraction(0)] * p, [0] * p
    for e in trace.events:  # sorted by rank, then time
        if e.kind not in ("forward", "backward"):
            continue
        kind = Forward if e.kind == "forward" else {"B": BackwardInput, "W": BackwardWeight}.get(e.name, Backward)
        spans.append((e.rank, kind(e.micro_batch, e.stage), e.start, e.end))
        busy[e.rank] += e.end - e.start
        in_flight[e.rank] += 1 if kind is Forward else 0 if kind is BackwardInput else -1
        peak[e.rank] = max(peak[e.rank], in_flight[e.rank])
    makespan = max((end for *_, end in spans), default=Fraction(0))
    return Simulation(Fraction(makespan), spans, peak, busy)


def validate(programs) -> None:
    """Raise ``ScheduleError`` unless the lists run to the end (see ``simulate``)."""
    simulate(programs)


def _check_lists(programs) -> None:
    """Every item is an instruction and every message addresses one of the lists' ranks (a rank
    -1 would silently be the last one)."""
    for rank, program in enumerate(programs):
        for ins in program:
            if not isinstance(ins, COMPUTE + COMM + (OptimizerStep,)):
                raise ScheduleError(f"rank {rank}'s list holds {ins!r}, which is not an instruction; use Forward, "
                                    f"Backward, BackwardInput, BackwardWeight, SendAct, RecvAct, SendGrad, RecvGrad "
                                    f"or OptimizerStep")
            peer = getattr(ins, "to", getattr(ins, "frm", None))
            if isinstance(ins, COMM) and not 0 <= peer < len(programs):
                raise ScheduleError(f"rank {rank}'s {ins} addresses rank {peer}, but the lists are for ranks "
                                    f"0..{len(programs) - 1}")
