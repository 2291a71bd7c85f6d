"""Megatron-LM tensor parallelism on any module: two communication functions, two layers, and
``tensor_parallel(module, plan)`` that swaps named ``nn.Linear`` layers for their slices.

The mechanism in ~25 lines (an MLP ``down(act(up(x)))`` on N ranks; the code below adds the
checks, index lists other than contiguous ones, and putting the full model back)::

    class f(torch.autograd.Function):                     # in front of a column-parallel layer
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)                            # identity
        @staticmethod
        def backward(ctx, grad):
            dist.all_reduce(grad)                          # the sum of every rank's partial dL/dx
            return grad

    class g(torch.autograd.Function):                     # after a row-parallel layer
        @staticmethod
        def forward(ctx, y):
            y = y.clone()
            dist.all_reduce(y)                             # the sum of the partial outputs
            return y
        @staticmethod
        def backward(ctx, grad):
            return grad                                    # identity

    rows = torch.arange(up.out_features).chunk(N)[r]      # this rank's hidden features
    up_w, up_b = up.weight[rows], up.bias[rows]           # column-parallel: output rows
    down_w = down.weight[:, rows]                         # row-parallel: the matching input columns

    def mlp(x):                                           # every rank the same x
        h = act(F.linear(f.apply(x), up_w, up_b))         # this rank's slice of the hidden layer
        return g.apply(F.linear(h, down_w)) + down.bias   # bias once, after the sum

In the code: ``CopyToParallelRegion`` (f), ``ReduceFromParallelRegion`` (g), ``ColumnParallelLinear``,
``RowParallelLinear``, ``tensor_parallel``; then the plan, the full model back, and the checks.

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

A column-parallel layer whose output is not taken by a row-parallel one (a vocab-parallel output
layer) all-gathers its output instead (``gather_output=True``): all-gather forward, this rank's
slice of the gradient backward.

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
        self.indices = _rank_indices(indices, full.weight.shape[self.dim], world_size, name, self.dim)
        self.name = name
        own = self.indices[self.rank]  # the rows (column-parallel) or columns (row-parallel) this rank keeps
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

    def gather(self, param_name: str, local: torch.Tensor | None = None) -> torch.Tensor:
        """The full tensor of ``weight``/``bias`` in the original layer's layout (a collective).
        ``local``: this rank's slice when the parameter itself holds less (a shard of it, under FSDP)."""
        local = getattr(self, param_name).detach() if local is None else local
        if not self.sharded(param_name):
            return local.clone()
        dim = self.dim if param_name == "weight" else 0
        most = max(len(idx) for idx in self.indices)  # lists may differ in length: all-gather equal, padded slices
        pad = list(local.shape)
        pad[dim] = most - local.shape[dim]
        padded = torch.cat([local, local.new_zeros(pad)], dim) if pad[dim] else local
        shards = [torch.empty_like(padded) for _ in self.indices]
        active.comm().all_gather(shards, padded.contiguous(), group=self.group, name=f"gather {self.name}.{param_name}")
        full = torch.empty(self.full_shapes[param_name], dtype=local.dtype, device=local.device)
        for idx, shard in zip(self.indices, shards):
            full.index_copy_(dim, idx.to(full.device), shard.narrow(dim, 0, len(idx)))
        return full

    def extra_repr(self) -> str:
        return f"{self.name}: rank {self.rank} of {len(self.indices)}, weight {tuple(self.weight.shape)}"

    def _check_input(self, x) -> None:
        """A clear error for an input of the wrong width: above all a plan with column and row
        reversed (a row layer handed the full input, a column layer handed a slice), which torch
        reports only as "mat1 and mat2 shapes cannot be multiplied". One shape test per forward."""
        want, full = self.weight.shape[1], self.full_shapes["weight"][1]
        if x.shape[-1] == want:
            return
        style = "row" if self.dim == 1 else "column"
        if self.dim == 1 and x.shape[-1] == full:
            got = f"the full input ({full} features), not this rank's slice of {want} of them"
            fix = ("a row layer must come after a column layer, whose output slice it takes: is the plan reversed? "
                   "Split the layer that runs first by 'column' and the one after it by 'row', e.g. "
                   "{'mlp.up': 'column', 'mlp.down': 'row'}")
        elif self.dim == 0 and x.shape[-1] * len(self.indices) == full:
            got = f"a slice of {x.shape[-1]} of its {full} input features"
            fix = ("a column layer takes the full input, so it cannot follow a column layer's slice or a row "
                   "layer's input: is the plan reversed? Split the layer that runs first by 'column' and the one "
                   "after it by 'row', e.g. {'mlp.up': 'column', 'mlp.down': 'row'}")
        else:
            got = f"{x.shape[-1]} input features"
            fix = f"the layer expects {want} ({'its slice of ' if self.dim == 1 else ''}{full}); check the plan"
        raise ValueError(f"tensor-parallel layer {self.name or '?'} ({style}-parallel, rank {self.rank}) received "
                         f"{got}: {fix}")


class ColumnParallelLinear(_ShardedLinear):
    """Y_i = X · A_iᵀ + b_i: this rank's output features. Its input goes through f first.

    ``gather_output=False`` (the default, torch's ColwiseParallel output ``Shard(-1)``): the output
    stays this rank's slice, for a row-parallel layer after it. ``True`` (torch's
    ``output_layouts=Replicate()``): the slices are all-gathered into the full output, so any
    layer or loss can take it (a vocab-parallel output layer)."""

    dim = 0
    f = staticmethod(copy_to_parallel_region)  # f(x, group, name); a learner's own in the capstone (learner_pieces)

    def __init__(self, full: nn.Linear, group=None, indices=None, *, rank=None, world_size=None, name="",
                 gather_output=False):
        super().__init__(full, group, indices, rank=rank, world_size=world_size, name=name)
        if gather_output and len({len(i) for i in self.indices}) > 1:
            raise ValueError(f"layer {name or '?'}: gather_output=True all-gathers equal slices; its index lists "
                             f"have {sorted({len(i) for i in self.indices})} features")
        self.gather_output = gather_output

    def forward(self, x):
        self._check_input(x)
        y = F.linear(self.f(x, self.group, self.name), self.weight, self.bias)
        if self.gather_output:
            y = GatherFromParallelRegion.apply(y, self.indices, self.rank, self.group, self.name)
        return y

    def extra_repr(self) -> str:
        return super().extra_repr() + (", output gathered" if self.gather_output else "")


class RowParallelLinear(_ShardedLinear):
    """Y = g(Σ_i X_i · A_iᵀ) + b: this rank's input features; the bias is added once, after the
    reduce (adding it on every rank would count it world_size times)."""

    dim = 1
    g = staticmethod(reduce_from_parallel_region)  # g(x, group, name); a learner's own in the capstone

    def forward(self, x):
        self._check_input(x)
        y = self.g(F.linear(x, self.weight), self.group, self.name)
        return y + self.bias if self.bias is not None else y


def tensor_parallel(module: nn.Module, plan: dict, group=None, *, rank=None, world_size=None,
                    layers: dict | None = None) -> nn.Module:
    """Replace the ``nn.Linear`` layers named in ``plan`` by this rank's column/row slices, in place.

    ``plan`` maps module names (``fnmatch`` patterns allowed, e.g. ``"layers.*.mlp.up"``) to
    ``"column"``, ``"row"`` or a ``Split``; every pattern must match at least one ``nn.Linear``.
    Each layer must be valid on its own; the plan need not pair them (it may be applied in
    several calls). A ``"column"`` layer leaves each rank a slice of its output features, which
    only a row-parallel layer can take: pair it with the row layer that consumes its output (an
    elementwise function or per-head attention between them), in this plan or an earlier call.
    A column layer with no row layer anywhere must say what its output is (it is not guessed):
    ``Split("column", gather_output=True)`` for the full output (e.g. a vocab-parallel output
    layer), ``Split("column", gather_output=False)`` for the slice (its row layer comes in a later
    call). A row layer takes a slice of its input features. ``rank``/``world_size`` default to
    ``group``'s. ``layers``: the classes that build each style (default ``ColumnParallelLinear``
    and ``RowParallelLinear``; ``sequence_parallel`` passes its own). Returns ``module``.
    """
    targets = plan_targets(module, plan)
    sharded = slices(module, targets, group, rank=rank, world_size=world_size, layers=layers)  # swapped in last: a bad plan
    # leaves the module whole. A plain 'column' layer with no row layer to take its slice: its output would reach a full layer or
    # the loss as a slice (a shape error, or, for a loss over the features, a silently wrong result)
    unsaid = [n for n, split in targets.items() if split.style == "column" and split.gather_output is None]
    rows = any(split.style == "row" for split in targets.values()) or any(
        isinstance(m, RowParallelLinear) for m in module.modules())
    if unsaid and not rows:
        raise unpaired_columns(unsaid, "say what its output is: Split('column', gather_output=True) all-gathers the "
                               "full output (e.g. a vocab-parallel output layer), Split('column', gather_output=False) "
                               "keeps the slice for a row layer you split in a later call")
    for name, layer in sharded.items():
        parent_name, _, attr = name.rpartition(".")
        setattr(module.get_submodule(parent_name) if parent_name else module, attr, layer)
    return module


# ---- the plan: which layers, split how ----

@dataclass(frozen=True)
class Split:
    """A plan entry: ``"column"`` or ``"row"``, optionally with its own index lists per rank
    (``Split("column", head_split(hidden, t))`` for a fused qkv layer), which together must hold
    each of the layer's features exactly once.

    ``gather_output`` (column only) says what a column layer's output is: ``True`` the full
    output, all-gathered (torch: ``ColwiseParallel(output_layouts=Replicate())``); ``False`` this
    rank's slice, for a row layer applied in another call; ``None`` (the plain ``"column"``) the
    slice, for a row layer in the same plan or already in the module."""

    style: str
    indices: tuple | None = None
    gather_output: bool | None = None


_STYLES = {"column": ColumnParallelLinear, "row": RowParallelLinear}


def plan_targets(module: nn.Module, plan: dict) -> dict:
    """{layer name: Split} of every layer ``plan``'s patterns match; ValueError for a bad entry
    or a pattern that matches nothing."""
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
    return targets


def slices(module: nn.Module, targets: dict, group=None, *, rank=None, world_size=None, layers: dict | None = None) -> dict:
    """{layer name: this rank's column/row slice} of ``plan_targets``' layers, built but not swapped
    in; ValueError for a layer that is invalid on its own (not an ``nn.Linear``, a size the tp size
    does not divide, a weight tied to a layer outside it)."""
    _refuse_untying(module, targets)
    sharded = {}
    for name, split in targets.items():
        layer = module.get_submodule(name)
        extra = {"gather_output": bool(split.gather_output)} if split.style == "column" else {}
        sharded[name] = (layers or _STYLES)[split.style](layer, group, split.indices, rank=rank, world_size=world_size,
                                                         name=name, **extra)
    return sharded


# ---- the full model back, and a column layer's full output ----

def full_parameters(module: nn.Module) -> dict:
    """{parameter name: full tensor} with sharded weights all-gathered (every rank must call it)."""
    layers, out = sharded_layers(module), {}
    for name, param in module.named_parameters():
        layer_name, _, param_name = name.rpartition(".")
        layer = layers.get(layer_name)
        out[name] = layer.gather(param_name) if layer is not None else param.detach().clone()
    return out


def sharded_layers(module: nn.Module) -> dict:
    """{module name: column/row-parallel layer} inside ``module``."""
    return {n: m for n, m in module.named_modules() if isinstance(m, _ShardedLinear)}


class GatherFromParallelRegion(torch.autograd.Function):
    """All-gather of the ranks' output features forward (into the full layer's feature order,
    ``indices[r]`` from rank r), this rank's slice of the gradient backward: every rank computes
    the same full output downstream, so each already has the whole gradient and keeps its part
    (Megatron's ``gather_from_tensor_model_parallel_region``; torch's ColwiseParallel with
    ``output_layouts=Replicate()``)."""

    @staticmethod
    def forward(ctx, x, indices, rank, group, name):
        ctx.own = indices[rank].to(x.device)
        x = x.contiguous()
        shards = [torch.empty_like(x) for _ in indices]
        active.comm().all_gather(shards, x, group=group, name=f"gather forward {name}")
        full = x.new_empty((*x.shape[:-1], sum(len(i) for i in indices)))
        for idx, shard in zip(indices, shards):
            full.index_copy_(x.ndim - 1, idx.to(x.device), shard)
        return full

    @staticmethod
    def backward(ctx, grad):
        return grad.index_select(grad.ndim - 1, ctx.own), None, None, None, None


# ---- which features each rank owns ----

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
    if hidden % parts:
        raise ValueError(f"head_split({hidden}, {parts}): {parts} ranks do not divide hidden={hidden} evenly; "
                         f"use a tensor-parallel size that divides the number of heads")
    per_rank = hidden // parts
    return [torch.cat([j * hidden + r * per_rank + torch.arange(per_rank) for j in range(3)])
            for r in range(parts)]


def _rank_indices(indices, size: int, world_size: int, name: str, dim: int) -> list[torch.Tensor]:
    """Each rank's feature indices: ``indices`` checked (``_partition``), or contiguous equal slices
    (a partition by construction: checking them cost seconds per layer for the cost model's huge widths)."""
    if indices is None:
        if size % world_size:
            what = "out_features" if dim == 0 else "in_features"
            raise ValueError(f"layer {name or '?'}: tp size {world_size} does not divide {what}={size}; use a "
                             f"tensor-parallel size that divides {size}")
        return contiguous_split(size, world_size)
    return _partition(indices, size, world_size, name, dim)


def _partition(indices, size: int, world_size: int, name: str, dim: int) -> list[torch.Tensor]:
    """``indices`` as one index tensor per rank, checked to hold every feature exactly once: an
    index on two ranks would count twice, a missing one would be dropped (or, gathered, left
    uninitialised), so a wrong split must not train. Lists may differ in length."""
    what = "out_features" if dim == 0 else "in_features"
    parts = [torch.as_tensor(i) for i in indices]
    parts = [p.long() if p.numel() == 0 else p for p in parts]  # [] reads as float: a rank with no features
    if len(parts) != world_size:
        raise ValueError(f"layer {name or '?'}: {len(parts)} index lists for a tp size of {world_size}; give one per rank")
    if any(p.dim() != 1 or p.is_floating_point() or p.is_complex() or p.dtype == torch.bool for p in parts):
        raise ValueError(f"layer {name or '?'}: each rank's index list must be a 1-D list or tensor of whole numbers")
    parts = [p.long() for p in parts]
    if any(p.is_meta for p in parts):
        return parts  # a shapes-only model (the cost model's, on the meta device): no values to check
    every = torch.cat([p.cpu() for p in parts])  # checked where they all are; each list keeps its device
    if every.numel() == size and (size == 0 or (every.min() >= 0 and every.max() < size
                                                and torch.bincount(every, minlength=size).max() <= 1)):
        return parts  # as many indices as features, none outside, none twice: each exactly once
    inside = (every >= 0) & (every < size)
    counts = torch.bincount(every[inside], minlength=size)
    faults = {"outside 0..%d" % (size - 1): every[~inside].unique().tolist(),
              "more than once": (counts > 1).nonzero().flatten().tolist(),
              "on no rank": (counts == 0).nonzero().flatten().tolist()}
    if any(faults.values()):
        said = "; ".join(f"{where}: {found[:8]}{' ...' if len(found) > 8 else ''}" for where, found in faults.items()
                         if found)
        raise ValueError(f"layer {name or '?'}: its index lists must hold each of its {what}={size} exactly once "
                         f"across the ranks; indices {said}. Fix the lists (mpkit.parallel.head_split "
                         f"makes them for a fused qkv layer) or leave indices out for contiguous slices")
    return parts


# ---- checks: a wrong plan must not train ----

def _entry(name, value) -> Split:
    split = Split(value) if isinstance(value, str) else value
    if not isinstance(split, Split) or split.style not in _STYLES:
        raise ValueError(f"plan[{name!r}] = {value!r}: use 'column', 'row' or mpkit.parallel.Split('column'|'row', indices)")
    if split.gather_output not in (None, True, False):
        raise ValueError(f"plan[{name!r}] = {value!r}: gather_output must be True, False or None")
    if split.style == "row" and split.gather_output is not None:
        raise ValueError(f"plan[{name!r}] = {value!r}: gather_output applies to 'column' layers; a row-parallel "
                         f"layer's output is always the full one (all-reduced)")
    return split


def _refuse_untying(module: nn.Module, targets: dict) -> None:
    """A split layer whose weight another layer shares (tied weights) would train two tensors apart."""
    owners = {}  # id(parameter) -> every name it has: a tied parameter has several
    for pname, param in module.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(pname)
    for name in targets:
        for param in module.get_submodule(name).parameters():
            others = [n for n in owners[id(param)] if not n.startswith(f"{name}.")]
            if others:
                raise ValueError(f"layer {name!r} shares a parameter with {others[0]!r} (tied weights); splitting it "
                                 f"would untie them and train two different tensors. Leave {name!r} out of the plan")


def unpaired_columns(names, remedy: str) -> ValueError:
    """The error for column layers whose split output no row layer takes (``tensor_parallel`` and
    the 'tp' strategy's one-call check), ending in ``remedy``."""
    return ValueError(f"plan splits {', '.join(names)} by columns but no layer by rows: a column-parallel layer "
                      f"leaves each rank a slice of its output features, which only a row-parallel layer after it "
                      f"can take; pair them, e.g. {{'mlp.up': 'column', 'mlp.down': 'row'}}, or {remedy}")
