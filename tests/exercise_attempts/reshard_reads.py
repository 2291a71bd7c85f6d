"""Attempts for reshard_reads(numel, saved_ranks, new_ranks)."""


def _bounds(numel, ranks):
    base, extra = divmod(numel, ranks)
    out, start = [], 0
    for r in range(ranks):
        stop = start + base + (1 if r < extra else 0)
        out.append((start, stop))
        start = stop
    return out


# ---------------------------------------------------------------- correct
def two_pointer_sweep(numel, saved_ranks, new_ranks):
    """Walk both boundary lists at once, as a merge."""
    saved, new = _bounds(numel, saved_ranks), _bounds(numel, new_ranks)
    out, i = [], 0
    for lo, hi in new:
        reads = []
        while i < len(saved) and saved[i][1] <= lo:
            i += 1
        j = i
        while j < len(saved) and saved[j][0] < hi:
            reads.append([j, max(saved[j][0], lo), min(saved[j][1], hi)])  # lists, not tuples
            j += 1
        out.append(reads)
    return out


def element_by_element(numel, saved_ranks, new_ranks):
    """Who owns each element, then runs of the same owner inside each new range."""
    owner = [r for r, (a, b) in enumerate(_bounds(numel, saved_ranks)) for _ in range(a, b)]
    out = []
    for lo, hi in _bounds(numel, new_ranks):
        reads = []
        for e in range(lo, hi):
            if reads and reads[-1][0] == owner[e]:
                reads[-1] = (owner[e], reads[-1][1], e + 1)
            else:
                reads.append((owner[e], e, e + 1))
        out.append(tuple(reversed(reads)))  # any order
    return out


CORRECT = [two_pointer_sweep, element_by_element]


# ---------------------------------------------------------------- wrong
def whole_saved_chunks(numel, saved_ranks, new_ranks):
    saved = _bounds(numel, saved_ranks)
    return [[(r, a, b) for r, (a, b) in enumerate(saved) if a < hi and lo < b] for lo, hi in _bounds(numel, new_ranks)]


def inclusive_stop(numel, saved_ranks, new_ranks):
    saved = _bounds(numel, saved_ranks)
    return [[(r, max(a, lo), min(b, hi) - 1) for r, (a, b) in enumerate(saved) if max(a, lo) < min(b, hi)]
            for lo, hi in _bounds(numel, new_ranks)]


def floor_division_bounds(numel, saved_ranks, new_ranks):
    def bounds(ranks):
        k = numel // ranks
        return [(r * k, numel if r == ranks - 1 else (r + 1) * k) for r in range(ranks)]
    saved = bounds(saved_ranks)
    return [[(r, max(a, lo), min(b, hi)) for r, (a, b) in enumerate(saved) if max(a, lo) < min(b, hi)]
            for lo, hi in bounds(new_ranks)]


def touching_counts_as_overlap(numel, saved_ranks, new_ranks):
    saved = _bounds(numel, saved_ranks)
    return [[(r, max(a, lo), min(b, hi)) for r, (a, b) in enumerate(saved) if max(a, lo) <= min(b, hi)]
            for lo, hi in _bounds(numel, new_ranks)]


def one_list_for_all(numel, saved_ranks, new_ranks):
    saved = _bounds(numel, saved_ranks)
    return [(r, a, b) for r, (a, b) in enumerate(saved)]


WRONG = [
    (whole_saved_chunks, "overlap"),
    (inclusive_stop, "half-open"),
    (floor_division_bounds, "tensor_split"),
    (touching_counts_as_overlap, "expected"),
    (one_list_for_all, "per new rank"),
]
