"""Blind attempts (blind-b) at ulysses_head_swap: written from the stub and hints only."""
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnnf
import torch.nn.functional as F
from torch.distributed import all_gather, all_reduce


def _exchange_list(x, scatter_dim, gather_dim):
    n = dist.get_world_size()
    sends = [c.contiguous() for c in x.chunk(n, dim=scatter_dim)]
    recvs = [torch.empty_like(sends[0]) for _ in range(n)]
    dist.all_to_all(recvs, sends)
    return torch.cat(recvs, dim=gather_dim)


def _exchange_single(x, scatter_dim, gather_dim, order=None):
    n = dist.get_world_size()
    stacked = torch.stack(x.chunk(n, dim=scatter_dim)).contiguous()
    got = torch.empty_like(stacked)
    dist.all_to_all_single(got, stacked)
    parts = list(got.unbind(0))
    if order is not None:
        parts = [parts[i] for i in order(n)]
    return torch.cat(parts, dim=gather_dim)


def _function(exchange, swap_back=True):
    class Exchange(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, scatter_dim, gather_dim):
            ctx.dims = (scatter_dim, gather_dim)
            return exchange(x, scatter_dim, gather_dim)

        @staticmethod
        def backward(ctx, grad):
            s, g = ctx.dims
            return (exchange(grad, g, s) if swap_back else exchange(grad, s, g)), None, None
    return Exchange


_ListExchange = _function(_exchange_list)
_SingleExchange = _function(_exchange_single)


def _ulysses(q, k, v, exchange, causal=True):
    qh, kh, vh = (exchange(t, 1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    return exchange(out, 2, 1)


# correct, unusual: the list all_to_all inside an autograd Function
def list_all_to_all(ctx, q, k, v):
    return _ulysses(q, k, v, _ListExchange.apply)


# correct, unusual: torch's own differentiable torch.distributed.nn.functional.all_to_all_single
def torch_nn_all_to_all(ctx, q, k, v):
    n = ctx.world_size

    def exchange(x, scatter_dim, gather_dim):
        stacked = torch.stack(x.chunk(n, dim=scatter_dim)).contiguous()
        got = dnnf.all_to_all_single(torch.empty_like(stacked), stacked)
        return torch.cat(got.unbind(0), dim=gather_dim)
    return _ulysses(q, k, v, exchange)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad.chunk(dist.get_world_size(), dim=2)[dist.get_rank()]


# mistake (values right, wasteful): all-gathers q, k, v along the sequence and keeps its heads
def all_gather_sequence(ctx, q, k, v):
    r, n = ctx.rank, ctx.world_size
    hs = q.shape[1] // n
    qh, kh, vh = (_GatherSeq.apply(t)[:, r * hs:(r + 1) * hs] for t in (q, k, v))
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    return _SingleExchange.apply(out, 2, 1)


class _GatherSeqImported(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        all_reduce(grad)
        return grad.chunk(dist.get_world_size(), dim=2)[dist.get_rank()]


# mistake (values right, wasteful): the same sequence all-gather, via `from torch.distributed import all_gather`
def all_gather_sequence_imported(ctx, q, k, v):
    r, n = ctx.rank, ctx.world_size
    hs = q.shape[1] // n
    qh, kh, vh = (_GatherSeqImported.apply(t)[:, r * hs:(r + 1) * hs] for t in (q, k, v))
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    return _SingleExchange.apply(out, 2, 1)


_Reversed = _function(lambda x, s, g: _exchange_single(x, s, g, order=lambda n: range(n - 1, -1, -1)))


# mistake: joins the received blocks in reverse rank order
def reverse_rank_order(ctx, q, k, v):
    return _ulysses(q, k, v, _Reversed.apply)


# mistake: calls all_to_all_single directly, no autograd Function, so nothing flows back to q, k, v
def not_differentiable(ctx, q, k, v):
    return _ulysses(q.detach(), k.detach(), v.detach(), _exchange_single)


# mistake: ordinary attention without the causal mask
def not_causal(ctx, q, k, v):
    return _ulysses(q, k, v, _SingleExchange.apply, causal=False)


_SameBack = _function(_exchange_single, swap_back=False)


# mistake (raises in backward): the backward repeats the forward's exchange instead of swapping the dimensions
def backward_not_swapped(ctx, q, k, v):
    return _ulysses(q, k, v, _SameBack.apply)


CORRECT = [list_all_to_all, torch_nn_all_to_all]
WRONG = [
    (all_gather_sequence, ("all-gather", "all_gather", "bytes")),
    (all_gather_sequence_imported, ("all-gather", "all_gather", "bytes")),
    (reverse_rank_order, ("rank order", "order")),
    (not_differentiable, ("differentiable", "autograd", "grad_fn", "requires_grad")),
    (not_causal, ("causal", "is_causal")),
    (backward_not_swapped, ("swap", "shape", "backward")),
]
