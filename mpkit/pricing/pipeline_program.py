"""A pipeline schedule's lists priced for the cost model: what ``pp`` and ``3d`` build their
``program(pricer)`` with.

``mpkit.parallel.pipeline.simulation.engine_instructions`` says what each instruction of a list
needs and produces in the simulator's terms; this module says what it costs, from a strategy's
prices: a computation's seconds (or its pieces with tensor parallelism's collectives between them),
a message's bytes and seconds between two global ranks, the optimizer step after the flush, and
how a split backward's time divides between B and W.
"""
from __future__ import annotations

from dataclasses import replace

from mpkit.parallel.pipeline.instructions import Backward, BackwardWeight, Forward, SendAct, SendGrad
from mpkit.parallel.pipeline.simulation import computation, engine_instructions, message
from mpkit.simulator.engine import Compute


def engine_program(program, rank, forward, backward, message_cost, optimizer, peers, last=None, weight=None):
    """One rank's schedule list as the simulator's instructions, priced.

    ``forward(stage, mb)``/``backward(stage, mb)`` -> seconds, or a list of instructions (see
    ``_phase``); ``weight(stage, mb)``: the W part of a split backward (its B costs backward - W;
    default: half the backward); ``message_cost(kind 'act'|'grad', stage it feeds, src, dst)`` ->
    (bytes, seconds); ``optimizer(rank)`` -> seconds or a list of instructions (None: no optimizer
    step); ``peers[r]``: the global rank of pipeline rank r; ``last``: the last stage."""
    if weight is None:
        def weight(s, mb):
            return backward(s, mb) / 2
    me = peers[rank]

    def compute(item, needs, produces):
        s, mb = item.stage, item.mb
        if isinstance(item, Forward):
            value = forward(s, mb)
        elif isinstance(item, Backward):
            value = backward(s, mb)
        elif isinstance(item, BackwardWeight):
            value = weight(s, mb)
        else:  # B: the backward without its W
            value = backward(s, mb) - weight(s, mb)
        return _phase(item, value, needs, produces)

    def link(ins):
        send = isinstance(ins, (SendAct, SendGrad))
        peer = peers[ins.to if send else ins.frm]
        kind, _, stage = message(ins)
        return (peer, *message_cost(kind, stage, *((me, peer) if send else (peer, me))))

    def step():
        seconds = optimizer(rank)
        return seconds if isinstance(seconds, list) else [Compute("optimizer", seconds)]

    return engine_instructions(program, rank, compute, link, step if optimizer is not None else None, last)


def engine_programs(lists, forward, backward, message_cost, optimizer=None, weight=None):
    """Every rank's list (ranks 0..p-1 of one pipeline) as the simulator's programs."""
    last = max((ins.stage for prog in lists for ins in prog if isinstance(ins, Forward)), default=0)
    peers = list(range(len(lists)))
    return [engine_program(program, rank, forward, backward, message_cost, optimizer, peers, last, weight)
            for rank, program in enumerate(lists)]


def _phase(item, value, needs, produces) -> list:
    """Computation ``item`` as instructions: ``value`` seconds, or a list of instructions (compute
    pieces and the collectives between them, as tensor parallelism issues them) whose first
    compute needs the inputs and whose last produces the outputs."""
    if not isinstance(value, list):
        return [computation(item, value, needs, produces)]
    kind = "forward" if isinstance(item, Forward) else "backward"
    pieces = [replace(ins, kind=kind, stage=item.stage, micro_batch=item.mb) if isinstance(ins, Compute) else ins
              for ins in value]
    computes = [i for i, ins in enumerate(pieces) if isinstance(ins, Compute)]
    pieces[computes[0]] = replace(pieces[computes[0]], needs=needs, source=item)
    pieces[computes[-1]] = replace(pieces[computes[-1]], produces=produces)
    return pieces


__all__ = ["engine_program", "engine_programs"]
