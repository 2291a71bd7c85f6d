"""Compute orders played slot by slot on unit costs (one slot per computation): how the zero-bubble
schedules find where each W goes, and when a rank's receive can be posted.

A schedule that writes its order by formula (GPipe, 1F1B, interleaved) needs no player. Zero
bubble (Qi et al. 2024) places W by playing instead: every rank takes, in each slot, the next
computation whose inputs are ready; where its next F or B is not ready yet (the slot 1F1B spends
waiting), it runs a pending W. Played this way the orders are deadlock-free by construction (a
computation only starts once its inputs were computed), and ``simulate`` checks them again.
"""
from __future__ import annotations

from mpkit.parallel.pipeline.instructions import Backward, BackwardInput, BackwardWeight, Forward
from mpkit.parallel.pipeline.simulation import ScheduleError


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


def play_orders(orders, last, split):
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


def play_zbv(p, m, where):
    """ZB-V (Qi et al. 2024) on the V placement ``where`` (stage -> rank), played greedily on unit
    costs: in each slot a rank runs the first ready of B (the later stage first: it unblocks the
    rank below), F (the later stage first, at most 2p micro-batch chunks alive, ZB-V's memory: as
    1F1B's), else its oldest pending W. Deadlock-free by construction, like ``play_orders``."""
    last = 2 * p - 1
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


__all__ = ["play_orders", "play_zbv"]
