"""The instructions a pipeline schedule is written in: one rank's list is a sequence of these.

Stages are numbered globally (stage ``s`` of ``p·v``; ``schedules.placement`` says which rank holds
it); ``mb`` is the micro-batch. A computation (``Forward``, ``Backward``, or a zero-bubble
schedule's ``BackwardInput`` and ``BackwardWeight``) runs one stage on one micro-batch; a message
(``SendAct``, ``RecvAct``, ``SendGrad``, ``RecvGrad``) moves an activation forward or a gradient
backward between the ranks of two neighbouring stages; ``OptimizerStep`` ends the list. The
messages between two computations form one *batch*, posted together (``batches``).
"""
from __future__ import annotations

from dataclasses import dataclass


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


__all__ = ["Forward", "Backward", "BackwardInput", "BackwardWeight", "SendAct", "RecvAct", "SendGrad", "RecvGrad",
           "OptimizerStep", "COMPUTE", "COMM", "batches"]
