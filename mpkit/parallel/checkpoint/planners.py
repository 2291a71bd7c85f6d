"""DCP's default planners, taught one more leaf: ``Sharded`` (a tensor of which this rank holds
several chunks, each with its global offsets).

DCP plans a save in two steps: each rank lists its write items (one per chunk, keyed by the
tensor's name and the chunk's global offsets), and the coordinator de-duplicates items that
several ranks offer (replicas) and builds the metadata: every tensor's global shape and the
chunks it was saved as. Loading is the mirror: each rank lists the chunks it needs, and
``create_read_items_for_chunk_list`` (DCP's resharding) intersects them with the saved chunks, one
read item per overlap. Only the leaf type is new here; the planning, de-duplication and
resharding are DCP's own. (``ShardedTensor`` would need the global metadata of every shard,
without overlaps, on every rank, which replicas on load cannot give; ``DTensor`` holds one
rectangular chunk per rank, which a qkv weight split by heads or a ZeRO-1 range is not.)
"""
from __future__ import annotations

import dataclasses
import math

import torch

from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.default_planner import (create_default_local_load_plan,
                                                          create_default_local_save_plan)
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadPlan, SavePlan, TensorWriteData, WriteItem,
                                                  WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.staging import AsyncStager

from mpkit.parallel.checkpoint.chunks import Chunk, Sharded


def _split(state_dict):
    plain = {k: v for k, v in state_dict.items() if not isinstance(v, Sharded)}
    return plain, {k: v for k, v in state_dict.items() if isinstance(v, Sharded)}


class SavePlanner(DefaultSavePlanner):
    """One write item per chunk of every ``Sharded``; DCP's default for everything else. (DCP's
    coordinator then checks that each tensor's chunks cover it exactly once, without overlap: a
    layout with a hole fails the save before any byte is written.)"""

    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def create_local_plan(self) -> SavePlan:
        plain, sharded = _split(self.state_dict)
        items = list(create_default_local_save_plan(plain, self.is_coordinator).items)
        for fqn, value in sharded.items():
            items += [_write_item(fqn, value, chunk) for chunk in value.chunks]
        self.plan = SavePlan(items)
        return self.plan

    def lookup_object(self, index: MetadataIndex):
        value = self.state_dict[index.fqn]
        return value.at(index.offset) if isinstance(value, Sharded) else super().lookup_object(index)


def _write_item(fqn: str, value: Sharded, chunk) -> WriteItem:
    return WriteItem(index=MetadataIndex(fqn, chunk.offsets), type=WriteItemType.SHARD,
                     tensor_data=TensorWriteData(chunk=_chunk_md(chunk),
                                                 properties=TensorProperties.create_from_tensor(chunk.tensor),
                                                 size=torch.Size(value.shape)))


def _chunk_md(chunk) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(chunk.offsets), sizes=torch.Size(chunk.sizes))


@dataclasses.dataclass
class LoadReport:
    """What one rank read: the bytes it needed (the overlaps of its chunks with the saved ones)
    and the bytes the file reader reads for them (it reads each overlapping saved chunk whole),
    in ``items`` read items from ``files`` files."""

    needed_bytes: int = 0
    read_bytes: int = 0
    items: int = 0
    files: int = 0


class LoadPlanner(DefaultLoadPlanner):
    """Read items for every chunk of every ``Sharded`` (DCP's ``create_read_items_for_chunk_list``:
    the resharding), DCP's default for everything else; keeps a ``LoadReport`` of the final plan."""

    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.report = LoadReport()

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        # DCP's version first turns meta tensors into real ones, walking every value; a Sharded has none
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def create_local_plan(self) -> LoadPlan:
        plain, sharded = _split(self.state_dict)
        items = list(create_default_local_load_plan(plain, self.metadata, True).items)
        for fqn, value in sharded.items():
            wanted = [_chunk_md(c) for c in value.chunks]
            items += create_read_items_for_chunk_list(fqn, self.metadata.state_dict_metadata[fqn], wanted)
        return LoadPlan(items)

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        storage = self.metadata.storage_data or {}
        report = LoadReport(items=len(new_plan.items))
        files = set()
        for item in new_plan.items:
            md = self.metadata.state_dict_metadata[item.dest_index.fqn]
            size = md.properties.dtype.itemsize if isinstance(md, TensorStorageMetadata) else 0
            report.needed_bytes += math.prod(item.lengths) * size
            info = storage.get(item.storage_index)
            if info is not None:
                report.read_bytes += info.length
                files.add(info.relative_path)
        report.files = len(files)
        self.report = report
        return new_plan

    def lookup_tensor(self, index: MetadataIndex):
        value = self.state_dict[index.fqn]
        return value.at(index.offset) if isinstance(value, Sharded) else super().lookup_tensor(index)


class Snapshot(AsyncStager):
    """``async_save``'s staging step, chunk by chunk: each chunk copied (only its own elements, not
    the whole buffer a view lives in, as a deep copy of the dict would), so training may change the
    live tensors while a background thread writes the copies. Complete when ``stage`` returns."""

    _synchronize_after_execute = False

    def stage(self, state_dict):
        return {key: _copy(value) for key, value in state_dict.items()}

    def close(self) -> None:
        pass


def _copy(value):
    if isinstance(value, Sharded):
        return Sharded(value.shape, [Chunk(c.offsets, c.tensor.detach().clone()) for c in value.chunks])
    return value.detach().clone()
