"""Attempts for zb_h1_schedule(rank, p, m): the backward split into B (BackwardInput) and W
(BackwardWeight), graded on ZB-H1's bubble and 1F1B's peak of activations."""
from mpkit.parallel.pipeline.schedules import (Backward, BackwardInput, BackwardWeight, Forward, OptimizerStep, RecvAct,
                                               RecvGrad, SendAct, SendGrad)


def _program(rank, p, order, backward=(BackwardInput,)):
    """(kind, mb) computations wrapped in their messages; ``backward``: what a B stands for, before its SendGrad."""
    prog = []
    for kind, mb in order:
        if kind == "F":
            prog += ([RecvAct(mb, rank, rank - 1)] if rank else []) + [Forward(mb, rank)]
            prog += [SendAct(mb, rank, rank + 1)] if rank < p - 1 else []
        elif kind == "B":
            prog += ([RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []) + [step(mb, rank) for step in backward]
            prog += [SendGrad(mb, rank, rank - 1)] if rank else []
        else:
            prog.append(BackwardWeight(mb, rank))
    return prog + [OptimizerStep()]


# ---------------------------------------------------------------- correct
def deferred_w_by_index(rank, p, m):
    """W(k - rank) right after B(k): the same rule written with indices instead of a queue."""
    warm = min(p - rank - 1, m)
    order = [("F", k) for k in range(warm)]
    for k in range(m):
        if warm + k < m:
            order.append(("F", warm + k))
        order.append(("B", k))
        if k - rank >= 0:
            order.append(("W", k - rank))
    order += [("W", k) for k in range(max(0, m - rank), m)]
    return _program(rank, p, order)


def w_before_the_next_forward(rank, p, m):
    """A pending W runs before the next F (not after the B): another order with the same bubble."""
    warm = min(p - rank - 1, m)
    order, pending = [("F", k) for k in range(warm)], []
    for k in range(m):
        if len(pending) > rank:
            order.append(("W", pending.pop(0)))
        if warm + k < m:
            order.append(("F", warm + k))
        order.append(("B", k))
        pending.append(k)
    return _program(rank, p, order + [("W", k) for k in pending])


def state_machine(rank, p, m):
    """One rule per slot: a W when more than `rank` wait, else a F while the warm-up allows, else a B."""
    warm = min(p - rank - 1, m)
    f = b = 0
    pending, order = [], []
    while f < m or b < m or pending:
        if pending and (len(pending) > rank or b == m):
            order.append(("W", pending.pop(0)))
        elif f < m and f - b <= warm:
            order.append(("F", f))
            f += 1
        else:
            order.append(("B", b))
            pending.append(b)
            b += 1
    return _program(rank, p, order)


CORRECT = [deferred_w_by_index, w_before_the_next_forward, state_machine]


# ---------------------------------------------------------------- wrong
def _one_f_one_b(rank, p, m):
    warm = min(p - rank - 1, m)
    order = [("F", k) for k in range(warm)]
    for k in range(m - warm):
        order += [("F", warm + k), ("B", k)]
    return order + [("B", k) for k in range(m - warm, m)]


def w_right_after_b(rank, p, m):
    """Correct and split, but each W at once after its B: 1F1B's bubble (inefficient)."""
    order = []
    for kind, mb in _one_f_one_b(rank, p, m):
        order += [(kind, mb)] + ([("W", mb)] if kind == "B" else [])
    return _program(rank, p, order)


def every_w_at_the_end(rank, p, m):
    """All W deferred to the end: activations of all m micro-batches stay alive."""
    return _program(rank, p, _one_f_one_b(rank, p, m) + [("W", k) for k in range(m)])


def cooldown_w_at_the_end(rank, p, m):
    """Steady state right, but the cool-down's W all wait for the end: the drain bubble comes back."""
    warm = min(p - rank - 1, m)
    order, pending = [("F", k) for k in range(warm)], []
    for k in range(m - warm):
        order += [("F", warm + k), ("B", k)]
        pending.append(k)
        if len(pending) > rank:
            order.append(("W", pending.pop(0)))
    order += [("B", k) for k in range(m - warm, m)]
    return _program(rank, p, order + [("W", k) for k in pending + list(range(m - warm, m))])


def unsplit_backward(rank, p, m):
    """Plain 1F1B with whole Backward: not the exercise's instructions."""
    return _program(rank, p, _one_f_one_b(rank, p, m), backward=(Backward,))


def w_before_its_b(rank, p, m):
    """W placed before the B of the same micro-batch."""
    order = []
    for kind, mb in _one_f_one_b(rank, p, m):
        order += ([("W", mb)] if kind == "B" else []) + [(kind, mb)]
    return _program(rank, p, order)


def forgot_w(rank, p, m):
    """B only: the weight gradients are never computed."""
    return _program(rank, p, _one_f_one_b(rank, p, m))


def grad_sent_after_w(rank, p, m):
    """SendGrad after the W: the previous stage waits for B+W again, as in 1F1B."""
    return _program(rank, p, _one_f_one_b(rank, p, m), backward=(BackwardInput, BackwardWeight))


WRONG = [
    (w_right_after_b, "right after its b"),
    (every_w_at_the_end, "activations"),
    (cooldown_w_at_the_end, "bubble"),
    (unsplit_backward, "backwardinput"),
    (w_before_its_b, "without"),
    (forgot_w, "backwardweight"),
    (grad_sent_after_w, "sendgrad comes after the w"),
]
