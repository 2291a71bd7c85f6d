"""Blockwise attention with fp32 statistics: one block of queries against one block of keys, the
merge of partial results by their log-sum-exp, and a block's backward. Ring, all-gather (Llama 3),
Ulysses and Ulysses x ring attention all compute with these three functions.

FlashAttention's rule (Dao et al. 2022; ring-flash-attention's ``update_out_and_lse`` keeps it
too): whatever the input dtype, the scores, the softmax statistics and the output accumulator are
fp32, and the result is cast to the input dtype once, at the end. A block of keys gives each
query a partial output ``out_i`` (normalised over that block) and its log-sum-exp ``lse_i``;
blocks merge exactly as

    lse = log Σ_i exp(lse_i)            out = Σ_i exp(lse_i − lse) · out_i

two at a time in ``merge``. Kept in bf16 instead, the running sum and output round at every merge
and the error grows with the number of blocks (BENCHMARKS.md: "Ring attention in bf16").

Backward (FlashAttention-2) recomputes a block's probabilities from the final ``lse``,
p = exp(s − lse), and needs one number per query, delta = Σ_d dO·O (minus the gradient of lse when
the caller used it): dS = p·(dO·Vᵀ − delta), dQ = dS·K·scale, dK = dSᵀ·Q·scale, dV = pᵀ·dO.

Grouped-query attention: K/V may have fewer heads than Q (a divisor); query head j reads K/V
head j // (heads_q / heads_kv), as ``F.scaled_dot_product_attention(enable_gqa=True)`` does, and
the K/V gradients sum over the query heads that share them.
"""
from __future__ import annotations

import torch


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """fp32 for the statistics and the output accumulator (fp64 stays fp64: reference runs)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def finite(x: torch.Tensor) -> torch.Tensor:
    """-inf (a query with no key yet) as 0, so that exp(s - lse) of masked scores stays 0, not NaN."""
    return torch.where(torch.isinf(x), torch.zeros_like(x), x)


def _heads(t: torch.Tensor, q_heads: int, dtype) -> torch.Tensor:
    return t.to(dtype).repeat_interleave(q_heads // t.shape[1], dim=1) if t.shape[1] != q_heads else t.to(dtype)


def _scores(q, k, mask, scale, dtype):
    s = (q.to(dtype) @ _heads(k, q.shape[1], dtype).transpose(-2, -1)) * scale
    return s if mask is None else s.masked_fill(~mask.to(s.device), float("-inf"))


def attend(q, k, v, mask, scale):
    """(out, lse) of one block, [b, h, sq, d] and [b, h, sq], in the accumulator dtype: ``q``'s
    rows against ``k``/``v``'s, ``mask`` [sq, sk] (True: may attend) or None for all pairs."""
    dtype = accumulator(q.dtype)
    with torch.autocast(q.device.type, enabled=False):  # under autocast a matmul would run in bf16
        s = _scores(q, k, mask, scale, dtype)
        lse = torch.logsumexp(s, dim=-1)
        return torch.exp(s - finite(lse)[..., None]) @ _heads(v, q.shape[1], dtype), lse


def merge(out, lse, block_out, block_lse):
    """The online-softmax merge of a block into the running (out, lse): both normalised partial
    outputs, rescaled by exp(lse_i − lse) so that they sum to the softmax over both blocks."""
    new = torch.logaddexp(lse, block_lse)
    safe = finite(new)
    return torch.exp(lse - safe)[..., None] * out + torch.exp(block_lse - safe)[..., None] * block_out, new


def attend_backward(q, k, v, mask, scale, grad_out, lse, delta):
    """(dq, dk, dv) of one block in the accumulator dtype, from the final ``lse`` of these queries
    and ``delta`` = Σ_d dO·O − dlse (see the module docstring); dk, dv with K/V's head count."""
    dtype = accumulator(q.dtype)
    with torch.autocast(q.device.type, enabled=False):
        s = _scores(q, k, mask, scale, dtype)
        p = torch.exp(s - finite(lse)[..., None])
        grad_out = grad_out.to(dtype)
        ds = p * (grad_out @ _heads(v, q.shape[1], dtype).transpose(-2, -1) - delta[..., None])
        dq = (ds @ _heads(k, q.shape[1], dtype)) * scale
        dk = (ds.transpose(-2, -1) @ q.to(dtype)) * scale
        dv = p.transpose(-2, -1) @ grad_out
        if k.shape[1] != q.shape[1]:  # K/V heads shared by several query heads: their gradients add
            dk, dv = (t.unflatten(1, (k.shape[1], -1)).sum(2) for t in (dk, dv))
        return dq, dk, dv


__all__ = ["accumulator", "attend", "merge", "attend_backward", "finite"]
