"""Where this rank's tensors sit inside the single model's tensors: each as a list of rectangular
chunks (global offsets, sizes, the local values), the unit DCP saves, looks up and reshards.

A tensor-parallel slice keeps the rows (or columns) ``indices[rank]`` of the full weight: along
that dimension local index i is global index ``indices[rank][i]``. Every dimension has such an
index map (None: the identity), and each run of consecutive global indices is one chunk, so a
contiguous slice is one chunk and a qkv weight split by heads is three (its q, k and v rows).

ZeRO-1 keeps a 1-D range [lo, hi) of the *flattened* local tensor. In row-major order such a range
is at most three boxes for a matrix (the end of one row, whole rows, the start of another),
``range_boxes``; each box is contiguous in the flat shard, so it is a view of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Chunk:
    """``tensor`` holds the global tensor's box starting at ``offsets`` (its sizes: ``tensor.shape``).
    It is a view of the live tensor: saving reads it, loading writes into it."""

    offsets: tuple
    tensor: torch.Tensor

    @property
    def sizes(self) -> tuple:
        return tuple(self.tensor.shape)


@dataclass
class Sharded:
    """This rank's part of a tensor of global ``shape``: one or more chunks."""

    shape: tuple
    chunks: list

    def at(self, offsets) -> torch.Tensor:
        """The chunk starting at global ``offsets`` (what a DCP ``MetadataIndex`` names)."""
        offsets = tuple(offsets)
        for chunk in self.chunks:
            if chunk.offsets == offsets:
                return chunk.tensor
        raise KeyError(f"no chunk at offsets {offsets}")


def runs(indices: torch.Tensor) -> list[tuple[int, int, int]]:
    """(local start, global start, length) of each run of consecutive global indices in ``indices``."""
    values = indices.tolist()
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            out.append((start, values[start], i - start))
            start = i
    return out


def range_boxes(shape, lo: int, hi: int) -> list[tuple[tuple, tuple]]:
    """(start, sizes) boxes covering elements [lo, hi) of a row-major tensor of ``shape``, in
    order; each is contiguous in the flattening (every dimension after its first varying one whole)."""
    if lo >= hi:
        return []
    if len(shape) <= 1:
        return [((lo,), (hi - lo,))] if shape else [((), ())]
    inner = math.prod(shape[1:])
    first, last = lo // inner, (hi - 1) // inner
    if first == last:  # inside one row
        return [((first, *s), (1, *z)) for s, z in range_boxes(shape[1:], lo - first * inner, hi - first * inner)]
    boxes, whole_from, whole_to = [], -(-lo // inner), hi // inner
    if lo % inner:  # the end of the first row
        boxes += [((first, *s), (1, *z)) for s, z in range_boxes(shape[1:], lo % inner, inner)]
    if whole_from < whole_to:
        boxes.append(((whole_from, *([0] * (len(shape) - 1))), (whole_to - whole_from, *shape[1:])))
    if hi % inner:  # the start of the last row
        boxes += [((last, *s), (1, *z)) for s, z in range_boxes(shape[1:], 0, hi % inner)]
    return boxes


def chunks_of(local: torch.Tensor, maps=None, flat=None) -> list[Chunk]:
    """This rank's chunks of a tensor whose local values are ``local`` (for ``flat``: its shape only).

    ``maps``: per dimension a 1-D tensor of global indices (None or a None entry: identity).
    ``flat``: (lo, hi, data) when this rank holds only elements [lo, hi) of ``local``'s
    flattening, in the 1-D tensor ``data`` (a ZeRO-1 shard's slice).
    """
    shape = tuple(local.shape)
    maps = list(maps) if maps is not None else [None] * len(shape)
    if flat is None:
        boxes = [(tuple(0 for _ in shape), shape, local)]
    else:
        lo, hi, data = flat
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        boxes = []
        for start, sizes in range_boxes(shape, lo, hi):
            first = sum(s * st for s, st in zip(start, strides)) - lo
            boxes.append((start, sizes, data[first:first + math.prod(sizes)].view(sizes)))
    out = []
    for start, sizes, view in boxes:
        pieces = [[(0, start[d], sizes[d])] if maps[d] is None else
                  [(a, g, n) for a, g, n in runs(maps[d][start[d]:start[d] + sizes[d]])]
                  for d in range(len(shape))]
        for combo in _product(pieces):
            sub = view
            for d, (a, _, n) in enumerate(combo):
                sub = sub.narrow(d, a, n) if maps[d] is not None else sub
            out.append(Chunk(tuple(g for _, g, _ in combo), sub))
    return out


def _product(lists):
    if not lists:
        yield ()
        return
    for head in lists[0]:
        for tail in _product(lists[1:]):
            yield (head, *tail)
