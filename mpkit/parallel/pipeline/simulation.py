"""Checking and timing schedule lists: each list converted to the one simulator's instructions
(``mpkit.simulator.engine``) and played.

What each instruction needs and produces is the schedule's meaning, so it lives here
(``dataflow``, ``message``); what each costs is the caller's: ``simulate`` below on unit costs
(no deadlock, every micro-batch once per stage, in-flight activations, bubble), the cost model on
a machine's prices (``mpkit.pricing.pipeline_program``, the strategies' ``program``).

Communication semantics (what the executor does and the simulator models): the communication
instructions between two computations form one batch, posted together (isend/irecv), like
torch's ``batch_isend_irecv`` and Megatron's ``send_forward_recv_backward``. Its receives are
waited at once; its sends at the rank's next batch (or before the optimizer step), so a send
overlaps the next computation. A send completes only once the receiver posted the receive
(gloo sends are rendezvous: data moves when the receive is posted). Messages between two ranks
are matched in the order they were posted, so the receiver must post them in the sender's order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from mpkit.parallel.pipeline.instructions import (COMM, COMPUTE, Backward, BackwardInput, BackwardWeight, Forward,
                                                  OptimizerStep, RecvAct, SendAct, SendGrad, batches)
from mpkit.simulator.engine import Compute, Msg, P2P, ProgramError, WaitSends
from mpkit.simulator.engine import simulate as run_programs

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


__all__ = ["ScheduleError", "Simulation", "simulate", "validate", "message", "dataflow", "computation",
           "engine_instructions"]
