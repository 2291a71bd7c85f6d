"""Blind attempts (blind-b) at reshard_reads: written from the stub and hints only."""


def _bounds(numel, n):
    q, extra = divmod(numel, n)
    out, start = [], 0
    for r in range(n):
        stop = start + q + (1 if r < extra else 0)
        out.append((start, stop))
        start = stop
    return out


# correct, unusual: a two-pointer sweep over both lists of bounds
def sweep(numel, saved_ranks, new_ranks):
    old, new = _bounds(numel, saved_ranks), _bounds(numel, new_ranks)
    reads = [[] for _ in new]
    i = j = 0
    while i < len(old) and j < len(new):
        lo, hi = max(old[i][0], new[j][0]), min(old[i][1], new[j][1])
        if lo < hi:
            reads[j].append((i, lo, hi))
        if old[i][1] <= new[j][1]:
            i += 1
        else:
            j += 1
    return reads


# correct, unusual: bounds from torch's own tensor_split sizes, tuples of lists
def torch_sizes(numel, saved_ranks, new_ranks):
    import torch

    def bounds(n):
        sizes = [len(c) for c in torch.empty(numel, dtype=torch.uint8).tensor_split(n)]
        starts = [sum(sizes[:r]) for r in range(n)]
        return [(s, s + z) for s, z in zip(starts, sizes)]
    old = bounds(saved_ranks)
    return [[(r, max(a, lo), min(b, hi)) for r, (a, b) in enumerate(old) if max(a, lo) < min(b, hi)]
            for lo, hi in bounds(new_ranks)]


def _reads(old, new, keep_empty=False, local=False):
    return [[(r, (max(a, lo) - a) if local else max(a, lo), (min(b, hi) - a) if local else min(b, hi))
             for r, (a, b) in enumerate(old) if keep_empty or max(a, lo) < min(b, hi)] for lo, hi in new]


# mistake: numel // n per rank and the remainder on the last rank (not tensor_split's split)
def remainder_last(numel, saved_ranks, new_ranks):
    def b(n):
        q = numel // n
        return [(r * q, numel if r == n - 1 else (r + 1) * q) for r in range(n)]
    return _reads(b(saved_ranks), b(new_ranks))


# mistake: ceil-sized chunks (torch.chunk's split, not tensor_split's)
def chunk_split(numel, saved_ranks, new_ranks):
    def b(n):
        q = -(-numel // n)
        return [(min(r * q, numel), min((r + 1) * q, numel)) for r in range(n)]
    return _reads(b(saved_ranks), b(new_ranks))


# mistake: offsets local to the saved chunk instead of global ranges
def local_offsets(numel, saved_ranks, new_ranks):
    return _reads(_bounds(numel, saved_ranks), _bounds(numel, new_ranks), local=True)


# mistake: keeps empty overlaps (start == stop or start > stop) as reads
def keep_empty(numel, saved_ranks, new_ranks):
    return _reads(_bounds(numel, saved_ranks), _bounds(numel, new_ranks), keep_empty=True)


# mistake (raises): saved ranks numbered from 1 (IndexError on the last one)
def ranks_from_one(numel, saved_ranks, new_ranks):
    old, new = _bounds(numel, saved_ranks), _bounds(numel, new_ranks)
    out = []
    for lo, hi in new:
        row = []
        for r in range(1, saved_ranks + 1):
            a, b = old[r]
            if max(a, lo) < min(b, hi):
                row.append((r, max(a, lo), min(b, hi)))
        out.append(row)
    return out


CORRECT = [sweep, torch_sizes]
WRONG = [
    (remainder_last, ("tensor_split", "uneven", "remainder", "divide")),
    (chunk_split, ("tensor_split", "chunk", "uneven")),
    (local_offsets, ("global", "local", "offset")),
    (keep_empty, ("empty", "zero-length", "overlap")),
    (ranks_from_one, ("indexerror", "out of range", "raised")),
]
