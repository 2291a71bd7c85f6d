"""Blind attempts (blind-b) at rank_coordinates: written from the stub and hints only."""


# correct, unusual: modulo / floor-division per dimension instead of divmod
def mod_div(rank, dp, pp, tp):
    return rank // (pp * tp), (rank // tp) % pp, rank % tp


# correct, unusual: enumerate the grid in row-major order (itertools.product) and index it
def enumerate_grid(rank, dp, pp, tp):
    import itertools
    return list(itertools.product(range(dp), range(pp), range(tp)))[rank]


# mistake: dp taken as the innermost (fastest) dimension instead of tp
def dp_innermost(rank, dp, pp, tp):
    return rank % dp, (rank // dp) % pp, rank // (dp * pp)


# mistake: returns the coordinates in (tp, pp, dp) order
def reversed_tuple(rank, dp, pp, tp):
    rest, t = divmod(rank, tp)
    d, p = divmod(rest, pp)
    return t, p, d


# mistake: pp_index without the modulo, so it runs past pp on dp > 1
def pp_no_modulo(rank, dp, pp, tp):
    return rank // (pp * tp), rank // tp, rank % tp


# mistake (raises): off-by-one rank index into the enumerated grid (IndexError on the last rank)
def off_by_one(rank, dp, pp, tp):
    import itertools
    return list(itertools.product(range(dp), range(pp), range(tp)))[rank + 1]


CORRECT = [mod_div, enumerate_grid]
WRONG = [
    (dp_innermost, ("innermost", "fastest", "adjacent")),
    (reversed_tuple, ("order", "(dp_index, pp_index, tp_index)", "swapped")),
    (pp_no_modulo, ("pp_index", "out of range", "range", "modulo")),
    (off_by_one, ("indexerror", "out of range", "raised")),
]
