"""Context parallelism: attention over a sequence split across the ranks of a group.

The mechanism in ~35 lines (causal attention, each of N ranks holding block r of the sequence's
queries, keys and values [b, heads, s/N, head_dim]; the code below adds the backward, the
load-balanced split, the other layouts and the checks)::

    def ring(q, k, v):                                    # ring attention
        out = torch.zeros(q.shape)                        # fp32 accumulators whatever q's dtype
        lse = torch.full(q.shape[:-1], -math.inf)         # each query's log-sum-exp so far
        kv = torch.stack([k, v])
        for step in range(N):
            if step < N - 1:                              # pass kv on while this block is computed
                nxt = torch.empty_like(kv)
                hops = [dist.isend(kv, (r + 1) % N), dist.irecv(nxt, (r - 1) % N)]
            owner = (r - step) % N                        # whose tokens kv holds now
            if owner <= r:                                # causal: later tokens are never seen
                s = q.float() @ kv[0].float().transpose(-2, -1) / math.sqrt(q.shape[-1])
                if owner == r:                            # the diagonal block: mask its upper half
                    s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
                block_lse = s.logsumexp(-1)               # this block's partial softmax and output
                block_out = (s - block_lse[..., None]).exp() @ kv[1].float()
                new = torch.logaddexp(lse, block_lse)     # merge: lse = log(e^lse + e^lse_b) and
                out = (lse - new).exp()[..., None] * out + (block_lse - new).exp()[..., None] * block_out
                lse = new                                 # out = Σ exp(lse_i - lse)·out_i
            if step < N - 1:
                for hop in hops:
                    hop.wait()
                kv = nxt
        return out.to(q.dtype)                            # one rounding, at the end

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
backward passing the key/value blocks around again), ``all_gather_attention`` (Llama 3),
``ulysses_attention`` (its local attention is the same fp32 block code, one block over the whole
sequence), ``usp_attention`` (Ulysses x ring), ``context_parallel_attention``. The autograd
functions and the checks are in ``parallel/ring_functions.py``, the block numerics in
``parallel/attention_blocks.py``, the splits and the blocks a mask leaves to compute in
``parallel/sequence_split.py``.

Every layer but attention works token by token, so a long sequence can be cut into CP shards and
each rank keeps only its own tokens' activations. Attention needs every key for every query; the
ways to give it them, and what other projects call them:

- **Ring attention** (Liu et al. 2023; Megatron-Core/TransformerEngine's CP "p2p", torch's
  ``context_parallel`` with ``set_rotate_method("alltoall")`` → ``_templated_ring_attention``,
  ring-flash-attention's ``ring_flash_attn_func``): each rank keeps its queries and passes its
  key/value block around the ring, CP-1 hops, the next hop's transfer overlapping this block's
  compute (it hides when a block's compute outlasts its transfer: a minimum chunk size). The
  partial softmaxes merge by their log-sum-exp, so the result is exact. Backward passes the
  key/value blocks around again, with their gradient accumulators (fp32) travelling along and
  returning to the owner after the last hop. Each rank sends 2·(CP-1)/CP·s·h_kv values per layer.
- **All-gather K/V** (Llama 3 §3.3.2; Megatron-Core's "allgather"; torch's default rotate method
  ``"allgather"``; ring-flash-attention's ``llama3_flash_attn_varlen_func``): one all-gather of every rank's K/V
  up front, the same blocks computed, one reduce-scatter of their gradients in backward. Not
  overlapped, but simpler, and small when K/V are small (grouped-query attention).
- **Ulysses** (Jacobs et al. 2023, DeepSpeed's ``DistributedAttention``): all-to-alls of Q, K and V
  (often fused into one) swap the sequence split for a head split, each rank runs ordinary
  attention over the whole sequence for H/CP heads, and one all-to-all of the output swaps back:
  O(s·h/CP) per rank per all-to-all, constant when s and CP grow together, but CP ≤ heads.
- **Ulysses x ring** (USP, yunchang's ``LongContextAttention``): Ulysses inside a group, ring
  attention across such groups.

Numerics: scores, softmax statistics and output accumulator in fp32 whatever the input dtype,
cast once at the end (``attention_blocks``); ``return_lse=True`` returns the fp32 log-sum-exp too
(it has a gradient). Layouts: ``"bhsd"`` ([batch, heads, seq, head_dim], SDPA's), ``"bshd"``
(flash-attn's and yunchang's) and ``"thd"`` (a packed batch [tokens, heads, head_dim] with
``cu_seqlens``, flash-attn's varlen API). ``softmax_scale`` (default
1/√head_dim), ``window_size=(left, right)`` (sliding window, as flash-attn), grouped-query K/V
(fewer heads). Dropout is refused: the same mask would have to be drawn again for each block in
backward (ring-flash-attention does not support it either). Every call first checks, in one
small all-gather, that the ranks agree on the shapes and options (else gloo aborts the process,
or the ranks compute different functions, silently). Messages go through
``mpkit.observe.active.comm()``: inside ``mpkit.launch`` each hop is a traced ``send``/``recv``.
"""
from __future__ import annotations

import torch.distributed as dist

from mpkit.parallel.functional import all_to_all, even_sizes
from mpkit.parallel.ring_functions import (
    LOCAL, AllGatherAttention, RingAttention, agree, attend_sharded, from_bhsd, lse_layout, options, to_bhsd,
)
from mpkit.parallel.sequence_split import ring_work, sequence_positions, shard_sequence, ulysses_plan


def ring_attention(q, k, v, group=None, *, causal: bool = True, split: str | None = None, balanced: bool | None = None,
                   layout: str = "bhsd", softmax_scale: float | None = None, window_size=(-1, -1), cu_seqlens=None,
                   return_lse: bool = False, dropout_p: float = 0.0, name: str = "attention"):
    """Ring attention over ``group`` (see the module docstring). ``q, k, v``: this rank's tokens in
    ``layout``, placed as ``shard_sequence(..., split=split, cu_seqlens=cu_seqlens)`` places them
    (``split``: "zigzag" (default; also ``balanced=True``), "contiguous" (``balanced=False``) or
    "striped"). Returns the output in ``q``'s dtype and layout, and with ``return_lse=True`` also
    the fp32 log-sum-exp ([b, heads, local_seq], or [heads, local_tokens] for "thd")."""
    opts = options(q, k, v, group, causal, split, balanced, layout, softmax_scale, window_size, cu_seqlens,
                   dropout_p, name, "ring_attention")
    return attend_sharded(RingAttention, q, k, v, group, opts, return_lse)


def all_gather_attention(q, k, v, group=None, *, causal: bool = True, split: str | None = None,
                         balanced: bool | None = None, layout: str = "bhsd", softmax_scale: float | None = None,
                         window_size=(-1, -1), cu_seqlens=None, return_lse: bool = False, dropout_p: float = 0.0,
                         name: str = "attention"):
    """Llama 3's context parallelism over ``group``: all-gather every rank's K/V, attend this
    rank's queries to them, reduce-scatter the K/V gradients back. Same arguments and result as
    ``ring_attention``."""
    opts = options(q, k, v, group, causal, split, balanced, layout, softmax_scale, window_size, cu_seqlens,
                   dropout_p, name, "all_gather_attention")
    return attend_sharded(AllGatherAttention, q, k, v, group, opts, return_lse)


def ulysses_attention(q, k, v, group=None, *, causal: bool = True, split: str | None = None,
                      balanced: bool | None = None, layout: str = "bhsd", softmax_scale: float | None = None,
                      window_size=(-1, -1), cu_seqlens=None, return_lse: bool = False, dropout_p: float = 0.0,
                      name: str = "attention"):
    """DeepSpeed-Ulysses attention over ``group``: all-to-alls from sequence to head shards, attention
    over the whole sequence for this rank's heads, an all-to-all back. Same arguments and result
    as ``ring_attention``. Heads the group does not divide are split as DeepSpeed does: the first
    H mod N ranks take one head (or one group of query heads sharing a K/V head) more."""
    opts = options(q, k, v, group, causal, split, balanced, layout, softmax_scale, window_size, cu_seqlens,
                   dropout_p, name, "ulysses_attention")
    q4, k4, v4 = (to_bhsd(t, layout) for t in (q, k, v))
    agree(q4, k4, opts, group)
    plan = ulysses_plan(opts.lengths, dist.get_world_size(group), opts.split, opts.causal, opts.window)
    return _ulysses(q4, k4, v4, group, LOCAL, plan, opts, return_lse)


def usp_attention(q, k, v, ulysses_group, ring_group, *, causal: bool = True, split: str | None = None,
                  balanced: bool | None = None, layout: str = "bhsd", softmax_scale: float | None = None,
                  window_size=(-1, -1), cu_seqlens=None, return_lse: bool = False, dropout_p: float = 0.0,
                  name: str = "attention"):
    """Ulysses x ring (USP; yunchang's ``LongContextAttention``) on a 2-D group: Ulysses' all-to-alls
    inside ``ulysses_group`` gather this ring rank's shard for H/U heads, ring attention across
    ``ring_group`` (the ranks holding the same heads of the other shards), all-to-all back. The
    tokens sit as ``shard_sequence(x, ring_group, ..., ulysses_group=ulysses_group)`` puts them:
    ring rank r's shard (``split`` over the ring), cut into U equal parts. Same options as
    ``ring_attention``."""
    u, r = dist.get_world_size(ulysses_group), dist.get_world_size(ring_group)
    opts = options(q, k, v, ring_group, causal, split, balanced, layout, softmax_scale, window_size, cu_seqlens,
                   dropout_p, name, "usp_attention", tokens_per_rank=to_bhsd(q, layout).shape[2] * u)
    q4, k4, v4 = (to_bhsd(t, layout) for t in (q, k, v))
    agree(q4, k4, opts, ulysses_group)
    agree(q4, k4, opts, ring_group)
    return _ulysses(q4, k4, v4, ulysses_group, ring_group, opts.plan(r, dist.get_rank(ring_group)), opts, return_lse)


def _ulysses(q, k, v, group, ring_group, plan, opts, return_lse):
    """All-to-all to head shards over ``group``, attention (a ring over ``ring_group``), back."""
    heads, kv_heads = head_split(q.shape[1], k.shape[1], dist.get_world_size(group), opts.what)
    q, k, v = (all_to_all(t, 1, 2, group, f"ulysses {c} {opts.name}", scatter_sizes=sizes)
               for t, c, sizes in zip((q, k, v), "qkv", (heads, kv_heads, kv_heads)))
    out, lse = RingAttention.apply(q, k, v, plan, opts.scale, ring_group, opts.name)
    out = from_bhsd(all_to_all(out, 2, 1, group, f"ulysses out {opts.name}", gather_sizes=heads), opts.layout)
    if not return_lse:
        return out
    return out, lse_layout(all_to_all(lse, 2, 1, group, f"ulysses lse {opts.name}", gather_sizes=heads), opts.layout)


def head_split(heads: int, kv_heads: int, n: int, what: str = "ulysses_attention") -> tuple[list, list]:
    """(query heads, K/V heads) per rank: K/V heads as DeepSpeed splits uneven heads, each rank's
    query heads the ones that read its K/V heads. ValueError when a rank would get none."""
    if kv_heads < n:
        fits = [d for d in range(1, kv_heads + 1) if kv_heads % d == 0]
        kind = "key/value heads (grouped-query attention)" if kv_heads != heads else "heads"
        raise ValueError(f"{what}: Ulysses splits the heads over the group's {n} ranks, but there are only {kv_heads} "
                         f"{kind}, so a rank would get none; use a group of at most {kv_heads} ranks (group sizes "
                         f"that split them evenly: {fits}), or ring attention, or Ulysses x ring (usp_attention) "
                         f"with a Ulysses group of at most {kv_heads}")
    kv = even_sizes(kv_heads, n)
    return [heads // kv_heads * x for x in kv], kv


def context_parallel_attention(kind: str = "ring", group=None, *, balanced: bool = True, **options):
    """``attention(q, k, v)`` for a model's causal attention core: ``"ring"``, ``"all-gather"`` or
    ``"ulysses"`` over ``group`` (``options``: the keywords those functions take)."""
    if kind not in KINDS:
        raise ValueError(f"attention={kind!r} is unknown; use one of {', '.join(KINDS)}")
    fn = KINDS[kind]

    def attention(q, k, v):
        return fn(q, k, v, group, causal=True, balanced=balanced, **options)
    return attention


KINDS = {"ring": ring_attention, "all-gather": all_gather_attention, "ulysses": ulysses_attention}
ATTENTION = ("ring", "ulysses")  # what the cp and 3d strategies run (their cost-model programs price these)

__all__ = ["ring_attention", "all_gather_attention", "ulysses_attention", "usp_attention", "sequence_positions",
           "shard_sequence", "context_parallel_attention", "ring_work", "head_split", "RingAttention",
           "AllGatherAttention", "ATTENTION", "KINDS"]
