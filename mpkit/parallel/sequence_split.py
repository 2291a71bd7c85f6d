"""Which tokens each context-parallel rank holds, and which query-key blocks it must compute.

Context parallelism cuts every sequence over the N ranks of a group. How it is cut decides how
evenly a causal mask spreads the work (``ring_work``):

- ``"contiguous"``: rank r holds block r of N (ring-flash-attention's ``ring_flash_attn_func``).
  Under a causal mask rank 0's queries see one block, the last rank's all N: unequal work.
- ``"zigzag"`` (the default; Megatron-Core's and Llama 3's load-balanced split,
  ring-flash-attention's ``zigzag_ring_flash_attn_func``, torch's ``_HeadTailLoadBalancer``): the
  sequence is cut into 2N chunks and rank r holds chunks r and 2N-1-r, so every rank computes the
  same number of scores, and whole chunk pairs above the diagonal are skipped.
- ``"striped"`` (Brandon et al. 2023, ring-flash-attention's ``stripe_flash_attn_func``): rank r
  holds tokens r, r+N, r+2N, ...; every block pair is half masked, evenly.

A packed batch of variable-length sequences (``cu_seqlens``, the cumulative lengths as
flash-attn's varlen API takes them: ``[0, len_0, len_0+len_1, ...]``, the same on every rank) is
cut sequence by sequence: each sequence is split as above and a rank's rows are its part of
sequence 0, then of sequence 1, and so on (ring-flash-attention's varlen functions do the same;
they take the local cumulative lengths, ``cu_seqlens // N``, where mpkit takes the global ones). A
token attends only to tokens of its own sequence.

``Placement`` is one rank's tokens (sequence and position of every local row, and the runs of rows
a block is made of); ``block_pairs`` lists the (query rows, key rows, mask) blocks worth
computing between two placements under a causal mask and a sliding window (flash-attn's
``window_size=(left, right)``: query i sees keys i-left .. i+right, -1 for no limit).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

SPLITS = ("zigzag", "contiguous", "striped")


def resolve_split(split: str | None, balanced: bool | None) -> str:
    """``split``, or the older ``balanced`` flag (True: zigzag, False: contiguous); zigzag by default."""
    if split is None:
        return "contiguous" if balanced is False else "zigzag"
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is unknown; use one of {', '.join(map(repr, SPLITS))}")
    if balanced is not None and balanced != (split != "contiguous"):
        raise ValueError(f"balanced={balanced} contradicts split={split!r}; pass only split= "
                         f"(balanced=True is 'zigzag', balanced=False is 'contiguous')")
    return split


def parts(split: str, cp: int) -> int:
    """Equal pieces a sequence is cut into: 2·cp for zigzag, cp otherwise."""
    return 2 * cp if split == "zigzag" else cp


def split_positions(seq_len: int, cp: int, rank: int, split: str) -> torch.Tensor:
    """Positions (0 .. seq_len-1) of ``rank``'s tokens of one sequence, in the rank's row order."""
    n = parts(split, cp)
    if seq_len % n:
        what = {"zigzag": "2·cp for the load-balanced split", "contiguous": "one per rank",
                "striped": "cp stripes"}[split]
        raise ValueError(f"context parallel: seq_len={seq_len} cannot be cut into {n} equal chunks ({what}); use a "
                         f"sequence length that is a multiple of {n}")
    if split == "striped":
        return torch.arange(rank, seq_len, cp)
    chunks = torch.arange(seq_len).chunk(n)
    return torch.cat([chunks[rank], chunks[n - 1 - rank]]) if split == "zigzag" else chunks[rank]


def sequence_positions(seq_len: int, cp: int, rank: int, balanced: bool | None = None, *,
                       split: str | None = None) -> torch.Tensor:
    """Global positions of ``rank``'s tokens: ``split`` = ``"zigzag"`` (the default, also
    ``balanced=True``: chunks ``rank`` and ``2·cp-1-rank`` of ``2·cp``), ``"contiguous"``
    (``balanced=False``: block ``rank`` of ``cp``) or ``"striped"`` (every cp-th token from ``rank``)."""
    return split_positions(seq_len, cp, rank, resolve_split(split, balanced))


def lengths_of(cu_seqlens) -> list[int]:
    """Sequence lengths from cumulative ones, checked: ``[0, ..., total]``, increasing."""
    cu = [int(c) for c in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
    if len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens={cu} must be cumulative sequence lengths starting at 0, as flash-attn's varlen "
                         f"API takes them: [0, len_0, len_0+len_1, ...]")
    return [b - a for a, b in zip(cu, cu[1:])]


@dataclass(frozen=True)
class Placement:
    """One rank's tokens: ``seq`` and ``pos`` (sequence index and position in it) of every local
    row, ``rows`` their index in the packed global batch, and ``runs``, the slices of local rows
    that blocks are made of (one per chunk: two per sequence for zigzag)."""

    seq: torch.Tensor
    pos: torch.Tensor
    rows: torch.Tensor
    runs: tuple


@functools.lru_cache(maxsize=256)
def placement(lengths: tuple, cp: int, rank: int, split: str) -> Placement:
    """``rank``'s tokens of sequences of ``lengths`` (one for a plain batch), split by ``split``."""
    seqs, poss, rows, runs, start, row = [], [], [], [], 0, 0
    per_run = 2 if split == "zigzag" else 1
    for index, length in enumerate(lengths):
        pos = split_positions(length, cp, rank, split)
        seqs.append(torch.full_like(pos, index))
        poss.append(pos)
        rows.append(pos + start)
        size = len(pos) // per_run
        runs += [slice(row + i * size, row + (i + 1) * size) for i in range(per_run) if size]
        start, row = start + length, row + len(pos)
    return Placement(torch.cat(seqs), torch.cat(poss), torch.cat(rows), tuple(runs))


def shard_sequence(x: torch.Tensor, group=None, dim: int = 1, balanced: bool | None = None, *,
                   split: str | None = None, cu_seqlens=None, ulysses_group=None) -> torch.Tensor:
    """This rank's tokens of ``x`` (the whole sequence, or the packed batch of ``cu_seqlens``,
    along ``dim``), placed as ``split`` says. With ``ulysses_group`` (Ulysses x ring), ``group``
    is the ring group and this rank keeps its Ulysses part of its ring shard (yunchang's
    ``extract_local``)."""
    split = resolve_split(split, balanced)
    lengths = tuple(lengths_of(cu_seqlens)) if cu_seqlens is not None else (x.shape[dim],)
    rows = placement(lengths, dist.get_world_size(group), dist.get_rank(group), split).rows
    if ulysses_group is not None:
        size = dist.get_world_size(ulysses_group)
        if len(rows) % size:
            raise ValueError(f"Ulysses x ring: this rank's {len(rows)} tokens of its ring shard cannot be cut into "
                             f"ulysses={size} equal parts; use sequence lengths whose shard per ring rank is a "
                             f"multiple of {size}")
        rows = rows.chunk(size)[dist.get_rank(ulysses_group)]
    return x.index_select(dim, rows.to(x.device))


def block_mask(q: Placement, k: Placement, qs: slice, ks: slice, causal: bool, window: tuple) -> torch.Tensor:
    """Which (query, key) pairs of two runs may attend: same sequence, causal, inside the window."""
    mask = q.seq[qs, None] == k.seq[None, ks]
    dist_ = q.pos[qs, None] - k.pos[None, ks]  # how far back the key lies
    left, right = window
    if causal:
        mask &= dist_ >= 0
    if left >= 0:
        mask &= dist_ <= left
    if right >= 0:
        mask &= dist_ >= -right
    return mask


def block_pairs(q: Placement, k: Placement, causal: bool, window: tuple = (-1, -1)) -> list:
    """[(query rows, key rows, mask or None)] of the blocks worth computing between two ranks'
    tokens: a block with no pair left is skipped, one with every pair needs no mask."""
    out = []
    for qs in q.runs:
        for ks in k.runs:
            mask = block_mask(q, k, qs, ks, causal, window)
            if mask.all():
                out.append((qs, ks, None))
            elif mask.any():
                out.append((qs, ks, mask))
    return out


@functools.lru_cache(maxsize=256)
def ring_plan(lengths: tuple, cp: int, rank: int, split: str, causal: bool, window: tuple) -> tuple:
    """``block_pairs`` of ``rank``'s queries with every rank's keys: one list per key owner."""
    mine = placement(lengths, cp, rank, split)
    return tuple(block_pairs(mine, placement(lengths, cp, owner, split), causal, window) for owner in range(cp))


@functools.lru_cache(maxsize=64)
def ulysses_plan(lengths: tuple, cp: int, split: str, causal: bool, window: tuple) -> tuple:
    """The block one rank computes after Ulysses' all-to-all: every rank's tokens, gathered in rank
    order, against themselves, as one block (one softmax with one mask: ordinary attention on the
    whole sequence, as any kernel would compute it)."""
    places = [placement(lengths, cp, r, split) for r in range(cp)]
    seq, pos, rows = (torch.cat([getattr(p, f) for p in places]) for f in ("seq", "pos", "rows"))
    whole = Placement(seq, pos, rows, (slice(0, len(rows)),))
    return (block_pairs(whole, whole, causal, window),)


def ring_work(seq_len: int, cp: int, rank: int, balanced: bool | None = None, causal: bool = True, *,
              split: str | None = None) -> int:
    """Query-key scores ``rank`` computes in one ring-attention forward (per batch and head): what
    the load-balanced split evens out across the ranks (a masked block is computed whole)."""
    plan = ring_plan((seq_len,), cp, rank, resolve_split(split, balanced), causal, (-1, -1))
    return sum((qs.stop - qs.start) * (ks.stop - ks.start) for pairs in plan for qs, ks, _ in pairs)


__all__ = ["SPLITS", "sequence_positions", "shard_sequence", "ring_work", "Placement", "placement", "block_pairs",
           "ring_plan", "ulysses_plan", "resolve_split", "lengths_of"]
