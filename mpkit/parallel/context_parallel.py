"""Context parallelism: attention over a sequence split across the ranks of a group.

The mechanism in ~30 lines (causal attention, each of N ranks holding block r of the sequence's
queries, keys and values [b, heads, s/N, head_dim]; the code below adds the backward, the
load-balanced split and the checks)::

    def ring(q, k, v):                                    # ring attention
        out, lse = torch.zeros_like(q), torch.full(q.shape[:-1], -math.inf)
        kv = torch.stack([k, v])
        for step in range(N):
            if step < N - 1:                              # pass kv on while this block is computed
                nxt = torch.empty_like(kv)
                hops = [dist.isend(kv, (r + 1) % N), dist.irecv(nxt, (r - 1) % N)]
            owner = (r - step) % N                        # whose tokens kv holds now
            if owner <= r:                                # causal: later tokens are never seen
                s = q @ kv[0].transpose(-2, -1) / math.sqrt(q.shape[-1])
                if owner == r:                            # the diagonal block: mask its upper half
                    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
                new = torch.logaddexp(lse, s.logsumexp(-1))   # online softmax: merge by log-sum-exp
                out = (lse - new).exp()[..., None] * out + (s - new[..., None]).exp() @ kv[1]
                lse = new
            if step < N - 1:
                for hop in hops:
                    hop.wait()
                kv = nxt
        return out

    def all_to_all(x, split_dim, cat_dim):                # block j of split_dim to rank j
        send = torch.stack(x.chunk(N, dim=split_dim)).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        return torch.cat(recv.unbind(0), dim=cat_dim)     # what arrived, in rank order

    def ulysses(q, k, v):                                 # Ulysses
        q, k, v = (all_to_all(t, 1, 2) for t in (q, k, v))      # -> [b, heads/N, s, d]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return all_to_all(y, 2, 1)                        # -> [b, heads, s/N, d]

In the code: ``ring_attention`` (``RingAttention``: the ring above as one autograd function, its
backward passing the key/value blocks around again), ``ulysses_attention`` (``functional.all_to_all``,
differentiable), ``context_parallel_attention``; then ``sequence_positions`` and the block pairs a
causal mask leaves to compute.

Every layer but attention works token by token, so a long sequence can be cut into CP shards and
each rank keeps only its own tokens' activations. Attention needs every key for every query; two
ways to give it them:

- **Ring attention** (Liu et al. 2023; Megatron-Core CP, torch's ``context_parallel``): each rank
  keeps its queries and passes its key/value block around the ring, CP-1 hops, the next hop's
  transfer overlapping this block's compute. The partial softmaxes are merged with their
  log-sum-exp (the online softmax of FlashAttention), so the result is exact. Backward passes the
  key/value blocks around again, with their gradient accumulators travelling along and returning
  to the owner after the last hop.
- **Ulysses** (Jacobs et al. 2023, DeepSpeed): an all-to-all swaps the sequence split for a head
  split, each rank runs ordinary attention over the whole sequence for H/CP heads, and a second
  all-to-all swaps back. Needs H divisible by CP.

Causal masking: with contiguous shards rank 0's queries see one block and the last rank's see all
of them, so the ranks do unequal work. The load-balanced split (``sequence_positions(...,
balanced=True)``) cuts the sequence into 2·CP chunks and gives rank i chunks i and 2·CP-1-i:
every rank then computes the same number of query-key pairs, and whole chunk pairs above the
diagonal are skipped, not computed and masked.

Tensors are [batch, heads, local_seq, head_dim] (``F.scaled_dot_product_attention``'s layout);
every rank's tokens sit at the global positions ``sequence_positions`` gives. Messages go through
``mpkit.observe.active.comm()``: inside ``mpkit.launch`` each hop is a traced ``send``/``recv``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mpkit.parallel.collectives import Ring
from mpkit.parallel.functional import all_to_all


def ring_attention(q, k, v, group=None, *, causal: bool = True, balanced: bool = True, name: str = "attention"):
    """Ring attention over ``group`` (see the module docstring). ``q, k, v``: this rank's tokens,
    [batch, heads, local_seq, head_dim], placed as ``sequence_positions(seq, cp, rank, balanced)``."""
    n = dist.get_world_size(group)
    seq = q.shape[-2] * n
    positions = [sequence_positions(seq, n, r, balanced) for r in range(n)]
    return RingAttention.apply(q, k, v, positions, 2 if balanced else 1, causal, group, name)


def ulysses_attention(q, k, v, group=None, *, causal: bool = True, balanced: bool = True, name: str = "attention"):
    """DeepSpeed-Ulysses attention over ``group``: all-to-all from sequence to head shards, full
    attention over H/CP heads, all-to-all back. Same inputs as ``ring_attention``."""
    n = dist.get_world_size(group)
    if q.shape[1] % n:
        raise ValueError(f"Ulysses attention splits the heads: {q.shape[1]} heads cannot be cut into cp={n} "
                         f"equal parts; use a number of heads the cp size divides, or ring attention")
    q, k, v = (all_to_all(t, 1, 2, group, f"ulysses {c} {name}") for t, c in zip((q, k, v), "qkv"))
    mask = None
    if causal:  # the gathered sequence is the ranks' shards in rank order, at these global positions
        order = torch.cat([sequence_positions(q.shape[2], n, r, balanced) for r in range(n)]).to(q.device)
        mask = order[:, None] >= order[None, :]
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return all_to_all(y, 2, 1, group, f"ulysses out {name}")


ATTENTION = {"ring": ring_attention, "ulysses": ulysses_attention}


def context_parallel_attention(kind: str = "ring", group=None, *, balanced: bool = True):
    """``attention(q, k, v)`` for a model's causal attention core: ``"ring"`` or ``"ulysses"`` over ``group``."""
    if kind not in ATTENTION:
        raise ValueError(f"attention={kind!r} is unknown; use one of {', '.join(ATTENTION)}")
    fn = ATTENTION[kind]

    def attention(q, k, v):
        return fn(q, k, v, group, causal=True, balanced=balanced)
    return attention


def sequence_positions(seq_len: int, cp: int, rank: int, balanced: bool = True) -> torch.Tensor:
    """Global positions of ``rank``'s tokens: contiguous block ``rank`` of ``cp``, or (``balanced``)
    chunks ``rank`` and ``2·cp-1-rank`` of ``2·cp``."""
    parts = 2 * cp if balanced else cp
    if seq_len % parts:
        raise ValueError(f"context parallel: seq_len={seq_len} cannot be cut into {parts} equal chunks "
                         f"({'2·cp for the load-balanced split' if balanced else 'one per rank'}); use a "
                         f"sequence length that is a multiple of {parts}")
    chunks = torch.arange(seq_len).chunk(parts)
    return torch.cat([chunks[rank], chunks[parts - 1 - rank]]) if balanced else chunks[rank]


def shard_sequence(x: torch.Tensor, group=None, dim: int = 1, balanced: bool = True) -> torch.Tensor:
    """This rank's tokens of ``x`` (the whole sequence along ``dim``), as ``sequence_positions`` places them."""
    pos = sequence_positions(x.shape[dim], dist.get_world_size(group), dist.get_rank(group), balanced)
    return x.index_select(dim, pos.to(x.device))


def ring_work(seq_len: int, cp: int, rank: int, balanced: bool = True, causal: bool = True) -> int:
    """Query-key scores ``rank`` computes in one ring-attention forward (per batch and head): what
    the load-balanced split evens out across the ranks."""
    parts, positions = (2 if balanced else 1), [sequence_positions(seq_len, cp, r, balanced) for r in range(cp)]
    return sum((qs.stop - qs.start) * (ks.stop - ks.start) for owner in range(cp)
               for qs, ks, _ in _pairs(positions[rank], positions[owner], parts, causal))


class RingAttention(torch.autograd.Function):
    """Exact attention with this rank's queries and every rank's keys/values, passed around the ring."""

    @staticmethod
    def forward(ctx, q, k, v, positions, parts, causal, group, name):
        ring = Ring(group)
        n, me = ring.size, ring.rank
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        for step in range(n):
            owner = (me - step) % n
            works, incoming = [], None
            if step < n - 1:  # the next block travels while this one is computed
                incoming = torch.empty_like(kv)
                works = ring.post(kv, incoming, f"ring kv {name} hop {step}")
            for qs, ks, mask in _pairs(positions[me], positions[owner], parts, causal):
                s = _scores(q[..., qs, :], kv[0][..., ks, :], mask, scale)
                block_lse = torch.logsumexp(s, dim=-1)
                block_out = torch.exp(s - _finite(block_lse)[..., None]) @ kv[1][..., ks, :]
                new = torch.logaddexp(lse[..., qs], block_lse)  # the online-softmax merge
                safe = _finite(new)
                out[..., qs, :] = (torch.exp(lse[..., qs] - safe)[..., None] * out[..., qs, :]
                                   + torch.exp(block_lse - safe)[..., None] * block_out)
                lse[..., qs] = new
            for work in works:
                work.wait()
            kv = incoming if incoming is not None else kv
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (positions, parts, causal, group, name, scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        positions, parts, causal, group, name, scale = ctx.args
        ring = Ring(group)
        n, me = ring.size, ring.rank
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1)  # D_i = Σ_j dO_ij · O_ij, FlashAttention's backward term
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)  # the gradient of the block held now; travels with it
        for step in range(n):
            owner = (me - step) % n
            works, incoming = [], None
            if step < n - 1:
                incoming = torch.empty_like(kv)
                works = ring.post(kv, incoming, f"ring kv {name} backward hop {step}")
            for qs, ks, mask in _pairs(positions[me], positions[owner], parts, causal):
                s = _scores(q[..., qs, :], kv[0][..., ks, :], mask, scale)
                p = torch.exp(s - _finite(lse[..., qs])[..., None])
                dkv[1][..., ks, :] += p.transpose(-2, -1) @ grad_out[..., qs, :]
                ds = p * (grad_out[..., qs, :] @ kv[1][..., ks, :].transpose(-2, -1) - delta[..., qs, None])
                dq[..., qs, :] += (ds @ kv[0][..., ks, :]) * scale
                dkv[0][..., ks, :] += (ds.transpose(-2, -1) @ q[..., qs, :]) * scale
            if n > 1:  # the accumulator moves on with its block; after n hops it is home
                arriving = torch.empty_like(dkv)
                works += ring.post(dkv, arriving, f"ring dkv {name} hop {step}")
            for work in works:
                work.wait()
            if n > 1:
                kv, dkv = (incoming if incoming is not None else kv), arriving
        return dq, dkv[0], dkv[1], None, None, None, None, None


def _runs(positions: torch.Tensor, parts: int):
    """The query (or key) rows in ``parts`` runs of contiguous positions: [(slice, first, last)]."""
    size = len(positions) // parts
    return [(slice(i * size, (i + 1) * size), int(positions[i * size]), int(positions[(i + 1) * size - 1]))
            for i in range(parts)]


def _pairs(q_pos, k_pos, parts, causal):
    """(query rows, key rows, mask or None) of every chunk pair worth computing: under a causal
    mask a pair wholly above the diagonal is skipped, one wholly below needs no mask."""
    out = []
    for qs, q0, q1 in _runs(q_pos, parts):
        for ks, k0, k1 in _runs(k_pos, parts):
            if not causal or k1 <= q0:
                out.append((qs, ks, None))
            elif k0 <= q1:
                out.append((qs, ks, q_pos[qs, None] >= k_pos[None, ks]))
    return out


def _scores(q, k, mask, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    return s if mask is None else s.masked_fill(~mask.to(s.device), float("-inf"))


def _finite(x):
    return torch.where(torch.isinf(x), torch.zeros_like(x), x)


__all__ = ["ring_attention", "ulysses_attention", "sequence_positions", "shard_sequence",
           "context_parallel_attention", "ring_work", "RingAttention", "ATTENTION"]
