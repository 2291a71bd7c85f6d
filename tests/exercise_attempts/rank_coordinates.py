"""Attempts for rank_coordinates(rank, dp, pp, tp)."""
import itertools
from collections import namedtuple


# ---------------------------------------------------------------- correct
def modulo_mixed_radix(rank, dp, pp, tp):
    tp_i = rank % tp
    pp_i = (rank // tp) % pp
    dp_i = rank // (tp * pp)
    return (dp_i, pp_i, tp_i)


def enumerate_grid(rank, dp, pp, tp):
    """The rank-th point of the grid enumerated with tp varying fastest."""
    return list(itertools.product(range(dp), range(pp), range(tp)))[rank]


Coord = namedtuple("Coord", "dp pp tp")


def as_namedtuple(rank, dp, pp, tp):
    rest, t = divmod(rank, tp)
    d, p = divmod(rest, pp)
    return Coord(d, p, t)


def as_list(rank, dp, pp, tp):
    """A list [dp, pp, tp] instead of a tuple."""
    return [rank // (pp * tp), rank // tp % pp, rank % tp]


def as_dict(rank, dp, pp, tp):
    """Right numbers as a dict {'dp', 'pp', 'tp'} instead of the tuple (first filed as WRONG; the checker
    accepts it, and dicts are a reasonable unusual variant)."""
    rest, t = divmod(rank, tp)
    d, p = divmod(rest, pp)
    return {"dp": d, "pp": p, "tp": t}


CORRECT = [modulo_mixed_radix, enumerate_grid, as_namedtuple, as_list, as_dict]


# ---------------------------------------------------------------- wrong
def tp_outermost(rank, dp, pp, tp):
    """dp innermost, tp outermost."""
    rest, d = divmod(rank, dp)
    t, p = divmod(rest, pp)
    return (d, p, t)


def pp_innermost(rank, dp, pp, tp):
    rest, p = divmod(rank, pp)
    d, t = divmod(rest, tp)
    return (d, p, t)


def returned_in_reverse(rank, dp, pp, tp):
    rest, t = divmod(rank, tp)
    d, p = divmod(rest, pp)
    return (t, p, d)


def dp_ignores_pp(rank, dp, pp, tp):
    """dp_index = rank // tp (forgets the pp factor)."""
    return (rank // tp, (rank // tp) % pp, rank % tp)


def one_based(rank, dp, pp, tp):
    rest, t = divmod(rank, tp)
    d, p = divmod(rest, pp)
    return (d + 1, p + 1, t + 1)


def infinite_loop(rank, dp, pp, tp):
    """Searches the grid with a while loop whose counter never advances past a miss."""
    d = p = t = 0
    while (d * pp + p) * tp + t != rank:
        t += 1
        if t == tp:
            t = 0
            p += 1
            if p == pp:
                p = 0          # forgot d += 1: loops forever for ranks in dp > 0
    return (d, p, t)


WRONG = [
    (tp_outermost, "innermost"),
    (pp_innermost, "innermost"),
    (returned_in_reverse, "order"),
    (dp_ignores_pp, "pp"),
    (one_based, "0"),
    (infinite_loop, "loop"),
]
