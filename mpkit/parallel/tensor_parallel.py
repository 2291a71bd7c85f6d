"""Megatron-LM tensor parallelism on any module: two communication functions, two layers, and
``tensor_parallel(module, plan)`` that swaps named ``nn.Linear`` layers for their slices.

The whole trick of Megatron's MLP/attention split is two conjugate operators (Shoeybi et al. 2019):

- ``f`` = ``CopyToParallelRegion``: identity forward, all-reduce backward. It sits in front of a
  column-parallel layer: every rank reads the same input, so the input's gradient is the SUM of
  the partial gradients each rank's slice of the weight contributes.
- ``g`` = ``ReduceFromParallelRegion``: all-reduce forward, identity backward. It sits after a
  row-parallel layer: each rank holds a partial sum of the output; the sum is the real output,
  and its gradient is the same on every rank, so it passes through unchanged.

A column-parallel layer followed by a row-parallel one therefore costs one all-reduce forward (g)
and one backward (f), whatever lies between them, as long as it is elementwise (ReLU, GeLU) or
independent per attention head. Each all-reduce goes through ``mpkit.observe.active.comm()``, so
inside ``mpkit.launch`` it is a traced event and elsewhere a plain ``torch.distributed`` call.

Everything else (embeddings, LayerNorms, biases after a row-parallel layer) stays replicated:
those parameters see identical inputs and output gradients on every rank, so their gradients
agree without any extra communication.
"""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mpkit.observe import active


class CopyToParallelRegion(torch.autograd.Function):
    """f: identity forward, all-reduce (sum) of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group, name):
        ctx.group, ctx.name = group, name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        active.comm().all_reduce(grad, group=ctx.group, name=f"f backward {ctx.name}")
        return grad, None, None


class ReduceFromParallelRegion(torch.autograd.Function):
    """g: all-reduce (sum) of the partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group, name):
        out = x.contiguous().clone()  # all_reduce is in place; never modify an autograd input
        active.comm().all_reduce(out, group=group, name=f"g forward {name}")
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def copy_to_parallel_region(x, group=None, name=""):
    return CopyToParallelRegion.apply(x, group, name)


def reduce_from_parallel_region(x, group=None, name=""):
    return ReduceFromParallelRegion.apply(x, group, name)


def contiguous_split(size: int, parts: int) -> list[torch.Tensor]:
    """Rank r owns indices [r·size/parts, (r+1)·size/parts)."""
    return list(torch.arange(size).chunk(parts))


def head_split(hidden: int, parts: int) -> list[torch.Tensor]:
    """Rows of a fused qkv weight (3·hidden, hidden) that belong to each rank's attention heads.

    A model that views qkv's output as (3, heads, head_dim) has row ``j·hidden + h·head_dim + d``
    in part j (q, k or v) of head h. Rank r owns heads [r·heads/parts, (r+1)·heads/parts), i.e. the
    same block of rows inside each of the q, k and v thirds; taken in this order, its local output
    views as (3, heads/parts, head_dim) just like the full one.
    """
    per_rank = hidden // parts
    return [torch.cat([j * hidden + r * per_rank + torch.arange(per_rank) for j in range(3)])
            for r in range(parts)]


class _ShardedLinear(nn.Module):
    """A slice of a full ``nn.Linear``: the output rows (column-parallel) or input columns
    (row-parallel) listed in ``indices[rank]``. Keeping every rank's index list lets ``gather``
    put the shards back into the full layer's layout."""

    dim: int  # the weight dimension that is split: 0 = output features, 1 = input features

    def __init__(self, full: nn.Linear, group=None, indices=None, *, rank=None, world_size=None, name=""):
        super().__init__()
        if not isinstance(full, nn.Linear):
            raise TypeError(f"{type(self).__name__} slices an nn.Linear; {name or 'the layer'} is a "
                            f"{type(full).__name__}")
        self.group = group
        self.rank = dist.get_rank(group) if rank is None else rank
        world_size = dist.get_world_size(group) if world_size is None else world_size
        size = full.weight.shape[self.dim]
        if indices is None:
            if size % world_size:
                what = "out_features" if self.dim == 0 else "in_features"
                raise ValueError(f"layer {name or '?'}: tp size {world_size} does not divide {what}={size}; use a "
                                 f"tensor-parallel size that divides {size}")
            indices = contiguous_split(size, world_size)
        self.indices, self.name = list(indices), name
        own = self.indices[self.rank]
        # a frozen layer stays frozen: its slices are new Parameters, which would default to trainable
        self.weight = nn.Parameter(full.weight.detach().index_select(self.dim, own), full.weight.requires_grad)
        self.full_shapes = {"weight": tuple(full.weight.shape)}
        if full.bias is not None:
            bias = full.bias.detach()
            self.bias = nn.Parameter(bias.index_select(0, own) if self.dim == 0 else bias.clone(),
                                     full.bias.requires_grad)
            self.full_shapes["bias"] = tuple(bias.shape)
        else:
            self.bias = None

    def sharded(self, param_name: str) -> bool:
        return param_name == "weight" or self.dim == 0

    def gather(self, param_name: str) -> torch.Tensor:
        """The full tensor of ``weight``/``bias`` in the original layer's layout (a collective)."""
        local = getattr(self, param_name).detach()
        if not self.sharded(param_name):
            return local.clone()
        shards = [torch.empty_like(local) for _ in self.indices]
        active.comm().all_gather(shards, local.contiguous(), group=self.group, name=f"gather {self.name}.{param_name}")
        full = torch.empty(self.full_shapes[param_name], dtype=local.dtype, device=local.device)
        dim = self.dim if param_name == "weight" else 0
        for idx, shard in zip(self.indices, shards):
            full.index_copy_(dim, idx.to(full.device), shard)
        return full

    def extra_repr(self) -> str:
        return f"{self.name}: rank {self.rank} of {len(self.indices)}, weight {tuple(self.weight.shape)}"


class ColumnParallelLinear(_ShardedLinear):
    """Y_i = X · A_iᵀ + b_i: this rank's output features. Its input goes through f first."""

    dim = 0

    def forward(self, x):
        return F.linear(copy_to_parallel_region(x, self.group, self.name), self.weight, self.bias)


class RowParallelLinear(_ShardedLinear):
    """Y = g(Σ_i X_i · A_iᵀ) + b: this rank's input features; the bias is added once, after the
    reduce (adding it on every rank would count it world_size times)."""

    dim = 1

    def forward(self, x):
        y = reduce_from_parallel_region(F.linear(x, self.weight), self.group, self.name)
        return y + self.bias if self.bias is not None else y


@dataclass(frozen=True)
class Split:
    """A plan entry: ``"column"`` or ``"row"``, optionally with its own index lists per rank
    (``Split("column", head_split(hidden, t))`` for a fused qkv layer)."""

    style: str
    indices: tuple | None = None


_STYLES = {"column": ColumnParallelLinear, "row": RowParallelLinear}


def _entry(name, value) -> Split:
    split = Split(value) if isinstance(value, str) else value
    if not isinstance(split, Split) or split.style not in _STYLES:
        raise ValueError(f"plan[{name!r}] = {value!r}: use 'column', 'row' or mpkit.parallel.Split('column'|'row', indices)")
    return split


def tensor_parallel(module: nn.Module, plan: dict, group=None, *, rank=None, world_size=None) -> nn.Module:
    """Replace the ``nn.Linear`` layers named in ``plan`` by this rank's column/row slices, in place.

    ``plan`` maps module names (``fnmatch`` patterns allowed, e.g. ``"layers.*.mlp.up"``) to
    ``"column"``, ``"row"`` or a ``Split``; every pattern must match at least one ``nn.Linear``.
    Pair a column layer with the row layer that consumes its output (an elementwise function or
    per-head attention between them). ``rank``/``world_size`` default to ``group``'s.
    Returns ``module``.
    """
    if not isinstance(plan, dict) or not plan:
        raise ValueError("plan must be a non-empty dict such as {'mlp.up': 'column', 'mlp.down': 'row'}")
    entries = {pattern: _entry(pattern, value) for pattern, value in plan.items()}
    names = [n for n, _ in module.named_modules() if n]
    targets = {}
    for pattern, split in entries.items():
        hits = [n for n in names if fnmatchcase(n, pattern)]
        if not hits:
            linears = [n for n, m in module.named_modules() if isinstance(m, nn.Linear)]
            raise ValueError(f"plan names {pattern!r}, but the module has no such layer; its nn.Linear layers: "
                             f"{', '.join(linears[:12]) or 'none'}")
        for name in hits:
            targets[name] = split
    owners = {}  # id(parameter) -> every name it has: a tied parameter has several
    for pname, param in module.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(pname)
    for name in targets:
        for param in module.get_submodule(name).parameters():
            others = [n for n in owners[id(param)] if not n.startswith(f"{name}.")]
            if others:
                raise ValueError(f"layer {name!r} shares a parameter with {others[0]!r} (tied weights); splitting it "
                                 f"would untie them and train two different tensors. Leave {name!r} out of the plan")
    sharded = {}  # built first, swapped in last: a bad plan leaves the module whole
    for name, split in targets.items():
        layer = module.get_submodule(name)
        sharded[name] = _STYLES[split.style](layer, group, split.indices, rank=rank, world_size=world_size, name=name)
    styles = {split.style for split in targets.values()}
    if len(styles) == 1:  # a column layer's output (a row layer's input) stays split: the next layer would fail
        [style] = styles
        other = "row" if style == "column" else "column"
        raise ValueError(f"plan splits {', '.join(targets)} by {style}s but no layer by {other}s: a column-parallel layer "
                         f"leaves each rank a slice of its output features, which only a row-parallel layer after it "
                         f"can take; pair them, e.g. {{'mlp.up': 'column', 'mlp.down': 'row'}}")
    for name, layer in sharded.items():
        parent_name, _, attr = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, attr, layer)
    return module


def sharded_layers(module: nn.Module) -> dict:
    """{module name: column/row-parallel layer} inside ``module``."""
    return {n: m for n, m in module.named_modules() if isinstance(m, _ShardedLinear)}


def full_parameters(module: nn.Module) -> dict:
    """{parameter name: full tensor} with sharded weights all-gathered (every rank must call it)."""
    layers, out = sharded_layers(module), {}
    for name, param in module.named_parameters():
        layer_name, _, param_name = name.rpartition(".")
        layer = layers.get(layer_name)
        out[name] = layer.gather(param_name) if layer is not None else param.detach().clone()
    return out
