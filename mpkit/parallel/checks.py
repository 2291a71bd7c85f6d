"""What every mechanism checks about its process group and its replicas, and the one broadcast
that makes replicas equal: shared by ``DataParallel``, ``ShardedOptimizer`` and context
parallelism, kept out of their files so each reads as its algorithm.

A check here names the problem and the fix, and raises on every rank alike (no rank left waiting
in a collective while another failed).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from mpkit.observe import active


def require_process_group(what: str) -> None:
    if not dist.is_initialized():
        raise RuntimeError(f"{what} needs a process group: run inside mpkit.launch, torchrun, or after "
                           f"torch.distributed.init_process_group(...)")


def global_rank(group, rank: int) -> int:
    """The global rank of ``group``'s member ``rank`` (what ``src=``/``dst=`` take)."""
    return rank if group is None or group is dist.group.WORLD else dist.get_global_rank(group, rank)


def group_ranks(group):
    """(this rank in ``group``, the group's size, the global rank of its first member)."""
    return dist.get_rank(group), dist.get_world_size(group), global_rank(group, 0)


def trainable_parameters(module: nn.Module, what: str) -> list[nn.Parameter]:
    """The parameters that need a gradient, each once; a clear error when there are none."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError(f"{what}: the module has no trainable parameters (every parameter has "
                         f"requires_grad=False); there is nothing to synchronise")
    return params


# Parameters whose gradients are split over the ranks of a world (a pipeline's stages: each rank holds
# others), by that world's size: a check of their gradients on one rank alone sees only its share.
_SPLIT_GRADIENTS = WeakIdKeyDictionary()  # by identity: a tensor's == is elementwise


def mark_split_gradients(params, world_size: int) -> None:
    """Record that ``params``' gradients are one rank's share of a world of ``world_size`` ranks."""
    for p in params:
        _SPLIT_GRADIENTS[p] = world_size


def split_gradients_world(params) -> int:
    """The largest world any of ``params``' gradients are split over (1: each rank holds them all)."""
    return max((_SPLIT_GRADIENTS.get(p, 1) for p in params), default=1)


def broadcast_module(module: nn.Module, group=None, parameters: bool = True, buffers: bool = True) -> None:
    """Every parameter and buffer of ``module`` from the group's first rank (replicas start equal);
    ``parameters=False``: just the buffers (BatchNorm's running statistics, before a forward).
    Coalesced as DDP's ``_broadcast_coalesced``: one broadcast per dtype (per 250 MiB), however
    many tensors the module has (``Comm.broadcast_coalesced``)."""
    tensors = [*(module.parameters() if parameters else ()), *(module.buffers() if buffers else ())]
    if not tensors:
        return
    what = "parameters and buffers" if parameters and buffers else "parameters" if parameters else "buffers"
    with torch.no_grad():
        active.comm().broadcast_coalesced([t.detach() for t in tensors], src=group_ranks(group)[2], group=group,
                                          name=what)


def check_same_model(module: nn.Module, group, what: str, buffers: bool = False) -> None:
    """Every rank's replica must have the same parameters, in the same order and under the same
    names: a rank that built another model (a size read from its rank, layers of one shape
    assigned in another order) would receive the first rank's values into mismatched tensors, or
    into other layers, silently. DDP's check at construction (torch 2.13
    ``_verify_param_shape_across_processes`` -> ``dist._verify_params_across_processes``) compares
    the parameter count, then each parameter's sizes and strides with rank 0's; buffers are not
    compared. Here buffers are, with ``buffers=True`` (``broadcast_buffers=True``: broadcast
    coalesced, a mismatch would mix values across buffers; with False they may differ). Here the
    dtypes too (DDP does not: a float64 replica would receive float32 bytes), every parameter (the
    frozen ones are broadcast as well; DDP checks those that require grad), and the error is
    raised on every rank (DDP's only on the rank that differs, while the others wait) and names
    the rank and the parameter. Two small untraced all-gathers (record lengths, then the records)."""
    named = list(module.named_parameters())
    if buffers:  # they will be broadcast coalesced: a mismatch would mix values across buffers silently
        named += [(f"buffer {name}", b) for name, b in module.named_buffers()]
    check_same_tensors(named, group, what)


def check_same_tensors(named: list, group, what: str) -> None:
    """``check_same_model``'s comparison of any ``[(name, tensor), ...]`` across the group's ranks
    (a ``ShardedOptimizer``'s parameters, which need not come from one module)."""
    replicas = _gather_records(named, group)
    first = replicas[0]
    for rank, theirs in enumerate(replicas[1:], 1):
        _check_shapes(first, theirs, rank, what)
        _check_names(first, theirs, rank, what)
        _check_count(first, theirs, rank, what)


_HINT = "; build the same model on every rank (same sizes, same dtype, same seed)"
_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)  # same on every rank


def _gather_records(named: list, group) -> list[list[tuple]]:
    """Every rank's ``[(name, shape, stride, dtype), ...]``, group rank order, untraced."""
    device = named[0][1].device if named else torch.device("cpu")
    mine = [x for name, p in named for x in _param_record(name, p)]
    world = dist.get_world_size(group)
    sizes = [torch.empty(2, dtype=torch.int64, device=device) for _ in range(world)]
    with active.quiet():
        active.comm().all_gather(sizes, torch.tensor([len(named), len(mine)], dtype=torch.int64, device=device),
                                 group=group)
        counts, lengths = zip(*(s.tolist() for s in sizes))
        padded = torch.zeros(max(lengths), dtype=torch.int64, device=device)
        padded[:len(mine)] = torch.tensor(mine, dtype=torch.int64)
        every = [torch.empty_like(padded) for _ in range(world)]
        active.comm().all_gather(every, padded, group=group)
    return [_decode_records(t.tolist(), n) for t, n in zip(every, counts)]


def _param_record(name: str, p: torch.Tensor) -> list[int]:
    """What DDP compares of a parameter, and its dtype and name: [dtype, ndim, *sizes, *strides, len, *name]."""
    encoded = name.encode()
    return [_DTYPES.index(p.dtype), p.dim(), *p.shape, *p.stride(), len(encoded), *encoded]


def _decode_records(flat: list[int], count: int) -> list[tuple]:
    records, i = [], 0
    for _ in range(count):
        dtype, ndim = _DTYPES[flat[i]], flat[i + 1]
        shape, stride = tuple(flat[i + 2:i + 2 + ndim]), tuple(flat[i + 2 + ndim:i + 2 + 2 * ndim])
        i += 2 + 2 * ndim
        name = bytes(flat[i + 1:i + 1 + flat[i]]).decode()
        records.append((name, shape, stride, dtype))
        i += 1 + flat[i]
    return records


def _described(record, other) -> str:
    _, shape, stride, dtype = record
    text = f"shape {shape}, dtype {str(dtype).removeprefix('torch.')}"
    return text + (f", strides {stride}" if shape == other[1] and stride != other[2] else "")


def _check_shapes(first, theirs, rank, what) -> None:
    for ours, their in zip(first, theirs):
        if ours[1:] != their[1:]:
            there = "" if ours[0] == their[0] else f" (there named {ours[0]!r})"
            raise ValueError(f"{what}: the replicas differ: parameter {their[0]!r} has {_described(their, ours)} "
                             f"on group rank {rank}, but {_described(ours, their)} on group rank 0{there}{_HINT}")


def _check_names(first, theirs, rank, what) -> None:
    for k, (ours, their) in enumerate(zip(first, theirs)):
        # same shapes, another name in this place: layers registered in another order (or another
        # model of the same shapes); rank 0's values would land in other layers of this rank
        if ours[0] != their[0]:
            raise ValueError(f"{what}: the replicas differ: parameter tensor {k} is {their[0]!r} on group rank "
                             f"{rank} but {ours[0]!r} on group rank 0 (same shape): the ranks registered their "
                             f"layers in another order or under other names, so each would train another "
                             f"function; build the model with the same code on every rank, assigning its "
                             f"submodules in the same order")


def _check_count(first, theirs, rank, what) -> None:
    if len(theirs) != len(first):
        more, less, extra = (rank, 0, theirs) if len(theirs) > len(first) else (0, rank, first)
        name = extra[min(len(first), len(theirs))][0]
        raise ValueError(f"{what}: the replicas differ: group rank {rank} has {len(theirs)} parameter tensors, "
                         f"group rank 0 has {len(first)}: group rank {more}'s parameter {name!r} has no "
                         f"counterpart on group rank {less}{_HINT}")


def check_agree(values: dict, group, what: str, fix: str, shown: dict | None = None, device=None) -> None:
    """Every rank of ``group`` must pass the same ``values`` ({what it is: int}), such as the
    sizes a collective is about to exchange: gloo aborts the process (SIGABRT) when two ranks post
    messages of different sizes, and a flag that differs (a split, a causal mask) computes another
    function on each rank, silently. One small untraced all-gather; a ValueError on every rank
    naming the ranks and their values (``shown[name](value)`` displays a coded value). ``device``:
    where the collective's tensor lives (a CUDA device under NCCL)."""
    names = list(values)
    mine = torch.tensor([int(values[n]) for n in names], dtype=torch.int64, device=device)
    if dist.get_world_size(group) == 1:
        return
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    with active.quiet():
        active.comm().all_gather(every, mine, group=group)
    table = torch.stack(every)
    for k, name in enumerate(names):
        column = table[:, k].tolist()
        if len(set(column)) > 1:
            show = (shown or {}).get(name, str)
            per_rank = ", ".join(f"group rank {r} has {show(v)}" for r, v in enumerate(column))
            raise ValueError(f"{what}: the ranks disagree on the {name}: {per_rank}; {fix}")


def check_same_values(module: nn.Module, group, what: str, fix: str) -> None:
    """Every rank's ``module`` must hold the same values (replicas built from one seed): two
    checksums of all its parameters and buffers (the sum, and the sum weighted by position, so a
    permutation shows too), one small untraced all-gather; a ValueError on every rank naming the
    first rank that differs."""
    flat = [t.detach().double().reshape(-1) for t in (*module.parameters(), *module.buffers())]
    values = torch.cat(flat) if flat else torch.zeros(1, dtype=torch.float64)
    weights = torch.arange(1, values.numel() + 1, dtype=values.dtype, device=values.device)
    mine = torch.stack([values.sum(), (values * weights).sum()])
    if dist.get_world_size(group) == 1:
        return
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    with active.quiet():
        active.comm().all_gather(every, mine, group=group)
    differ = [r for r, theirs in enumerate(every) if not torch.equal(theirs, every[0])]
    if differ:
        raise ValueError(f"{what}: the replicas hold different values (group rank {differ[0]} differs from group "
                         f"rank 0), so the ranks would train parts of different models; {fix}")


def check_same_shape(x: torch.Tensor, group, what: str, fix: str) -> None:
    """``check_agree`` on a tensor's dtype and shape (up to 8 dimensions): what a collective over
    it needs from every rank."""
    values = {"dtype": _DTYPES.index(x.dtype), "number of dimensions": x.dim()}
    values.update({f"size of dimension {d}": x.shape[d] if d < x.dim() else -1 for d in range(8)})
    check_agree(values, group, what, fix, {"dtype": lambda i: str(_DTYPES[i]).removeprefix("torch.")}, x.device)
