"""Blind attempts at interleaved_schedule (written without the reference); v = 2 chunks per rank."""
from mpkit.parallel.pipeline.schedules import (Backward, Forward, OptimizerStep, RecvAct, RecvGrad, SendAct,
                                               SendGrad)

V = 2


def _wrap(order, rank, p, stage_of=None, peer=None):
    stage_of = stage_of or (lambda chunk: chunk * p + rank)
    peer = peer or (lambda s: s % p)
    last = V * p - 1
    prog = []
    for kind, mb, chunk in order:
        s = stage_of(chunk)
        if kind == "F":
            prog += ([RecvAct(mb, s, peer(s - 1))] if s > 0 else []) + [Forward(mb, s)]
            prog += [SendAct(mb, s, peer(s + 1))] if s < last else []
        else:
            prog += ([RecvGrad(mb, s, peer(s + 1))] if s < last else []) + [Backward(mb, s)]
            prog += [SendGrad(mb, s, peer(s - 1))] if s > 0 else []
    return prog + [OptimizerStep()]


def _order(rank, p, m, warmup):
    forwards = [("F", g * p + i, c) for g in range(m // p) for c in range(V) for i in range(p)]
    backwards = [("B", g * p + i, V - 1 - c) for g in range(m // p) for c in range(V) for i in range(p)]
    w = min(warmup, V * m)
    order = forwards[:w]
    for k in range(V * m - w):
        order += [forwards[w + k], backwards[k]]
    return order + backwards[V * m - w:]


def _megatron_warmup(rank, p):
    return (p - rank - 1) * 2 + (V - 1) * p


# unusual: forward and backward orders listed group by group, then zipped after the warm-up
def grouped_lists(rank, p, m):
    return _wrap(_order(rank, p, m, _megatron_warmup(rank, p)), rank, p)


# unusual: the k-th computation's micro-batch and chunk from arithmetic, instructions built inline
def arithmetic(rank, p, m):
    total = V * m
    w = min(_megatron_warmup(rank, p), total)

    def fwd(k):
        return "F", (k // (p * V)) * p + k % p, (k // p) % V

    def bwd(k):
        return "B", (k // (p * V)) * p + k % p, V - 1 - (k // p) % V

    order = [fwd(k) for k in range(w)]
    for k in range(total - w):
        order.append(fwd(w + k))
        order.append(bwd(k))
    order += [bwd(k) for k in range(total - w, total)]
    return _wrap(order, rank, p)


# wrong (more memory): looped breadth-first, every micro-batch through chunk 0, then chunk 1, then backwards
def breadth_first(rank, p, m):
    order = [("F", mb, c) for c in range(V) for mb in range(m)]
    order += [("B", mb, c) for c in reversed(range(V)) for mb in range(m)]
    return _wrap(order, rank, p)


# wrong (raises / invalid): messages to stage numbers s+1 and s-1 instead of the ranks (s+1) % p and (s-1) % p
def peers_not_wrapped(rank, p, m):
    return _wrap(_order(rank, p, m, _megatron_warmup(rank, p)), rank, p, peer=lambda s: s)


# wrong: rank r holds the contiguous stages 2r and 2r+1 instead of r and r+p
def contiguous_chunks(rank, p, m):
    return _wrap(_order(rank, p, m, _megatron_warmup(rank, p)), rank, p, stage_of=lambda c: V * rank + c,
                 peer=lambda s: s // V)


# wrong: 1F1B's warm-up (p - r - 1) kept for two chunks: too short
def plain_1f1b_warmup(rank, p, m):
    return _wrap(_order(rank, p, m, p - rank - 1), rank, p)


# wrong (raises): returns (kind, mb, stage) tuples instead of instructions
def tuples_not_instructions(rank, p, m):
    return [(k, mb, c * p + rank) for k, mb, c in _order(rank, p, m, _megatron_warmup(rank, p))]


# wrong (raises): RecvAct built without the rank it receives from
def recv_without_sender(rank, p, m):
    prog = grouped_lists(rank, p, m)
    return [RecvAct(i.mb, i.stage) if isinstance(i, RecvAct) else i for i in prog]


CORRECT = [grouped_lists, arithmetic]
WRONG = [
    (breadth_first, ("activations", "at most", "hold", "memory")),
    (peers_not_wrapped, ("% p", "modulo", "wrap", "no rank")),
    (contiguous_chunks, ("s % p", "lives on", "r + p", "r+p")),
    (plain_1f1b_warmup, ("bubble", "warm-up")),
    (tuples_not_instructions, ("instruction", "tuple")),
    (recv_without_sender, ("frm", "argument", "missing")),
]
