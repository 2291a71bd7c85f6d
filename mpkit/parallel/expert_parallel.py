"""Expert parallelism: a mixture-of-experts layer with its experts spread over the ranks of a group.

The mechanism in ~20 lines (a top-k mixture of E experts, rank r holding ``experts`` r·E/N ..
(r+1)·E/N-1 and its own tokens ``x`` [tokens, h]; forward only)::

    weights, chosen = F.softmax(router(x), dim=-1).topk(k, dim=-1)   # each token's k experts
    order = chosen.reshape(-1).argsort(stable=True)       # rows (token, choice) sorted by expert,
    rows = x.repeat_interleave(k, dim=0)[order]           # so grouped by the rank that owns it
    sent = torch.bincount(chosen.reshape(-1), minlength=E).view(N, E // N)  # rows per (rank, expert)
    got = torch.empty_like(sent)
    dist.all_to_all_single(got, sent)                     # the rows every rank has for my experts
    inbox = rows.new_empty((int(got.sum()), x.shape[1]))
    dist.all_to_all_single(inbox, rows, got.sum(1).tolist(), sent.sum(1).tolist())  # dispatch
    chunks = inbox.split(got.reshape(-1).tolist())        # rank 0's rows for my experts, rank 1's, ..
    done = torch.cat([experts[i % len(experts)](c) for i, c in enumerate(chunks)])  # local experts
    back = torch.empty_like(rows)
    dist.all_to_all_single(back, done, sent.sum(1).tolist(), got.sum(1).tolist())   # combine
    token = torch.arange(len(x)).repeat_interleave(k)[order]
    y = torch.zeros_like(x).index_add_(0, token, back * weights.reshape(-1)[order, None])

The sketch sends each rank exactly the rows its experts were chosen for: no token is dropped
(Megatron's "alltoall" token dispatcher; MegaBlocks' dropless MoE). That is ``dropless=True``
below. With a ``capacity_factor`` each expert instead takes at most C = ⌈factor·tokens·k/E⌉ tokens
of each sequence, the rest dropped (they pass only through the residual), and the dispatch is a
fixed [E, sequences·C, h] buffer cut by expert (GShard; ``models.capacity_mixture``): one
all-to-all of E·C·h values per sequence each way, whatever the load. In the code:
``expert_parallel(module)`` finds every MoE layer and puts an ``ExpertParallelMoE`` in its place,
which keeps this rank's experts and runs one of the two dispatches; ``synchronize_expert_gradients``
after backward; then the helpers and the checks.

**Any MoE layer** works if it exposes (the contract; ``mpkit.models.MixtureOfExperts`` follows it):
``router(x) -> logits [..., E]``, ``experts``: an ``nn.ModuleList`` of E modules mapping
[tokens, h] -> [tokens, h], and optionally ``top_k`` (default 1), ``capacity_factor`` (absent or
None: dropless) and ``norm_topk_prob`` (True: the chosen weights renormalised to sum to 1, as
Mixtral and Qwen-MoE do). The layer's output is Σ_k w_k · expert_k(x) with w = the top-k of
softmax(logits): the layer's own ``forward`` is not called (its router and experts are adopted
under the same names, so state dicts stay compatible). Tokens are the leading dimensions
flattened; a capacity applies per sequence (the second-to-last dimension), so splitting the batch
does not change which tokens are dropped. Anything else inside the layer (a shared expert, a
scale) is refused: move it next to the layer.

Gradients (the 1/N): each rank's loss is the mean over its own tokens. An expert's weights see
every rank's tokens for it, so the gradient the all-to-all backward brings to them is
Σ_r ∂L_r/∂W = N × the gradient of the global mean: ``synchronize_expert_gradients`` divides it by N,
with no communication (Megatron scales expert gradients by 1/DP for the same reason). The router
and everything outside the experts see only this rank's tokens and are averaged over the group
with one all-reduce, as in data parallelism (``synchronize_expert_gradients`` does both;
``expert_parameters`` tells them apart).

At construction, when the group is live, the ranks must have built the same MoE from the same
seed: one small all-gather of the expert counts, the layout of the parameters
(``checks.check_same_model``) and two checksums of their values. Otherwise each rank would keep
experts of a different model, or route with a different router, silently.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from mpkit.models import MixtureOfExperts, balance_loss, capacity_mixture, capacity_slots
from mpkit.observe import active
from mpkit.parallel.checks import check_agree, check_same_model, check_same_values
from mpkit.parallel.functional import all_reduce_flat, all_to_all


def expert_parallel(module: nn.Module, group=None, *, capacity_factor: float | None = None, dropless: bool = False,
                    top_k: int | None = None, rank=None, world_size=None) -> nn.Module:
    """Spread the experts of every MoE layer inside ``module`` (see the contract in the module
    docstring) over ``group``: each becomes an ``ExpertParallelMoE`` keeping this rank's E/N experts
    (marked ``param.expert_parallel = True``). ``capacity_factor``: drop tokens beyond capacity
    (default: the layer's own ``capacity_factor``); ``dropless=True``: never drop. Returns the
    module (the wrapper itself when ``module`` is an MoE layer: use the returned module)."""
    if dropless and capacity_factor is not None:
        raise ValueError(f"expert_parallel: dropless=True drops no token, capacity_factor={capacity_factor} drops "
                         f"those beyond capacity; pass one of them")
    layers = moe_layers(module)
    if not layers:
        raise ValueError("expert_parallel: the module has no mixture-of-experts layer: a layer needs a `router` "
                         "(x -> logits over the experts) and `experts` (an nn.ModuleList), as "
                         "mpkit.models.MixtureOfExperts has")
    live = rank is None and world_size is None  # else a plan built without a group (the cost model's)
    rank = dist.get_rank(group) if rank is None else rank
    n = dist.get_world_size(group) if world_size is None else world_size
    for name, moe in layers:
        check_contract(name, moe)
        check_expert_split(len(moe.experts), n)
    if live:
        check_same_experts(module, layers, group)
    for name, moe in layers:
        factor = None if dropless else capacity_factor if capacity_factor is not None else \
            getattr(moe, "capacity_factor", None)
        wrapper = ExpertParallelMoE(moe, group, rank, n, top_k or getattr(moe, "top_k", 1), factor)
        if not name:
            return wrapper
        parent, _, attr = name.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, attr, wrapper)
    return module


class ExpertParallelMoE(nn.Module):
    """An MoE layer holding experts ``first .. first+len(experts)-1`` of ``num_experts``: routes its
    tokens with the layer's router, sends them to the experts' ranks and combines what comes back
    (fixed capacity, or dropless). The router and experts keep their names."""

    def __init__(self, moe: nn.Module, group, rank: int, world_size: int, top_k: int, capacity_factor):
        super().__init__()
        self.router = moe.router  # the layer's own children, under their names: state dicts stay compatible
        self.num_experts, self.top_k, self.capacity_factor = len(moe.experts), top_k, capacity_factor
        self.normalize = bool(getattr(moe, "norm_topk_prob", False))
        per = self.num_experts // world_size
        self.group, self.first, self.world_size = group, rank * per, world_size
        self.experts = nn.ModuleList(list(moe.experts)[self.first:self.first + per])
        for p in self.experts.parameters():
            p.expert_parallel = True
        self.stats = {}

    def forward(self, x):
        if self.capacity_factor is None:
            tokens = x.reshape(-1, x.shape[-1])
            y, self.stats = self.dropless(tokens, self.router(tokens))
            return y.view_as(x)
        seqs = x.reshape(-1, *x.shape[-2:]) if x.dim() > 2 else x.unsqueeze(0)
        cap = capacity_slots(seqs.shape[1], self.top_k, self.num_experts, self.capacity_factor)
        y, stats = capacity_mixture(seqs, self.router(seqs), self.run_experts, self.top_k, cap, self.normalize)
        self.stats = stats or self.stats
        return y.view_as(x)

    def run_experts(self, buffer):
        """The fixed-capacity dispatch: [E, slots, h] cut by expert to the experts' ranks and back."""
        mine = all_to_all(buffer, 0, 1, self.group, "moe dispatch")  # [E/N, N·slots, h]: every rank's tokens
        out = torch.stack([expert(mine[e]) for e, expert in enumerate(self.experts)])
        return all_to_all(out, 1, 0, self.group, "moe combine")  # back to [E, slots, h] on the tokens' rank

    def dropless(self, x, logits):
        """The sketch of the module docstring, differentiable: (output [tokens, h], stats)."""
        k, n, per = self.top_k, self.world_size, len(self.experts)
        probs = torch.softmax(logits, dim=-1)
        weights, chosen = probs.topk(k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        order = chosen.reshape(-1).argsort(stable=True)  # (token, choice) rows grouped by expert, so by rank
        token = torch.arange(len(x), device=x.device).repeat_interleave(k)[order]
        sent = torch.bincount(chosen.reshape(-1), minlength=self.num_experts).view(n, per)
        with torch.no_grad():
            got = all_to_all(sent, 0, 0, self.group, "moe dispatch counts")  # [source rank, my expert]
        send, receive = sent.sum(1).tolist(), got.sum(1).tolist()
        inbox = all_to_all(x[token], 0, 0, self.group, "moe dispatch", scatter_sizes=send, gather_sizes=receive)
        pieces = list(inbox.split(got.reshape(-1).tolist()))  # source-major: rank 0's rows for my experts, ..
        for e, expert in enumerate(self.experts):  # each expert once, on every rank's rows for it
            mine = [src * per + e for src in range(n)]
            done = expert(torch.cat([pieces[i] for i in mine]))
            for i, part in zip(mine, done.split([len(pieces[i]) for i in mine])):
                pieces[i] = part
        back = all_to_all(torch.cat(pieces), 0, 0, self.group, "moe combine", scatter_sizes=receive, gather_sizes=send)
        y = torch.zeros_like(x).index_add(0, token, back * weights.reshape(-1)[order, None].to(back.dtype))
        with torch.no_grad():
            load = sent.reshape(-1)
            first = (chosen[:, :1] == torch.arange(self.num_experts, device=x.device)).to(probs.dtype)
            stats = {"load": load, "capacity": None, "kept": load.clone(), "dropped": 0,
                     "balance_loss": balance_loss(first, probs)}
        return y, stats


def moe_layers(module: nn.Module) -> list:
    """[(name, layer)] of the outermost modules with a ``router`` and an ``experts`` ModuleList."""
    found = []
    for name, m in module.named_modules():
        if isinstance(m, ExpertParallelMoE) or any(name.startswith(f"{outer}.") or not outer for outer, _ in found):
            continue
        if isinstance(getattr(m, "experts", None), nn.ModuleList) and callable(getattr(m, "router", None)):
            found.append((name, m))
    return found


def synchronize_expert_gradients(module: nn.Module, group=None) -> None:
    """After backward on this rank's share of the batch (loss = its mean): average every
    non-expert gradient over ``group`` (data parallelism) and divide the experts' by the group
    size (they already sum every rank's tokens' gradients: see the module docstring)."""
    experts, rest = expert_parameters(module)
    n = dist.get_world_size(group)
    for p in experts:
        if p.grad is not None:
            p.grad.div_(n)
    all_reduce_flat([p.grad for p in rest if p.grad is not None], group, "non-expert grads", average=True)


def expert_parameters(module: nn.Module) -> tuple[list, list]:
    """(this rank's expert parameters, every other parameter)."""
    experts, rest = [], []
    for p in module.parameters():
        (experts if getattr(p, "expert_parallel", False) else rest).append(p)
    return experts, rest


def full_expert_parameters(module: nn.Module, group=None) -> dict:
    """{parameter name: tensor} with every expert's weights under its index on one device
    (``...experts.<e>.up.weight``), all-gathered over ``group`` (every rank must call it)."""
    n = dist.get_world_size(group)
    out = {}
    for name, moe in module.named_modules():
        if isinstance(moe, ExpertParallelMoE):
            prefix = f"{name}.experts" if name else "experts"
            for local, expert in enumerate(moe.experts):
                for pname, p in expert.named_parameters():
                    shards = [torch.empty_like(p) for _ in range(n)]
                    active.comm().all_gather(shards, p.detach().contiguous(), group=group,
                                             name=f"gather {prefix}.{pname}")
                    for r, shard in enumerate(shards):
                        out[f"{prefix}.{r * len(moe.experts) + local}.{pname}"] = shard
    for pname, p in module.named_parameters():
        if not getattr(p, "expert_parallel", False):
            out[pname] = p.detach().clone()
    return out


def expert_load(module: nn.Module) -> list:
    """The last forward's per-expert statistics of every MoE layer (its ``stats``)."""
    return [dict(m.stats) for m in module.modules() if isinstance(m, (MixtureOfExperts, ExpertParallelMoE))]


def check_expert_split(experts: int, ep: int) -> None:
    if experts % ep:
        raise ValueError(f"experts={experts} cannot be spread evenly over ep={ep} ranks; use a number of experts "
                         f"that is a multiple of {ep} (or an ep size that divides {experts})")


def check_contract(name: str, moe: nn.Module) -> None:
    """The layer holds nothing the expert-parallel forward would leave out."""
    extra = [n for n, _ in moe.named_children() if n not in ("router", "experts")]
    extra += [n for n, _ in (*moe.named_parameters(recurse=False), *moe.named_buffers(recurse=False))]
    if extra:
        raise ValueError(f"expert_parallel: the mixture-of-experts layer {name or '(the module)'} holds "
                         f"{', '.join(extra)} besides its router and experts; the expert-parallel layer computes "
                         f"only Σ_k w_k·expert_k(x) from those two (its own forward is not called), so move the rest "
                         f"(a shared expert, a scale) out of the layer, next to it")


def check_same_experts(module: nn.Module, layers: list, group) -> None:
    """Every rank built the same MoE (see the module docstring): expert counts, parameter layout,
    values. Before any expert is dropped, so each rank still holds all of them."""
    what = "expert_parallel"
    check_agree({"number of mixture-of-experts layers": len(layers),
                 "number of experts (all layers together)": sum(len(m.experts) for _, m in layers)}, group, what,
                "build the same model on every rank: each keeps its share of the same experts")
    check_same_model(module, group, what)
    check_same_values(module, group, what, "build the model from one seed on every rank (torch.manual_seed(...) "
                      "before building it): each rank keeps its share of the experts, and routes with its router")


__all__ = ["expert_parallel", "ExpertParallelMoE", "expert_parameters", "synchronize_expert_gradients",
           "full_expert_parameters", "expert_load", "check_expert_split", "moe_layers"]
