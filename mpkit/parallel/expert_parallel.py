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

The sketch sends each rank exactly the rows its experts were chosen for (Megatron's "alltoall"
token dispatcher, no token dropped); the class cuts a fixed-capacity buffer instead (below), the
same result when no token is dropped. In the code: ``expert_parallel(module)`` keeps this rank's experts and turns each
``MixtureOfExperts`` into an ``ExpertParallelMoE``, whose ``run_experts`` is the dispatch, the
local experts and the combine; ``synchronize_gradients`` after backward; then the helpers.

Each rank keeps E/N of the E experts (rank r: experts r·E/N .. (r+1)·E/N-1) and its own tokens
(the batch is split as in data parallelism). The router and the capacity are computed on each
rank's tokens as on one device (``mpkit.models.MixtureOfExperts``: every sequence is one group
with its own capacity, so the split does not change which tokens are dropped). The dispatch
buffer [E, slots, h] is cut by expert: an **all-to-all** sends rows r·E/N.. to rank r (dispatch),
each rank runs its experts on every rank's tokens for them, and a second all-to-all brings the
outputs home (combine). Backward runs the two all-to-alls in reverse. Each one moves
(N-1)/N of the buffer: E·C·h values per group, whatever the load, since the buffer has fixed
capacity slots (GShard; the price of capacity is the dropped tokens).

Gradients: an expert's weights see the tokens of every rank, so their gradient is already the
sum over ranks; the router and everything outside the experts see only this rank's tokens and
are averaged over the group as in data parallelism (``expert_parameters`` tells them apart).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from mpkit.models import MixtureOfExperts
from mpkit.observe import active
from mpkit.parallel.functional import all_reduce_flat, all_to_all


def expert_parallel(module: nn.Module, group=None, *, rank=None, world_size=None) -> nn.Module:
    """Spread the experts of every ``MixtureOfExperts`` inside ``module`` over ``group``, in place:
    this rank keeps its E/N experts (marked ``param.expert_parallel = True``). Returns ``module``."""
    rank = dist.get_rank(group) if rank is None else rank
    n = dist.get_world_size(group) if world_size is None else world_size
    layers = [m for m in module.modules() if isinstance(m, MixtureOfExperts)]
    if not layers:
        raise ValueError("expert_parallel: the module has no mpkit.models.MixtureOfExperts layer to spread")
    for moe in layers:
        check_expert_split(moe.num_experts, n)
        per = moe.num_experts // n
        moe.experts = nn.ModuleList(list(moe.experts)[rank * per:(rank + 1) * per])
        moe.__class__, moe.group, moe.first = ExpertParallelMoE, group, rank * per
        for p in moe.experts.parameters():
            p.expert_parallel = True
    return module


class ExpertParallelMoE(MixtureOfExperts):
    """A ``MixtureOfExperts`` holding experts ``first .. first+len(experts)-1``; ``run_experts``
    dispatches to and combines from their owners with two all-to-alls."""

    group = None
    first = 0

    def run_experts(self, buffer):
        mine = all_to_all(buffer, 0, 1, self.group, "moe dispatch")  # [E/N, N·slots, h]: every rank's tokens
        out = torch.stack([expert(mine[e]) for e, expert in enumerate(self.experts)])
        return all_to_all(out, 1, 0, self.group, "moe combine")  # back to [E, slots, h] on the tokens' rank


def synchronize_gradients(module: nn.Module, group=None) -> None:
    """After backward on this rank's share of the batch (loss = its mean): average every
    non-expert gradient over ``group`` (data parallelism) and divide the experts' by the group
    size (they already hold every rank's tokens, each rank's loss a mean over its own share)."""
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
    """The last forward's per-expert statistics of every MoE layer (``MixtureOfExperts.stats``)."""
    return [dict(m.stats) for m in module.modules() if isinstance(m, MixtureOfExperts)]


def check_expert_split(experts: int, ep: int) -> None:
    if experts % ep:
        raise ValueError(f"experts={experts} cannot be spread evenly over ep={ep} ranks; use a number of experts "
                         f"that is a multiple of {ep} (or an ep size that divides {experts})")


__all__ = ["expert_parallel", "ExpertParallelMoE", "expert_parameters", "synchronize_gradients", "full_expert_parameters", "expert_load",
           "check_expert_split"]
