"""The autograd functions of ring and all-gather (Llama 3) context parallelism, and the checked
options every context-parallel call shares (``parallel/context_parallel.py`` is the public side,
with the mechanism in its docstring).

``RingAttention``: this rank's queries against every rank's keys/values, the K/V block passed
around the ring while the current one is computed; backward passes the K/V blocks around again,
each with its fp32 gradient accumulator travelling along, home after the last hop.
``AllGatherAttention``: every rank's K/V all-gathered at once, the same blocks computed, the K/V
gradients reduce-scattered to their owners. Both compute each block with
``attention_blocks.attend`` and merge by log-sum-exp in fp32, and both return (output in the
input dtype, fp32 log-sum-exp). ``options`` checks a call on this rank; ``agree`` checks, with one
small all-gather, that every rank of the group made the same call.
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.distributed as dist

from mpkit.observe import active
from mpkit.parallel.attention_blocks import accumulator, attend, attend_backward, merge
from mpkit.parallel.checks import check_agree
from mpkit.parallel.collectives import Ring
from mpkit.parallel.sequence_split import SPLITS, lengths_of, resolve_split, ring_plan

LAYOUTS = ("bhsd", "bshd", "thd")
LOCAL = SimpleNamespace(size=1, rank=0)  # a "ring" of one rank (Ulysses: the attention after the all-to-all)


@dataclass(frozen=True)
class Options:
    """One call's checked settings; ``lengths``: the global sequence lengths (one for a plain batch)."""

    causal: bool
    split: str
    layout: str
    scale: float
    window: tuple
    lengths: tuple
    name: str
    what: str

    def plan(self, cp: int, rank: int) -> tuple:
        return ring_plan(self.lengths, cp, rank, self.split, self.causal, self.window)


def options(q, k, v, group, causal, split, balanced, layout, softmax_scale, window_size, cu_seqlens, dropout_p, name,
            what, tokens_per_rank=None) -> Options:
    """The settings of a call, checked on this rank (``tokens_per_rank``: how many of the global
    tokens one rank of ``group`` holds, default its local rows)."""
    if layout not in LAYOUTS:
        raise ValueError(f"{what}: layout={layout!r} is unknown; use 'bhsd' ([batch, heads, seq, head_dim]), 'bshd' "
                         f"([batch, seq, heads, head_dim]) or 'thd' (packed [tokens, heads, head_dim] with cu_seqlens)")
    if dropout_p:
        raise ValueError(f"{what}: dropout_p={dropout_p} is not supported: each block's dropout mask would have to be "
                         f"drawn again in backward (ring-flash-attention refuses it too); use dropout_p=0.0 and "
                         f"apply dropout outside attention")
    q4, k4, v4 = (to_bhsd(t, layout) for t in (q, k, v))
    _check_shapes(q4, k4, v4, what)
    window = tuple(int(w) for w in window_size)
    if len(window) != 2 or min(window) < -1:
        raise ValueError(f"{what}: window_size={window_size!r} must be (left, right), each >= 0 or -1 for no limit")
    n = dist.get_world_size(group)
    local = q4.shape[2] if tokens_per_rank is None else tokens_per_rank
    lengths = (local * n,) if cu_seqlens is None else tuple(lengths_of(cu_seqlens))
    if cu_seqlens is not None and (q4.shape[0] != 1 or sum(lengths) != local * n):
        raise ValueError(f"{what}: cu_seqlens={[int(c) for c in cu_seqlens]} describes {sum(lengths)} tokens, but this "
                         f"rank holds {local} of {n} equal shares ({local * n}): pass layout='thd' tensors holding "
                         f"this rank's share of every sequence (shard_sequence(x, group, dim=0, cu_seqlens=...))")
    scale = 1.0 / math.sqrt(q4.shape[-1]) if softmax_scale is None else float(softmax_scale)
    opts = Options(bool(causal), resolve_split(split, balanced), layout, scale, window, lengths, name, what)
    for r in range(n):  # every rank's share must split: the error here, not in another rank's plan
        opts.plan(n, r)
    return opts


def agree(q4, k4, opts: Options, group) -> None:
    """The ranks of ``group`` pass the same shapes and options (one small all-gather)."""
    values = {"batch size": q4.shape[0], "number of query heads": q4.shape[1], "number of key/value heads": k4.shape[1],
              "head dimension": q4.shape[3], "local sequence length": q4.shape[2],
              "split": SPLITS.index(opts.split), "causal flag": opts.causal, "window_size left": opts.window[0],
              "window_size right": opts.window[1], "softmax_scale": struct.unpack("<q", struct.pack("<d", opts.scale))[0],
              "cu_seqlens": zlib.crc32(repr(opts.lengths).encode())}
    shown = {"split": lambda c: repr(SPLITS[c]), "causal flag": lambda c: str(bool(c)),
             "softmax_scale": lambda c: f"{struct.unpack('<d', struct.pack('<q', c))[0]:.6g}",
             "cu_seqlens": lambda c: f"cu_seqlens checksum {c}"}
    check_agree(values, group, opts.what, "call it with the same shapes and options on every rank of the group: it "
                "exchanges blocks of one size (gloo aborts on another), and a different split, mask or scale "
                "computes another function on each rank", shown, device=q4.device)


def attend_sharded(function, q, k, v, group, opts: Options, return_lse: bool):
    q4, k4, v4 = (to_bhsd(t, opts.layout) for t in (q, k, v))
    agree(q4, k4, opts, group)
    plan = opts.plan(dist.get_world_size(group), dist.get_rank(group))
    out, lse = function.apply(q4, k4, v4, plan, opts.scale, group, opts.name)
    out = from_bhsd(out, opts.layout)
    return (out, lse_layout(lse, opts.layout)) if return_lse else out


def to_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "thd":
        return t.transpose(0, 1).unsqueeze(0)
    return t.transpose(1, 2) if layout == "bshd" else t


def from_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "thd":
        return t.squeeze(0).transpose(0, 1)
    return t.transpose(1, 2) if layout == "bshd" else t


def lse_layout(lse: torch.Tensor, layout: str) -> torch.Tensor:
    """[b, h, s] as flash-attn returns it; [h, tokens] for a packed batch (its varlen API)."""
    return lse.squeeze(0) if layout == "thd" else lse


def _check_shapes(q, k, v, what) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"{what}: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} (as [batch, heads, seq, "
                         f"head_dim]) must share batch, sequence and head_dim, k and v their shape")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{what}: {q.shape[1]} query heads cannot share {k.shape[1]} key/value heads (grouped-query "
                         f"attention needs a divisor); use a number of K/V heads that divides {q.shape[1]}")


def _ring(group):
    return LOCAL if group is LOCAL else Ring(group)


def _forward_blocks(q, kv, pairs, out, lse, scale) -> None:
    for qs, ks, mask in pairs:
        block_out, block_lse = attend(q[..., qs, :], kv[0][..., ks, :], kv[1][..., ks, :], mask, scale)
        out[..., qs, :], lse[..., qs] = merge(out[..., qs, :], lse[..., qs], block_out, block_lse)


def _backward_blocks(q, kv, pairs, scale, grad_out, lse, delta, dq, dkv) -> None:
    for qs, ks, mask in pairs:
        dq_b, dk_b, dv_b = attend_backward(q[..., qs, :], kv[0][..., ks, :], kv[1][..., ks, :], mask, scale,
                                           grad_out[..., qs, :], lse[..., qs], delta[..., qs])
        dq[..., qs, :] += dq_b
        dkv[0][..., ks, :] += dk_b
        dkv[1][..., ks, :] += dv_b


def _start(q):
    """The fp32 output accumulator and log-sum-exp of ``q``'s rows, before any block."""
    dtype = accumulator(q.dtype)
    return q.new_zeros(q.shape, dtype=dtype), q.new_full(q.shape[:-1], float("-inf"), dtype=dtype)


def _kept(ctx, q, k, v, out, lse, args):
    """Save what backward recomputes from (the fp32 output and lse); return (output in q's dtype, lse)."""
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = args
    return out.to(q.dtype), lse


def _delta(grad_out, grad_lse, out):
    """FlashAttention's per-query Σ_d dO·O, less the gradient of the returned log-sum-exp."""
    delta = (grad_out.to(out.dtype) * out).sum(-1)
    return delta if grad_lse is None else delta - grad_lse.to(out.dtype)


class RingAttention(torch.autograd.Function):
    """Exact attention with this rank's queries and every rank's keys/values, passed around the
    ring; returns (output in q's dtype, fp32 log-sum-exp). ``plan[owner]``: the blocks of this
    rank's queries and ``owner``'s keys worth computing."""

    @staticmethod
    def forward(ctx, q, k, v, plan, scale, group, name):
        ring = _ring(group)
        n, me = ring.size, ring.rank
        out, lse = _start(q)
        kv = torch.stack([k, v]).contiguous()  # travels in the input dtype
        for step in range(n):
            works, incoming = [], None
            if step < n - 1:  # the next block travels while this one is computed
                incoming = torch.empty_like(kv)
                works = ring.post(kv, incoming, f"ring kv {name} hop {step}")
            _forward_blocks(q, kv, plan[(me - step) % n], out, lse, scale)
            for work in works:
                work.wait()
            kv = incoming if incoming is not None else kv
        return _kept(ctx, q, k, v, out, lse, (plan, scale, group, name))

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        plan, scale, group, name = ctx.args
        ring = _ring(group)
        n, me = ring.size, ring.rank
        delta = _delta(grad_out, grad_lse, out)
        dq = torch.zeros_like(out)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros(kv.shape, dtype=out.dtype, device=kv.device)  # the held block's gradient, fp32; travels with it
        for step in range(n):
            works, incoming = [], None
            if step < n - 1:
                incoming = torch.empty_like(kv)
                works = ring.post(kv, incoming, f"ring kv {name} backward hop {step}")
            _backward_blocks(q, kv, plan[(me - step) % n], scale, grad_out, lse, delta, dq, dkv)
            if n > 1:  # the accumulator moves on with its block; after n hops it is home
                arriving = torch.empty_like(dkv)
                works += ring.post(dkv, arriving, f"ring dkv {name} hop {step}")
            for work in works:
                work.wait()
            if n > 1:
                kv, dkv = (incoming if incoming is not None else kv), arriving
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None


class AllGatherAttention(torch.autograd.Function):
    """Llama 3's variant: every rank's K/V all-gathered (forward, and again in backward rather than
    kept), the same blocks as the ring, the K/V gradients reduce-scattered to their owners."""

    @staticmethod
    def forward(ctx, q, k, v, plan, scale, group, name):
        every = _gather_kv(k, v, group, f"all-gather kv {name} forward")
        out, lse = _start(q)
        for owner, kv in enumerate(every):
            _forward_blocks(q, kv, plan[owner], out, lse, scale)
        return _kept(ctx, q, k, v, out, lse, (plan, scale, group, name))

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        plan, scale, group, name = ctx.args
        every = _gather_kv(k, v, group, f"all-gather kv {name} backward")
        delta = _delta(grad_out, grad_lse, out)
        dq = torch.zeros_like(out)
        dkv = torch.zeros(every.shape, dtype=out.dtype, device=every.device)  # [n, 2, ...]: every owner's, fp32
        for owner, kv in enumerate(every):
            _backward_blocks(q, kv, plan[owner], scale, grad_out, lse, delta, dq, dkv[owner])
        mine = dkv.new_empty(dkv.shape[1:])
        active.comm().reduce_scatter_tensor(mine, dkv.flatten(0, 1), group=group, name=f"reduce-scatter dkv {name}")
        return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), None, None, None, None


def _gather_kv(k, v, group, name):
    kv = torch.stack([k, v]).contiguous()
    n = dist.get_world_size(group)
    every = kv.new_empty((n * 2, *kv.shape[1:]))
    active.comm().all_gather_into_tensor(every, kv, group=group, name=name)
    return every.view(n, *kv.shape)


__all__ = ["RingAttention", "AllGatherAttention", "Options", "options", "agree", "attend_sharded", "to_bhsd",
           "from_bhsd", "lse_layout", "LAYOUTS", "LOCAL"]
