"""Attempts for gpipe_schedule(rank, p, m)."""
from mpkit.parallel.pipeline.schedules import (Backward, Forward, OptimizerStep, RecvAct, RecvGrad, SendAct,
                                               SendGrad)


# ---------------------------------------------------------------- correct
def backward_in_reverse_order(rank, p, m):
    """Every forward in order, then every backward from the last micro-batch to the first (same on every rank)."""
    s = rank
    prog = []
    for mb in range(m):
        if s > 0:
            prog.append(RecvAct(mb, s, s - 1))
        prog.append(Forward(mb, s))
        if s < p - 1:
            prog.append(SendAct(mb, s, s + 1))
    for mb in reversed(range(m)):
        if s < p - 1:
            prog.append(RecvGrad(mb, s, s + 1))
        prog.append(Backward(mb, s))
        if s > 0:
            prog.append(SendGrad(mb, s, s - 1))
    prog.append(OptimizerStep())
    return prog


def recv_listed_before_send(rank, p, m):
    """Built as a flat list with list.extend; between two computations the receive of the next micro-batch is
    listed before the send of the previous one (the batch is posted together, so the order inside it is free)."""
    first, last = rank == 0, rank == p - 1
    prog = [] if first else [RecvAct(0, rank, rank - 1)]
    for mb in range(m):
        prog.append(Forward(mb, rank))
        nxt = [] if (first or mb == m - 1) else [RecvAct(mb + 1, rank, rank - 1)]
        prog.extend(nxt + ([] if last else [SendAct(mb, rank, rank + 1)]))
    if not last:
        prog.append(RecvGrad(0, rank, rank + 1))
    for mb in range(m):
        prog.append(Backward(mb, rank))
        nxt = [] if (last or mb == m - 1) else [RecvGrad(mb + 1, rank, rank + 1)]
        prog.extend(nxt + ([] if first else [SendGrad(mb, rank, rank - 1)]))
    return prog + [OptimizerStep()]


def forwards_descending(rank, p, m):
    """Every rank forwards the micro-batches m-1..0, then backwards 0..m-1 (consistent on every rank)."""
    prog = []
    for mb in range(m - 1, -1, -1):
        prog += ([RecvAct(mb, rank, rank - 1)] if rank else []) + [Forward(mb, rank)]
        prog += [SendAct(mb, rank, rank + 1)] if rank < p - 1 else []
    for mb in range(m):
        prog += ([RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []) + [Backward(mb, rank)]
        prog += [SendGrad(mb, rank, rank - 1)] if rank else []
    return prog + [OptimizerStep()]


CORRECT = [backward_in_reverse_order, recv_listed_before_send, forwards_descending]


# ---------------------------------------------------------------- wrong
def _gpipe(rank, p, m, optimizer=True):
    prog = []
    for mb in range(m):
        if rank > 0:
            prog.append(RecvAct(mb, rank, rank - 1))
        prog.append(Forward(mb, rank))
        if rank < p - 1:
            prog.append(SendAct(mb, rank, rank + 1))
    for mb in range(m):
        if rank < p - 1:
            prog.append(RecvGrad(mb, rank, rank + 1))
        prog.append(Backward(mb, rank))
        if rank > 0:
            prog.append(SendGrad(mb, rank, rank - 1))
    if optimizer:
        prog.append(OptimizerStep())
    return prog


def no_optimizer_step(rank, p, m):
    prog = []
    for mb in range(m):
        if rank > 0:
            prog.append(RecvAct(mb, rank, rank - 1))
        prog.append(Forward(mb, rank))
        if rank < p - 1:
            prog.append(SendAct(mb, rank, rank + 1))
    for mb in range(m):
        if rank < p - 1:
            prog.append(RecvGrad(mb, rank, rank + 1))
        prog.append(Backward(mb, rank))
        if rank > 0:
            prog.append(SendGrad(mb, rank, rank - 1))
    return prog


def messages_at_the_ends(rank, p, m):
    """Forgets the boundary conditions: stage 0 receives from rank -1, the last stage sends to rank p."""
    prog = []
    for mb in range(m):
        prog += [RecvAct(mb, rank, rank - 1), Forward(mb, rank), SendAct(mb, rank, rank + 1)]
    for mb in range(m):
        prog += [RecvGrad(mb, rank, rank + 1), Backward(mb, rank), SendGrad(mb, rank, rank - 1)]
    return prog + [OptimizerStep()]


def send_grad_before_backward(rank, p, m):
    prog = []
    for mb in range(m):
        if rank > 0:
            prog.append(RecvAct(mb, rank, rank - 1))
        prog.append(Forward(mb, rank))
        if rank < p - 1:
            prog.append(SendAct(mb, rank, rank + 1))
    for mb in range(m):
        if rank < p - 1:
            prog.append(RecvGrad(mb, rank, rank + 1))
        if rank > 0:
            prog.append(SendGrad(mb, rank, rank - 1))
        prog.append(Backward(mb, rank))
    return prog + [OptimizerStep()]


def grads_from_wrong_neighbour(rank, p, m):
    """Backward messages go the same way as the forward ones."""
    prog = []
    for mb in range(m):
        if rank > 0:
            prog.append(RecvAct(mb, rank, rank - 1))
        prog.append(Forward(mb, rank))
        if rank < p - 1:
            prog.append(SendAct(mb, rank, rank + 1))
    for mb in range(m):
        if rank > 0:
            prog.append(RecvGrad(mb, rank, rank - 1))
        prog.append(Backward(mb, rank))
        if rank < p - 1:
            prog.append(SendGrad(mb, rank, rank + 1))
    return prog + [OptimizerStep()]


def one_f_one_b_submitted(rank, p, m):
    """A 1F1B order submitted as GPipe."""
    def f(mb):
        return ([RecvAct(mb, rank, rank - 1)] if rank > 0 else []) + [Forward(mb, rank)] + \
            ([SendAct(mb, rank, rank + 1)] if rank < p - 1 else [])

    def b(mb):
        return ([RecvGrad(mb, rank, rank + 1)] if rank < p - 1 else []) + [Backward(mb, rank)] + \
            ([SendGrad(mb, rank, rank - 1)] if rank > 0 else [])
    w = min(p - rank - 1, m)
    prog = []
    for k in range(w):
        prog += f(k)
    for k in range(m - w):
        prog += f(w + k) + b(k)
    for k in range(m - w, m):
        prog += b(k)
    return prog + [OptimizerStep()]


def backward_order_differs_by_rank(rank, p, m):
    """Even ranks run the backwards in reverse, odd ranks in order: messages arrive out of order."""
    prog = []
    for mb in range(m):
        if rank > 0:
            prog.append(RecvAct(mb, rank, rank - 1))
        prog.append(Forward(mb, rank))
        if rank < p - 1:
            prog.append(SendAct(mb, rank, rank + 1))
    order = range(m) if rank % 2 else reversed(range(m))
    for mb in order:
        if rank < p - 1:
            prog.append(RecvGrad(mb, rank, rank + 1))
        prog.append(Backward(mb, rank))
        if rank > 0:
            prog.append(SendGrad(mb, rank, rank - 1))
    return prog + [OptimizerStep()]


def forgot_recv_act(rank, p, m):
    prog = []
    for mb in range(m):
        prog.append(Forward(mb, rank))
        if rank < p - 1:
            prog.append(SendAct(mb, rank, rank + 1))
    for mb in range(m):
        if rank < p - 1:
            prog.append(RecvGrad(mb, rank, rank + 1))
        prog.append(Backward(mb, rank))
        if rank > 0:
            prog.append(SendGrad(mb, rank, rank - 1))
    return prog + [OptimizerStep()]


def stage0_receives_from_minus_one(rank, p, m):
    """Only the first boundary forgotten: stage 0 posts RecvAct(frm=-1) and SendGrad(to=-1)."""
    prog = []
    for mb in range(m):
        prog.append(RecvAct(mb, rank, rank - 1))
        prog.append(Forward(mb, rank))
        if rank < p - 1:
            prog.append(SendAct(mb, rank, rank + 1))
    for mb in range(m):
        if rank < p - 1:
            prog.append(RecvGrad(mb, rank, rank + 1))
        prog.append(Backward(mb, rank))
        prog.append(SendGrad(mb, rank, rank - 1))
    return prog + [OptimizerStep()]


WRONG = [
    (no_optimizer_step, "optimizer"),
    (messages_at_the_ends, "no neighbouring stage"),
    (send_grad_before_backward, "before"),
    (grads_from_wrong_neighbour, "gradients r+1 -> r"),
    (one_f_one_b_submitted, "gpipe"),
    (backward_order_differs_by_rank, "order"),
    (forgot_recv_act, "recv"),
    (stage0_receives_from_minus_one, "no neighbouring stage"),
]
