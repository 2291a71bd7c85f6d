"""Blind attempts (blind-b) at process_groups: written from the stub and hints only."""
import torch


# correct, unusual: explicit strides (tp consecutive, pp steps by tp, dp steps by pp*tp)
def strides(dp, pp, tp):
    world = dp * pp * tp
    tp_groups = [list(range(s, s + tp)) for s in range(0, world, tp)]
    pp_groups = [[d * pp * tp + p * tp + t for p in range(pp)] for d in range(dp) for t in range(tp)]
    dp_groups = [[d * pp * tp + p * tp + t for d in range(dp)] for p in range(pp) for t in range(tp)]
    return {"dp": dp_groups, "pp": pp_groups, "tp": tp_groups}


# correct, unusual: a torch grid, the dimension moved last and flattened
def torch_grid(dp, pp, tp):
    grid = torch.arange(dp * pp * tp).reshape(dp, pp, tp)
    out = {}
    for axis, name in enumerate(("dp", "pp", "tp")):
        n = grid.shape[axis]
        out[name] = grid.movedim(axis, -1).reshape(-1, n).tolist()
    return out


# mistake: dp groups taken as consecutive ranks (dp treated as innermost)
def dp_consecutive(dp, pp, tp):
    world = dp * pp * tp
    dp_groups = [list(range(s, s + dp)) for s in range(0, world, dp)]
    g = strides(dp, pp, tp)
    return {"dp": dp_groups, "pp": g["pp"], "tp": g["tp"]}


# mistake: a dimension of size 1 gets no groups at all (every rank is its own group)
def drop_size_one(dp, pp, tp):
    g = strides(dp, pp, tp)
    return {k: (v if len(v[0]) > 1 else []) for k, v in g.items()}


# mistake: a dp group holds every rank with the same tp index (differs in pp too)
def dp_ignores_pp(dp, pp, tp):
    world = dp * pp * tp
    g = strides(dp, pp, tp)
    g["dp"] = [list(range(t, world, tp)) for t in range(tp)]
    return g


# mistake (raises): wrong signature, takes a sizes dict
def sizes_dict(sizes):
    return strides(sizes["dp"], sizes["pp"], sizes["tp"])


CORRECT = [strides, torch_grid]
WRONG = [
    (dp_consecutive, ("dp", "stride", "step", "consecutive", "pp·tp", "pp*tp")),
    (drop_size_one, ("size 1", "singleton", "own group", "every rank", "missing")),
    (dp_ignores_pp, ("only in", "differ", "other two", "other coordinates")),
    (sizes_dict, ("argument", "signature", "positional", "typeerror")),
]
