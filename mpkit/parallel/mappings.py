"""Megatron-LM's communication mappings under Megatron's names and semantics
(``megatron/core/tensor_parallel/mappings.py``), over any process group.

Each is one autograd function: a collective forward and its conjugate backward. The tensor-parallel
ones cut the last dimension (the hidden features), the sequence-parallel ones the sequence
dimension, which is the first, as Megatron lays activations out ([s, b, h]; ``seq_dim=1`` for
[b, s, h]).

| name | forward | backward |
|---|---|---|
| ``copy_to_tensor_model_parallel_region`` (f) | identity | all-reduce |
| ``reduce_from_tensor_model_parallel_region`` (g) | all-reduce | identity |
| ``scatter_to_tensor_model_parallel_region`` | keep this rank's slice of the last dim | all-gather (last dim) |
| ``gather_from_tensor_model_parallel_region`` | all-gather (last dim) | keep this rank's slice |
| ``scatter_to_sequence_parallel_region`` | keep this rank's sequence shard | all-gather |
| ``gather_from_sequence_parallel_region`` | all-gather the sequence | reduce-scatter (``tensor_parallel_output_grad=True``, the default: the gathered tensor feeds TP layers, whose gradients are partial sums) or keep this rank's shard (``False``: it feeds replicated layers) |
| ``reduce_scatter_to_sequence_parallel_region`` | reduce-scatter the sequence | all-gather |

Differences from Megatron, all in the arguments' defaults: ``group=None`` is the whole world
(Megatron's is its tensor-parallel group, from ``parallel_state``); Megatron's
``output_split_sizes``/``input_split_sizes`` (uneven shards, for MoE) and ``use_global_buffer``
are not taken. ``name`` labels the traced collectives. Every call first checks, with one small
all-gather, that the ranks pass tensors of one shape (gloo aborts the process otherwise). These are
the very functions mpkit's own layers use: ``tensor_parallel``'s ``CopyToParallelRegion`` and
``ReduceFromParallelRegion``, ``sequence_parallel``'s scatter, gather and reduce-scatter.
"""
from __future__ import annotations

from mpkit.parallel.checks import check_same_shape
from mpkit.parallel.sequence_parallel import (
    GatherFromSequenceParallelRegion, ReduceScatterToSequenceParallelRegion, ScatterToSequenceParallelRegion,
)
from mpkit.parallel.tensor_parallel import CopyToParallelRegion, ReduceFromParallelRegion


def copy_to_tensor_model_parallel_region(input_, group=None, *, name: str = "copy_to_tensor_model_parallel_region"):
    """f: identity forward, all-reduce of the gradient backward (in front of a column-parallel layer)."""
    _same_shape(input_, group, name)
    return CopyToParallelRegion.apply(input_, group, name)


def reduce_from_tensor_model_parallel_region(input_, group=None, *,
                                             name: str = "reduce_from_tensor_model_parallel_region"):
    """g: all-reduce forward, identity backward (after a row-parallel layer)."""
    _same_shape(input_, group, name)
    return ReduceFromParallelRegion.apply(input_, group, name)


def scatter_to_tensor_model_parallel_region(input_, group=None, *,
                                            name: str = "scatter_to_tensor_model_parallel_region"):
    """This rank's slice of the last dimension forward, all-gather of the gradient backward."""
    _same_shape(input_, group, name)
    return ScatterToSequenceParallelRegion.apply(input_, -1, group, name)


def gather_from_tensor_model_parallel_region(input_, group=None, *,
                                             name: str = "gather_from_tensor_model_parallel_region"):
    """All-gather along the last dimension forward, this rank's slice of the gradient backward."""
    _same_shape(input_, group, name)
    return GatherFromSequenceParallelRegion.apply(input_, -1, group, name, False)


def scatter_to_sequence_parallel_region(input_, group=None, *, seq_dim: int = 0,
                                        name: str = "scatter_to_sequence_parallel_region"):
    """Enter the region: this rank's shard of the sequence forward, all-gather backward."""
    _same_shape(input_, group, name)
    return ScatterToSequenceParallelRegion.apply(input_, seq_dim, group, name)


def gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad: bool = True, group=None, *,
                                         seq_dim: int = 0, name: str = "gather_from_sequence_parallel_region"):
    """All-gather the sequence forward. Backward: reduce-scatter (``tensor_parallel_output_grad=True``,
    Megatron's default: the gathered tensor feeds tensor-parallel layers) or this rank's shard of
    the gradient (``False``: it leaves the region for replicated layers, as in front of a head)."""
    if not isinstance(tensor_parallel_output_grad, bool):
        raise TypeError(f"gather_from_sequence_parallel_region: tensor_parallel_output_grad="
                        f"{tensor_parallel_output_grad!r} must be True or False; its second argument is that flag, "
                        f"as in Megatron: pass the group by name, group=...")
    _same_shape(input_, group, name)
    return GatherFromSequenceParallelRegion.apply(input_, seq_dim, group, name, tensor_parallel_output_grad)


def reduce_scatter_to_sequence_parallel_region(input_, group=None, *, seq_dim: int = 0,
                                               name: str = "reduce_scatter_to_sequence_parallel_region"):
    """Reduce-scatter the sequence forward (after a row-parallel layer), all-gather backward."""
    _same_shape(input_, group, name)
    return ReduceScatterToSequenceParallelRegion.apply(input_, seq_dim, group, name)


def _same_shape(x, group, name):
    check_same_shape(x, group, name, "pass tensors of one shape on every rank of the group (a collective exchanges "
                     "blocks of one size; gloo aborts the process on another)")


MEGATRON_NAMES = ("copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
                  "scatter_to_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region",
                  "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
                  "reduce_scatter_to_sequence_parallel_region")

__all__ = list(MEGATRON_NAMES)
