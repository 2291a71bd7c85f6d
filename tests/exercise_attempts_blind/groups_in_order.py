"""Blind attempts (blind-b) at groups_in_order: written from the stub and hints only."""
import torch


def _strides(sizes, order):
    stride, s = {}, 1
    for d in reversed(order):
        stride[d] = s
        s *= sizes[d]
    return stride, s


# correct, unusual: coordinates by stride and modulo, then group by the other coordinates
def by_stride(sizes, order):
    stride, world = _strides(sizes, order)
    out = {}
    for d in sizes:
        groups = {}
        for r in range(world):
            key = tuple((r // stride[e]) % sizes[e] for e in order if e != d)
            groups.setdefault(key, []).append(r)
        out[d] = list(groups.values())
    return out


# correct, unusual: a torch grid in the given order, each dimension moved last and flattened
def torch_grid(sizes, order):
    grid = torch.arange(torch.tensor([sizes[d] for d in order]).prod().item()).reshape([sizes[d] for d in order])
    return {d: grid.movedim(order.index(d), -1).reshape(-1, sizes[d]).tolist() for d in sizes}


# mistake: ignores order and always uses mpkit's ('dp', 'pp', 'cp', 'tp')
def ignore_order(sizes, order):
    return by_stride(sizes, ("dp", "pp", "cp", "tp"))


# mistake: reads order innermost first (the first dimension changes fastest)
def innermost_first(sizes, order):
    return by_stride(sizes, tuple(reversed(order)))


# mistake: leaves out the cp dimension's groups
def no_cp(sizes, order):
    g = by_stride(sizes, order)
    del g["cp"]
    return g


# mistake (raises): treats sizes as a list indexed by position
def sizes_by_position(sizes, order):
    world = sizes[0] * sizes[1] * sizes[2] * sizes[3]
    return by_stride(dict(zip(order, sizes)), order) if world else {}


CORRECT = [by_stride, torch_grid]
WRONG = [
    (ignore_order, ("order", "megatron", "outermost")),
    (innermost_first, ("innermost", "outermost", "reversed", "fastest")),
    (no_cp, ("cp", "missing", "key")),
    (sizes_by_position, ("keyerror", "dict", "sizes[")),
]
