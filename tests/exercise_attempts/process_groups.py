"""Attempts for process_groups(dp, pp, tp)."""
import torch


# ---------------------------------------------------------------- correct
def groups_listed_in_reverse(dp, pp, tp):
    """Same groups, but each dimension's list of groups in descending order (groups are a partition)."""
    world = dp * pp * tp
    out = {"dp": {}, "pp": {}, "tp": {}}
    for r in range(world):
        rest, t = divmod(r, tp)
        d, p = divmod(rest, pp)
        out["dp"].setdefault((p, t), []).append(r)
        out["pp"].setdefault((d, t), []).append(r)
        out["tp"].setdefault((d, p), []).append(r)
    return {k: sorted(v.values(), reverse=True) for k, v in out.items()}


def tensor_transposes(dp, pp, tp):
    """torch.arange(world).reshape(dp, pp, tp), move the dimension last, flatten the rest."""
    grid = torch.arange(dp * pp * tp).reshape(dp, pp, tp)
    res = {}
    for name, axis, size in (("tp", 2, tp), ("pp", 1, pp), ("dp", 0, dp)):
        res[name] = grid.movedim(axis, -1).reshape(-1, size).tolist()
    return res


def explicit_strides(dp, pp, tp):
    """Closed-form strides: tp stride 1, pp stride tp, dp stride pp*tp."""
    world = dp * pp * tp
    return {
        "dp": [[o + i * pp * tp for i in range(dp)] for o in range(pp * tp)],
        "pp": [[b * pp * tp + t + j * tp for j in range(pp)] for b in range(dp) for t in range(tp)],
        "tp": [list(range(s, s + tp)) for s in range(0, world, tp)],
    }


def tuples_of_ranks(dp, pp, tp):
    """Each group a tuple instead of a list."""
    world = dp * pp * tp
    return {"tp": [tuple(range(s, s + tp)) for s in range(0, world, tp)],
            "pp": [tuple(b * pp * tp + t + j * tp for j in range(pp)) for b in range(dp) for t in range(tp)],
            "dp": [tuple(o + i * pp * tp for i in range(dp)) for o in range(pp * tp)]}


CORRECT = [groups_listed_in_reverse, tensor_transposes, explicit_strides, tuples_of_ranks]


# ---------------------------------------------------------------- wrong
def tp_outermost(dp, pp, tp):
    """dp innermost (consecutive), tp outermost."""
    out = {"dp": {}, "pp": {}, "tp": {}}
    for r in range(dp * pp * tp):
        rest, d = divmod(r, dp)
        t, p = divmod(rest, pp)
        out["dp"].setdefault((p, t), []).append(r)
        out["pp"].setdefault((d, t), []).append(r)
        out["tp"].setdefault((d, p), []).append(r)
    return {k: list(v.values()) for k, v in out.items()}


def dp_and_tp_swapped(dp, pp, tp):
    """Right layout, but the 'dp' and 'tp' lists are exchanged."""
    out = {"dp": {}, "pp": {}, "tp": {}}
    for r in range(dp * pp * tp):
        rest, t = divmod(r, tp)
        d, p = divmod(rest, pp)
        out["tp"].setdefault((p, t), []).append(r)
        out["pp"].setdefault((d, t), []).append(r)
        out["dp"].setdefault((d, p), []).append(r)
    return {k: list(v.values()) for k, v in out.items()}


def drops_size_one_groups(dp, pp, tp):
    """Leaves a dimension of size 1 empty instead of listing singleton groups."""
    out = {"dp": {}, "pp": {}, "tp": {}}
    for r in range(dp * pp * tp):
        rest, t = divmod(r, tp)
        d, p = divmod(rest, pp)
        out["dp"].setdefault((p, t), []).append(r)
        out["pp"].setdefault((d, t), []).append(r)
        out["tp"].setdefault((d, p), []).append(r)
    return {k: [g for g in v.values() if len(g) > 1] for k, v in out.items()}


def wrong_keys(dp, pp, tp):
    out = {"data": {}, "pipe": {}, "tensor": {}}
    for r in range(dp * pp * tp):
        rest, t = divmod(r, tp)
        d, p = divmod(rest, pp)
        out["data"].setdefault((p, t), []).append(r)
        out["pipe"].setdefault((d, t), []).append(r)
        out["tensor"].setdefault((d, p), []).append(r)
    return {k: list(v.values()) for k, v in out.items()}


def only_first_group(dp, pp, tp):
    """One group per dimension (the one containing rank 0)."""
    return {"dp": [[i * pp * tp for i in range(dp)]], "pp": [[j * tp for j in range(pp)]],
            "tp": [list(range(tp))]}


def groups_keyed_by_own_coordinate(dp, pp, tp):
    """Groups ranks that SHARE the dimension's coordinate (e.g. 'tp': same tp index) — the complement."""
    out = {"dp": {}, "pp": {}, "tp": {}}
    for r in range(dp * pp * tp):
        rest, t = divmod(r, tp)
        d, p = divmod(rest, pp)
        out["dp"].setdefault(d, []).append(r)
        out["pp"].setdefault(p, []).append(r)
        out["tp"].setdefault(t, []).append(r)
    return {k: list(v.values()) for k, v in out.items()}


WRONG = [
    (tp_outermost, "innermost"),
    (dp_and_tp_swapped, "tp groups"),
    (drops_size_one_groups, "size 1"),
    (wrong_keys, "expected a dict"),
    (only_first_group, "group"),
    (groups_keyed_by_own_coordinate, "differ"),
]
