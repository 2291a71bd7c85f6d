"""Attempts for ulysses_head_swap(ctx, q, k, v) -> [b, H, s/N, d], forward and backward checked."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from expert_parallel_moe import _Exchange  # all_to_all_single on dimension 0, backward the same exchange back


def _swap_list(x, split_dim, cat_dim):
    """The exchange with the list form of all_to_all."""
    n = dist.get_world_size()
    send = [t.contiguous() for t in x.chunk(n, dim=split_dim)]
    recv = [torch.empty_like(t) for t in send]
    dist.all_to_all(recv, send)
    return torch.cat(recv, dim=cat_dim)


def _swap_messages(x, split_dim, cat_dim):
    """The exchange from messages: isend block j to rank j, irecv from every rank."""
    n, r = dist.get_world_size(), dist.get_rank()
    send = [t.contiguous() for t in x.chunk(n, dim=split_dim)]
    recv = [send[r].clone() if j == r else torch.empty_like(send[j]) for j in range(n)]
    works = []
    for j in range(n):
        if j != r:
            works += [dist.isend(send[j], j), dist.irecv(recv[j], j)]
    for w in works:
        w.wait()
    return torch.cat(recv, dim=cat_dim)


def _function(swap, backward_same_way=False):
    class Swap(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, split_dim, cat_dim):
            ctx.dims = (split_dim, cat_dim)
            return swap(x, split_dim, cat_dim)

        @staticmethod
        def backward(ctx, grad):
            split_dim, cat_dim = ctx.dims
            if backward_same_way:
                return swap(grad, split_dim, cat_dim), None, None
            return swap(grad, cat_dim, split_dim), None, None
    return Swap


ListSwap, MessageSwap = _function(_swap_list), _function(_swap_messages)


# ---------------------------------------------------------------- correct
def list_all_to_all(ctx, q, k, v):
    q, k, v = (ListSwap.apply(t, 1, 2) for t in (q, k, v))
    return ListSwap.apply(F.scaled_dot_product_attention(q, k, v, is_causal=True), 2, 1)


def fused_qkv_by_messages(ctx, q, k, v):
    """q, k, v fused into one exchange (from isend/irecv), attention by hand with a causal mask."""
    qkv = MessageSwap.apply(torch.stack([q, k, v], dim=2), 1, 3)   # [b, H, 3, s/N, d] -> [b, H/N, 3, s, d]
    q, k, v = qkv.unbind(2)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    seq = s.shape[-1]
    s = s.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf"))
    return MessageSwap.apply(torch.softmax(s, -1) @ v, 2, 1)


CORRECT = [list_all_to_all, fused_qkv_by_messages]


# ---------------------------------------------------------------- wrong
def not_differentiable(ctx, q, k, v):
    """Right forward with plain all_to_all: the output is cut off from q, k, v."""
    with torch.no_grad():
        q, k, v = (_swap_list(t, 1, 2) for t in (q, k, v))
        return _swap_list(F.scaled_dot_product_attention(q, k, v, is_causal=True), 2, 1)


def not_causal(ctx, q, k, v):
    q, k, v = (ListSwap.apply(t, 1, 2) for t in (q, k, v))
    return ListSwap.apply(F.scaled_dot_product_attention(q, k, v), 2, 1)


def backward_the_same_way(ctx, q, k, v):
    """The backward exchanges in the forward's direction instead of back."""
    swap = _function(_swap_list, backward_same_way=True)
    q, k, v = (swap.apply(t, 1, 2) for t in (q, k, v))
    return swap.apply(F.scaled_dot_product_attention(q, k, v, is_causal=True), 2, 1)


def heads_not_moved_first(ctx, q, k, v):
    """Reshapes to [N, ...] without moving the heads first and exchanges dimension 0: the blocks exchanged are not
    head groups."""
    n = ctx.world_size
    b, h, s, d = q.shape

    def there(t):
        return _Exchange.apply(t.reshape(n, -1)).reshape(b, h // n, s * n, d)

    def back(t):
        return _Exchange.apply(t.reshape(n, -1)).reshape(b, h, s, d)
    q, k, v = (there(t) for t in (q, k, v))
    return back(F.scaled_dot_product_attention(q, k, v, is_causal=True))


class _Gather(torch.autograd.Function):
    """All-gather along the sequence, backward reduce-scatter: correct, but N times an all-to-all's bytes."""

    @staticmethod
    def forward(ctx, x):
        out = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x.contiguous())
        return torch.cat(out, dim=2)

    @staticmethod
    def backward(ctx, grad):
        pieces = [p.contiguous() for p in grad.chunk(dist.get_world_size(), dim=2)]
        out = torch.empty_like(pieces[0])
        dist.reduce_scatter(out, pieces)
        return out


def all_gather_everything(ctx, q, k, v):
    """Every rank gathers the whole q, k, v and attends for all heads, keeping its own rows."""
    n, r, s = ctx.world_size, ctx.rank, q.shape[2]
    q, k, v = (_Gather.apply(t) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, :, r * s:(r + 1) * s]


WRONG = [
    (not_differentiable, "not differentiable"),
    (not_causal, "causal mask"),
    (backward_the_same_way, "exchanges the other way"),
    (heads_not_moved_first, "dimension 0"),
    (all_gather_everything, "all-gather sends"),
]
