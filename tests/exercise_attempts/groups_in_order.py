"""Attempts for groups_in_order(sizes, order)."""
import itertools

import torch


# ---------------------------------------------------------------- correct
def count_through_the_product(sizes, order):
    """itertools.product over the coordinates, outermost first: the rank counts up as it goes."""
    out = {d: {} for d in sizes}
    for rank, coords in enumerate(itertools.product(*(range(sizes[d]) for d in order))):
        c = dict(zip(order, coords))
        for d in sizes:
            out[d].setdefault(tuple(c[o] for o in order if o != d), []).append(rank)
    return {d: list(g.values()) for d, g in out.items()}


def tensor_in_order(sizes, order):
    """torch.arange(world) shaped in order; each dimension moved last and the rest flattened."""
    grid = torch.arange(sizes["dp"] * sizes["pp"] * sizes["cp"] * sizes["tp"]).reshape([sizes[d] for d in order])
    return {d: grid.movedim(order.index(d), -1).reshape(-1, sizes[d]).tolist() for d in sizes}


def strides(sizes, order):
    """Each dimension's stride is the product of the sizes inside it; groups as sets of ranks."""
    stride, step = {}, 1
    for d in reversed(order):
        stride[d], step = step, step * sizes[d]
    world = step
    out = {}
    for d in sizes:
        seen, groups = set(), []
        for r in range(world):
            if r in seen:
                continue
            base = r - ((r // stride[d]) % sizes[d]) * stride[d]
            group = tuple(base + i * stride[d] for i in range(sizes[d]))
            seen.update(group)
            groups.append(group)
        out[d] = groups
    return out


CORRECT = [count_through_the_product, tensor_in_order, strides]


# ---------------------------------------------------------------- wrong
def always_mpkits_order(sizes, order):
    return tensor_in_order(sizes, ("dp", "pp", "cp", "tp"))


def order_read_innermost_first(sizes, order):
    return tensor_in_order(sizes, tuple(reversed(order)))


def dp_and_tp_swapped(sizes, order):
    out = tensor_in_order(sizes, order)
    out["dp"], out["tp"] = out["tp"], out["dp"]
    return out


def no_cp(sizes, order):
    out = tensor_in_order(sizes, order)
    del out["cp"]
    return out


def groups_keyed_by_own_coordinate(sizes, order):
    """Ranks that SHARE the dimension's coordinate (the complement of a group)."""
    out = {d: {} for d in sizes}
    for rank, coords in enumerate(itertools.product(*(range(sizes[d]) for d in order))):
        c = dict(zip(order, coords))
        for d in sizes:
            out[d].setdefault(c[d], []).append(rank)
    return {d: list(g.values()) for d, g in out.items()}


WRONG = [
    (always_mpkits_order, "ignored order"),
    (order_read_innermost_first, "innermost first"),
    (dp_and_tp_swapped, "what you gave as"),
    (no_cp, "expected a dict"),
    (groups_keyed_by_own_coordinate, "groups expected"),
]
