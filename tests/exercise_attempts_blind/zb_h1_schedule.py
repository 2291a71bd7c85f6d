"""Blind attempts at zb_h1_schedule (written without the reference)."""
from collections import deque

from mpkit.parallel.pipeline.schedules import (Backward, BackwardInput, BackwardWeight, Forward, OptimizerStep,
                                               RecvAct, RecvGrad, SendAct, SendGrad)


def _wrap(order, rank, p, grad_after_w=False):
    prog = []
    for kind, mb in order:
        if kind == "F":
            prog += ([RecvAct(mb, rank, rank - 1)] if rank > 0 else []) + [Forward(mb, rank)]
            prog += [SendAct(mb, rank, rank + 1)] if rank < p - 1 else []
        elif kind == "B":
            prog += ([RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []) + [BackwardInput(mb, rank)]
            prog += [SendGrad(mb, rank, rank - 1)] if rank > 0 and not grad_after_w else []
        else:
            prog.append(BackwardWeight(mb, rank))
            prog += [SendGrad(mb, rank, rank - 1)] if rank > 0 and grad_after_w else []
    return prog + [OptimizerStep()]


def _order(rank, p, m, keep):
    """1F1B's F/B order; after each B, W's run while more than `keep` are pending; the rest at the end."""
    w = min(p - rank - 1, m)
    order, pending = [("F", k) for k in range(w)], deque()

    def backward(k):
        order.append(("B", k))
        pending.append(k)
        while len(pending) > keep:
            order.append(("W", pending.popleft()))

    for k in range(m - w):
        order.append(("F", w + k))
        backward(k)
    for k in range(m - w, m):
        backward(k)
    order += [("W", k) for k in pending]
    return order


# unusual: the order from a deque of deferred W's (rank r keeps up to r pending), keyword-free tuples
def deferred_queue(rank, p, m):
    return _wrap(_order(rank, p, m, rank), rank, p)


# unusual: built by counters alone (no queue): F while under the warm-up, B when due, W when r are pending
def counters_only(rank, p, m):
    order, f, b, wt = [], 0, 0, 0
    warm = min(p - rank - 1, m)
    while f < warm:
        order.append(("F", f))
        f += 1
    while b < m:
        if f < m:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
        if b - wt > rank:
            order.append(("W", wt))
            wt += 1
    while wt < m:
        order.append(("W", wt))
        wt += 1
    return _wrap(order, rank, p)


# wrong (wasteful): W right after each B (1F1B with the backward merely split): 1F1B's bubble
def w_right_after_b(rank, p, m):
    return _wrap(_order(rank, p, m, 0), rank, p)


# wrong (more memory): every W deferred to the end: the activations of all m micro-batches live at once
def all_w_at_the_end(rank, p, m):
    return _wrap(_order(rank, p, m, m), rank, p)


# wrong (wasteful): SendGrad only after the W, so the previous stage waits for B+W as in 1F1B
def send_grad_after_w(rank, p, m):
    return _wrap(_order(rank, p, m, rank), rank, p, grad_after_w=True)


# wrong: the backward not split, a full Backward as in 1F1B
def unsplit_backward(rank, p, m):
    prog = []
    for i in _wrap(_order(rank, p, m, 0), rank, p):
        if isinstance(i, BackwardInput):
            prog.append(Backward(i.mb, i.stage))
        elif not isinstance(i, BackwardWeight):
            prog.append(i)
    return prog


# wrong: W placed before its B
def w_before_b(rank, p, m):
    order = []
    for kind, mb in _order(rank, p, m, 0):
        if kind == "B":
            order += [("W", mb), ("B", mb)]
        elif kind == "F":
            order.append((kind, mb))
    return _wrap(order, rank, p)


# wrong (raises): BackwardWeight built without its stage
def weight_without_stage(rank, p, m):
    prog = _wrap(_order(rank, p, m, rank), rank, p)
    return [BackwardWeight(i.mb) if isinstance(i, BackwardWeight) else i for i in prog]


CORRECT = [deferred_queue, counters_only]
WRONG = [
    (w_right_after_b, ("bubble", "3(p-1)", "idle")),
    (all_w_at_the_end, ("activations", "at most", "hold", "memory")),
    (send_grad_after_w, ("sendgrad", "after its backwardinput", "right after", "after the b")),
    (unsplit_backward, ("backwardinput", "backwardweight", "split")),
    (w_before_b, ("before", "order", "after its")),
    (weight_without_stage, ("argument", "stage", "missing")),
]
