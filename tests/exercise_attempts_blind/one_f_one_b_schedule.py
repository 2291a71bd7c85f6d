"""Blind attempts at one_f_one_b_schedule (written without the reference)."""
from collections import deque

from mpkit.parallel.pipeline.schedules import (Backward, Forward, OptimizerStep, RecvAct, RecvGrad, SendAct,
                                               SendGrad)


def _wrap(order, rank, p):
    prog = []
    for kind, mb in order:
        if kind == "F":
            prog += ([RecvAct(mb, rank, rank - 1)] if rank > 0 else []) + [Forward(mb, rank)]
            prog += [SendAct(mb, rank, rank + 1)] if rank < p - 1 else []
        else:
            prog += ([RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []) + [Backward(mb, rank)]
            prog += [SendGrad(mb, rank, rank - 1)] if rank > 0 else []
    return prog + [OptimizerStep()]


# unusual: written as "p - rank Forwards, then (Backward, Forward) pairs" with two queues
def backward_first_pairs(rank, p, m):
    todo_f, todo_b = deque(range(m)), deque()
    order = []
    for _ in range(min(p - rank, m)):
        mb = todo_f.popleft()
        order.append(("F", mb))
        todo_b.append(mb)
    while todo_f:
        order.append(("B", todo_b.popleft()))
        mb = todo_f.popleft()
        order.append(("F", mb))
        todo_b.append(mb)
    order += [("B", mb) for mb in todo_b]
    return _wrap(order, rank, p)


# unusual: the order computed by counting, a Forward whenever fewer than p - rank are in flight
def counted_in_flight(rank, p, m):
    order, next_f, next_b = [], 0, 0
    while next_b < m:
        if next_f < m and next_f - next_b < p - rank:
            order.append(("F", next_f))
            next_f += 1
        else:
            order.append(("B", next_b))
            next_b += 1
    return _wrap(order, rank, p)


def _one_f_one_b(rank, p, m, warmup):
    w = min(warmup, m)
    order = [("F", k) for k in range(w)]
    for k in range(m - w):
        order += [("F", w + k), ("B", k)]
    order += [("B", k) for k in range(m - w, m)]
    return _wrap(order, rank, p)


# wrong (wasteful): no warm-up, F_k B_k one after the other: valid, but the bubble of no pipelining
def no_warmup(rank, p, m):
    return _one_f_one_b(rank, p, m, 0)


# wrong (more memory): one warm-up Forward too many, p - rank, so p - rank + 1 activations live at once
def warmup_one_too_many(rank, p, m):
    return _one_f_one_b(rank, p, m, p - rank)


# wrong: warm-up counted from the wrong end (rank instead of p - rank - 1)
def warmup_reversed(rank, p, m):
    return _one_f_one_b(rank, p, m, rank)


# wrong (more memory): GPipe's order, all Forwards then all Backwards (m activations held)
def gpipe_order(rank, p, m):
    return _wrap([("F", k) for k in range(m)] + [("B", k) for k in range(m)], rank, p)


# wrong (raises): forgets to return the list
def forgets_return(rank, p, m):
    _one_f_one_b(rank, p, m, p - rank - 1)


# wrong (raises): Forward built without its stage
def forward_without_stage(rank, p, m):
    return [Forward(i.mb) if isinstance(i, Forward) else i for i in _one_f_one_b(rank, p, m, p - rank - 1)]


CORRECT = [backward_first_pairs, counted_in_flight]
WRONG = [
    (no_warmup, ("bubble", "warm-up", "warm up")),
    (warmup_one_too_many, ("activations", "in flight", "in-flight", "p - r", "at most")),
    (warmup_reversed, ("warm-up", "p - r - 1", "p-r-1")),
    (gpipe_order, ("activations", "in flight", "in-flight", "memory", "gpipe")),
    (forgets_return, ("return", "none")),
    (forward_without_stage, ("stage", "argument", "missing")),
]
