"""Attempts for interleaved_schedule(rank, p, m): v = 2 chunks per rank (stages r and r+p),
graded on the bubble (p-1)/(v·m) of the ideal compute time and Megatron's activation peak."""
from mpkit.parallel.pipeline.schedules import (Backward, Forward, OptimizerStep, RecvAct, RecvGrad, SendAct,
                                               SendGrad)

V = 2


def _program(rank, p, order, peers=None):
    last = V * p - 1
    prog = []
    for kind, mb, s in order:
        if kind == "F":
            prog += ([RecvAct(mb, s, (s - 1) % p)] if s > 0 else []) + [Forward(mb, s)]
            prog += [SendAct(mb, s, (peers or {}).get(s, (s + 1) % p))] if s < last else []
        else:
            prog += ([RecvGrad(mb, s, (s + 1) % p)] if s < last else []) + [Backward(mb, s)]
            prog += [SendGrad(mb, s, (s - 1) % p)] if s > 0 else []
    return prog + [OptimizerStep()]


def _tables(rank, p, m):
    """The k-th forward and backward of this rank, as lists: groups of p micro-batches visit chunk
    0 then chunk 1 (backward: chunk 1 first)."""
    forwards, backwards = [], []
    for group in range(m // p):
        for chunk in range(V):
            forwards += [(group * p + i, chunk * p + rank) for i in range(p)]
            backwards += [(group * p + i, (V - 1 - chunk) * p + rank) for i in range(p)]
    return forwards, backwards


# ---------------------------------------------------------------- correct
def from_tables(rank, p, m):
    forwards, backwards = _tables(rank, p, m)
    warm = min(2 * (p - rank - 1) + (V - 1) * p, len(forwards))
    order = [("F", *forwards[k]) for k in range(warm)]
    for k in range(len(forwards) - warm):
        order += [("F", *forwards[warm + k]), ("B", *backwards[k])]
    return _program(rank, p, order + [("B", *b) for b in backwards[len(forwards) - warm:]])


def backward_forward_pairs(rank, p, m):
    """Counted the other way: warm-up + 1 forwards, then (B, F) pairs, then the remaining B."""
    forwards, backwards = _tables(rank, p, m)
    warm = min(2 * (p - rank - 1) + (V - 1) * p + 1, len(forwards))
    order = [("F", *forwards[k]) for k in range(warm)]
    nb = 0
    for f in forwards[warm:]:
        order += [("B", *backwards[nb]), ("F", *f)]
        nb += 1
    return _program(rank, p, order + [("B", *b) for b in backwards[nb:]])


def generators(rank, p, m):
    """Forwards and backwards drawn from two generators until both run dry."""
    def forwards():
        for k in range(V * m):
            yield (k // (p * V)) * p + k % p, ((k // p) % V) * p + rank

    def backwards():
        for k in range(V * m):
            yield (k // (p * V)) * p + k % p, (V - 1 - (k // p) % V) * p + rank
    fs, bs = forwards(), backwards()
    order = [("F", *next(fs)) for _ in range(min((p - rank - 1) * 2 + (V - 1) * p, V * m))]
    for f in fs:
        order += [("F", *f), ("B", *next(bs))]
    return _program(rank, p, order + [("B", *b) for b in bs])


CORRECT = [from_tables, backward_forward_pairs, generators]


# ---------------------------------------------------------------- wrong
def every_forward_first(rank, p, m):
    """Megatron's forward order, but all forwards before any backward (GPipe on chunks)."""
    forwards, backwards = _tables(rank, p, m)
    return _program(rank, p, [("F", *f) for f in forwards] + [("B", *b) for b in backwards])


def looped_chunk_by_chunk(rank, p, m):
    """Every micro-batch through chunk 0 before any through chunk 1 (looped BFS)."""
    order = [("F", mb, c * p + rank) for c in range(V) for mb in range(m)]
    return _program(rank, p, order + [("B", mb, c * p + rank) for c in (1, 0) for mb in range(m)])


def chunk1_sent_to_rank_p(rank, p, m):
    """The last rank sends stage p-1's activation to 'rank p' instead of round to rank 0."""
    order = []
    forwards, backwards = _tables(rank, p, m)
    warm = min(2 * (p - rank - 1) + (V - 1) * p, len(forwards))
    order = [("F", *forwards[k]) for k in range(warm)]
    for k in range(len(forwards) - warm):
        order += [("F", *forwards[warm + k]), ("B", *backwards[k])]
    order += [("B", *b) for b in backwards[len(forwards) - warm:]]
    return _program(rank, p, order, peers={p - 1: p})


def one_f_one_b_warmup(rank, p, m):
    """1F1B's warm-up (p-r-1 forwards) on the interleaved order: the lists cannot run."""
    forwards, backwards = _tables(rank, p, m)
    warm = min(p - rank - 1, len(forwards))
    order = [("F", *forwards[k]) for k in range(warm)]
    for k in range(len(forwards) - warm):
        order += [("F", *forwards[warm + k]), ("B", *backwards[k])]
    return _program(rank, p, order + [("B", *b) for b in backwards[len(forwards) - warm:]])


def stages_numbered_per_rank(rank, p, m):
    """Chunk 1 of rank r called stage 2r+1 (contiguous per rank) instead of r+p."""
    order = [("F", mb, 2 * rank + c) for mb in range(m) for c in range(V)]
    return _program(rank, p, order + [("B", mb, 2 * rank + c) for mb in range(m) for c in (1, 0)])


WRONG = [
    (every_forward_first, "activations"),
    (looped_chunk_by_chunk, "activations"),
    (chunk1_sent_to_rank_p, "goes to or comes from rank 0"),
    (one_f_one_b_warmup, "warm-up"),
    (stages_numbered_per_rank, "holds stages"),
]
