"""A reference for ring attention's numerics: ring-flash-attention's algorithm on torch's CPU flash kernel.

The algorithm follows zhuzilin/ring-flash-attention at commit 899628238f2f5bb8c028579c89b7cd56ea451d2a:
``ring_flash_attn/ring_flash_attn.py`` (``ring_flash_attn_forward``: one flash-attention call per
block, ``causal`` only on the diagonal step 0, blocks of later ranks skipped; ``ring_flash_attn_backward``:
one flash backward per block with the merged output and log-sum-exp, dq/dk/dv accumulated in fp32,
dk/dv travelling with their block) and ``ring_flash_attn/utils.py`` (``update_out_and_lse``: the
merge in fp32, ``out - sigmoid(lse_b - lse)·(out - out_b)``, ``lse - logsigmoid(lse - lse_b)``).
Written here from that description, not copied. Two substitutions make it run on a CPU:
flash-attn's CUDA kernel is torch's CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, which returns the block's output in the
input dtype and its fp32 log-sum-exp, and its ``_backward``), and the N ranks are a loop in one
process (at step s rank r holds rank (r-s) mod N's K/V, as the messages would bring it; the
merges and the gradient sums happen in the same order as on N ranks).

``truth`` is attention in float64 on the same (bf16-rounded) inputs; ``errors`` the mean and max
absolute error of an output and of the concatenated gradients against it. Used by
``benchmarks/ring_attention_bf16.py`` (the BENCHMARKS table) and
``tests/test_ring_attention_bf16.py`` (mpkit's ring within 2x of this reference in bf16).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _update_out_and_lse(out, lse, block_out, block_lse):
    """ring-flash-attention's fp32 merge (utils.py), on [b, h, s, d] outputs and [b, h, s] lse."""
    block_out, block_lse = block_out.float(), block_lse[..., None]
    if out is None:
        return block_out, block_lse
    return out - torch.sigmoid(block_lse - lse) * (out - block_out), lse - F.logsigmoid(lse - block_lse)


def reference_ring(q, k, v, dout, world: int, causal: bool):
    """Output (bf16), lse (fp32) and dq, dk, dv (bf16) of ring_flash_attn_func's algorithm over
    ``world`` contiguous shards of [b, h, s, d] bf16 inputs, gathered back into whole tensors."""
    qs, ks, vs, douts = (t.chunk(world, dim=2) for t in (q, k, v, dout))
    scale = q.shape[-1] ** -0.5
    outs, lses = [], []
    for r in range(world):
        out = lse = None
        for step in range(world):
            owner = (r - step) % world
            if not causal or step <= r:
                block_out, block_lse = _flash(qs[r], ks[owner], vs[owner], 0.0, causal and step == 0, scale=scale)
                out, lse = _update_out_and_lse(out, lse, block_out, block_lse)
        outs.append(out.to(q.dtype))
        lses.append(lse.squeeze(-1))
    dq = [None] * world
    dk = [torch.zeros_like(ks[0], dtype=torch.float32) for _ in range(world)]
    dv = [torch.zeros_like(vs[0], dtype=torch.float32) for _ in range(world)]
    for r in range(world):  # each rank's queries, against every block it computed
        for step in range(world):
            owner = (r - step) % world
            if not causal or step <= r:
                bq, bk, bv = _flash_backward(douts[r], qs[r], ks[owner], vs[owner], outs[r], lses[r], 0.0,
                                             causal and step == 0, scale=scale)
                dq[r] = bq.float() if dq[r] is None else dq[r] + bq
                dk[owner] += bk  # the travelling fp32 accumulator of the owner's block
                dv[owner] += bv
    cat = lambda ts: torch.cat([t.to(q.dtype) for t in ts], dim=2)  # noqa: E731
    return cat(outs), torch.cat(lses, dim=2), cat(dq), cat(dk), cat(dv)


def truth(q, k, v, dout, causal: bool):
    """Output, lse and gradients of attention in float64 on the same inputs."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ v
    out.backward(dout.double())
    return out.detach(), s.logsumexp(-1).detach(), q.grad, k.grad, v.grad


def sdpa_bf16(q, k, v, dout, causal: bool):
    """torch's own bf16 attention on one device: output and gradients."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(dout)
    return out.detach(), None, q.grad, k.grad, v.grad


def errors(result, want) -> dict:
    """Mean and max |error| of the output and of the gradients (dq, dk, dv together) against ``want``."""
    out = (result[0].double() - want[0]).abs()
    grads = torch.cat([(g.double() - w).abs().reshape(-1) for g, w in zip(result[2:], want[2:])])
    found = {"out mean": out.mean().item(), "out max": out.max().item(), "grad mean": grads.mean().item(),
             "grad max": grads.max().item()}
    if result[1] is not None:
        found["lse max"] = (result[1].double() - want[1]).abs().max().item()
    return found


def inputs(seed: int, batch=1, heads=5, seq=1024, dim=128, dtype=torch.bfloat16):
    """q, k, v, dout as ring-flash-attention's tests draw them (normal, bf16), [b, h, s, d]."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq, dim, generator=g).to(dtype) for _ in range(4)]
