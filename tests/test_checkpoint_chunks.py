"""Where a rank's values sit in the single model's tensor (``mpkit.parallel.checkpoint.chunks``):
every chunk, written back at its global offsets, rebuilds exactly the elements the rank holds, and
DCP's own resharding (``create_read_items_for_chunk_list``) reads every element of a new layout
from the chunks an old one saved. One process, no world: pure index arithmetic."""
import math
import random

import pytest
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties, TensorStorageMetadata
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from mpkit.parallel import head_split
from mpkit.parallel.checkpoint.chunks import chunks_of, range_boxes, runs


def paint(shape, chunks):
    """The global tensor with each chunk written at its offsets (NaN elsewhere), and how many
    times each element was written."""
    out, count = torch.full(shape, float("nan")), torch.zeros(shape, dtype=torch.long)
    for c in chunks:
        box = tuple(slice(o, o + n) for o, n in zip(c.offsets, c.sizes))
        out[box] = c.tensor
        count[box] += 1
    return out, count


def test_runs_of_consecutive_indices():
    assert runs(torch.tensor([4, 5, 6, 0, 1, 9])) == [(0, 4, 3), (3, 0, 2), (5, 9, 1)]
    assert runs(torch.tensor([], dtype=torch.long)) == []


@pytest.mark.parametrize("shape", [(7,), (5, 6), (3, 4, 5)])
def test_range_boxes_cover_the_range_once_each_contiguous(shape):
    numel = math.prod(shape)
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    rng = random.Random(0)
    for _ in range(200):
        lo = rng.randrange(numel)
        hi = rng.randrange(lo + 1, numel + 1)
        boxes = range_boxes(shape, lo, hi)
        flat = []
        for start, sizes in boxes:
            index = torch.arange(numel).view(shape)[tuple(slice(s, s + n) for s, n in zip(start, sizes))].flatten()
            assert torch.equal(index, torch.arange(index[0], index[0] + index.numel())), "a box is contiguous"
            flat += index.tolist()
        assert flat == list(range(lo, hi))  # in order, each element once
        if len(shape) == 2:
            assert len(boxes) <= 3  # the end of a row, whole rows, the start of a row


def test_a_column_slice_is_one_chunk_and_a_qkv_head_split_three():
    full = torch.arange(24 * 8.0).view(24, 8)
    contiguous = torch.arange(6, 12)
    chunks = chunks_of(full[contiguous], [contiguous, None])
    assert [(c.offsets, c.sizes) for c in chunks] == [((6, 0), (6, 8))]
    rows = head_split(8, 2)[1]  # rank 1's heads: the same block of rows inside q, k and v
    chunks = chunks_of(full[rows], [rows, None])
    assert [(c.offsets, c.sizes) for c in chunks] == [((4, 0), (4, 8)), ((12, 0), (4, 8)), ((20, 0), (4, 8))]
    painted, count = paint((24, 8), chunks)
    assert torch.equal(painted[rows], full[rows]) and count.sum() == rows.numel() * 8


def test_every_rank_of_a_layout_together_covers_the_tensor_exactly_once():
    """tp=2 by heads x a ZeRO-1 flat range of each tp slice over dp=3: the six ranks' chunks paint
    the whole tensor once, and each chunk holds the right values (a view of the flat shard)."""
    full = torch.randn(24, 8)
    chunks = []
    for rows in head_split(8, 2):
        local = full[rows]
        flat = local.flatten().clone()
        k = math.ceil(flat.numel() / 3)
        for d in range(3):
            lo, hi = d * k, min((d + 1) * k, flat.numel())
            chunks += chunks_of(local, [rows, None], (lo, hi, flat[lo:hi]))
    painted, count = paint((24, 8), chunks)
    assert torch.equal(painted, full) and bool((count == 1).all())


def test_a_view_of_the_flat_shard_writes_through():
    """Loading writes into the chunk: it must be the shard's memory, not a copy."""
    local = torch.zeros(4, 5)
    shard = torch.zeros(9)
    (first, *rest) = chunks_of(local, None, (3, 12, shard))
    first.tensor.fill_(7.0)
    assert shard[:first.tensor.numel()].eq(7.0).all() and shard[first.tensor.numel():].eq(0.0).all()


def test_dcp_reshards_what_the_chunks_describe():
    """Saved as tp=2 by heads (3 chunks per rank), read back as 4 contiguous row blocks: DCP's
    resharding finds, for each new block, the overlapping saved chunks, and the overlaps cover it."""
    full = torch.randn(24, 8)
    saved = [c for rows in head_split(8, 2) for c in chunks_of(full[rows], [rows, None])]
    md = TensorStorageMetadata(TensorProperties.create_from_tensor(full), torch.Size((24, 8)),
                               [ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in saved])
    for block in torch.arange(24).chunk(4):
        wanted = chunks_of(full[block], [block, None])
        items = create_read_items_for_chunk_list("w", md, [ChunkStorageMetadata(torch.Size(c.offsets),
                                                                                  torch.Size(c.sizes)) for c in wanted])
        assert sum(math.prod(i.lengths) for i in items) == block.numel() * 8  # every element read once
