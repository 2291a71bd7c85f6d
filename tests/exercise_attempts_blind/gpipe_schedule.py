"""Blind attempts at gpipe_schedule (written without the reference)."""
from mpkit.parallel.pipeline.schedules import (Backward, Forward, OptimizerStep, RecvAct, RecvGrad, SendAct,
                                               SendGrad)
from mpkit.parallel.pipeline import schedules


def _forward(mb, s, p):
    return ([RecvAct(mb, s, s - 1)] if s > 0 else []) + [Forward(mb, s)] + ([SendAct(mb, s, s + 1)] if s < p - 1 else [])


def _backward(mb, s, p):
    return ([RecvGrad(mb, s, s + 1)] if s < p - 1 else []) + [Backward(mb, s)] + ([SendGrad(mb, s, s - 1)] if s > 0 else [])


# unusual: the drain runs the micro-batches backwards (m-1 first), as the last forward's is ready first
def drain_in_reverse(rank, p, m):
    prog = []
    for mb in range(m):
        prog += _forward(mb, rank, p)
    for mb in reversed(range(m)):
        prog += _backward(mb, rank, p)
    return prog + [OptimizerStep()]


# unusual: keyword arguments, one comprehension per phase, flattened with sum()
def keyword_comprehensions(rank, p, m):
    first, last = rank == 0, rank == p - 1

    def fwd(mb):
        return (([] if first else [RecvAct(mb=mb, stage=rank, frm=rank - 1)]) + [Forward(mb=mb, stage=rank)]
                + ([] if last else [SendAct(mb=mb, stage=rank, to=rank + 1)]))

    def bwd(mb):
        return (([] if last else [RecvGrad(mb=mb, stage=rank, frm=rank + 1)]) + [Backward(mb=mb, stage=rank)]
                + ([] if first else [SendGrad(mb=mb, stage=rank, to=rank - 1)]))

    return sum([fwd(mb) for mb in range(m)], []) + sum([bwd(mb) for mb in range(m)], []) + [OptimizerStep()]


# wrong: forgets the OptimizerStep at the end
def no_optimizer_step(rank, p, m):
    return drain_in_reverse(rank, p, m)[:-1]


# wrong: the Backwards never wait for their gradient (no RecvGrad)
def no_recv_grad(rank, p, m):
    prog = [i for i in drain_in_reverse(rank, p, m) if not isinstance(i, RecvGrad)]
    return prog


# wrong (wasteful): each micro-batch's forward then at once its backward: valid, but no pipelining (bubble)
def forward_backward_each(rank, p, m):
    prog = []
    for mb in range(m):
        prog += _forward(mb, rank, p) + _backward(mb, rank, p)
    return prog + [OptimizerStep()]


# wrong: micro-batches numbered 1..m
def one_based_micro_batches(rank, p, m):
    prog = []
    for mb in range(1, m + 1):
        prog += _forward(mb, rank, p)
    for mb in range(1, m + 1):
        prog += _backward(mb, rank, p)
    return prog + [OptimizerStep()]


# wrong: the last stage also sends its activation on, to a stage p that does not exist
def last_stage_sends_on(rank, p, m):
    prog = []
    for mb in range(m):
        prog += ([RecvAct(mb, rank, rank - 1)] if rank > 0 else []) + [Forward(mb, rank), SendAct(mb, rank, rank + 1)]
    for mb in range(m):
        prog += _backward(mb, rank, p)
    return prog + [OptimizerStep()]


# wrong (raises): forgot the m argument
def takes_two_arguments(rank, p):
    return drain_in_reverse(rank, p, 4)


# wrong: copies mpkit's own GPipe instead of writing it
def calls_mpkit(rank, p, m):
    return schedules.gpipe(p, m)[rank]


CORRECT = [drain_in_reverse, keyword_comprehensions]
WRONG = [
    (no_optimizer_step, ("optimizerstep", "optimizer")),
    (no_recv_grad, ("recvgrad",)),
    (forward_backward_each, ("bubble", "every forward", "all forwards")),
    (one_based_micro_batches, ("micro-batch", "0..m-1", "range")),
    (last_stage_sends_on, ("last stage", "stage p", "no stage", "does not exist")),
    (takes_two_arguments, ("signature", "argument", "(rank, p, m)")),
    (calls_mpkit, ("mpkit", "own")),
]
