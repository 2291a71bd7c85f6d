"""Bytes each rank sends in each phase of a step (forward, backward, the gradient synchronisation)
against a cost target, and the message that names both: what lab 11's exercises share. ``traffic``
prices each recorded call (a collective's share under lab 05's algorithms, a message's payload)."""
from __future__ import annotations

from mpkit.exercises.common import failed
from mpkit.exercises.result import Text
from mpkit.exercises.traffic import sent

PHASES = {"forward": Text("순전파", "forward"), "backward": Text("역전파", "backward"),
          "sync": Text("동기화", "synchronisation")}


def kinds(calls, phase=None) -> list:
    """The kinds of the recorded ``calls`` (of one ``phase``, when given), sorted."""
    return sorted({c.kind for c in calls if phase is None or c.phase == phase})


def over_target(outputs, n, target, phases=("forward", "backward"), counted=(), most=None):
    """The first (rank, phase, bytes sent, calls made, kinds used) whose bytes pass ``target``, or
    which makes more than ``most`` calls of the ``counted`` kinds; None when every rank meets it."""
    for rank, output in enumerate(outputs):
        calls = output["calls"]
        for phase in phases:
            measured = sent(calls, n, rank, phase)
            made = [c for c in calls if c.phase == phase and c.kind != "recv"]
            if measured > target or (most is not None and sum(c.kind in counted for c in made) > most):
                return rank, phase, measured, len(made), kinds(calls, phase)
    return None


def most_sent(outputs, n, phases=("forward", "backward")) -> int:
    """The most bytes any rank sent in any of ``phases``: what a passed case reports."""
    return max(sent(o["calls"], n, rank, phase) for rank, o in enumerate(outputs) for phase in phases)


def missed(case, found, target, what: Text, hint):
    """The failed case for ``found`` (``over_target``'s answer): the measured figure and the target, ``what``."""
    rank, phase, measured, made, used = found
    return failed(case, Text(
        f"랭크 {rank}의 {PHASES[phase].ko}: 호출 {made}번({', '.join(used)})으로 {measured} B를 보냈습니다. "
        f"목표: {target} B 이하 = {what.ko}.",
        f"rank {rank}'s {PHASES[phase].en}: sent {measured} B in {made} call{'s' if made != 1 else ''} "
        f"({', '.join(used)}); the target is at most {target} B = {what.en}."), hint)
