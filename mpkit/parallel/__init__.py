"""``mpkit.parallel``: the mechanisms the labs teach, on any ``nn.Module``, in any process group.

Every class here works in a world made by ``mpkit.launch``, by ``torchrun``, or by a plain
``torch.distributed.init_process_group`` — no mpkit context needed. Inside ``mpkit.launch`` their
communication is also recorded into the rank's trace and memory, so ``mpkit.plot`` draws a
learner's own model too. The built-in strategies of ``mpkit.train`` are thin users of these same
classes: one implementation per mechanism.

- ``DataParallel``: replicas, bucketed all-reduce of gradients, overlap with backward, ``no_sync``.
- ``ShardedOptimizer``: ZeRO-1 — any elementwise ``torch.optim`` optimizer with its state sharded.
- ``ColumnParallelLinear``, ``RowParallelLinear``, ``tensor_parallel``: Megatron tensor parallel.
- ``pipeline``: GPipe, 1F1B, interleaved, looped BFS and zero-bubble schedules over an ``nn.Sequential``,
  a stage list, or only this rank's stages.
- ``sequence_parallel``: Megatron sequence parallelism (LayerNorm/residual split along the sequence);
  Megatron's mappings by name (``copy_to_tensor_model_parallel_region``, ...,
  ``reduce_scatter_to_sequence_parallel_region``), sequence dimension first.
- ``ring_attention``, ``all_gather_attention``, ``ulysses_attention``, ``usp_attention``: context
  parallelism, attention over a split sequence (fp32 statistics, log-sum-exp, varlen, three splits).
- ``expert_parallel``: the experts of any MoE layer (a router and an experts list) spread over ranks,
  all-to-all dispatch and combine, with a capacity or dropless; ``synchronize_expert_gradients``.
- ``MixedPrecision``, ``LossScaler``, ``autocast_layers``: bf16/fp16 compute with fp32 master weights,
  fp16's dynamic loss scaling; ``recompute_layers``: full or selective recomputation.
- ``Layout``: the dp x pp x tp rank grid of 3D parallelism (and the planner's cp dimension); ``ring_all_reduce``: a collective by hand.
- ``checkpoint`` (a subpackage: ``from mpkit.parallel import checkpoint``): distributed checkpoints of
  any layout above on ``torch.distributed.checkpoint``, loaded into any other, committed atomically.
"""
from mpkit.parallel.collectives import ring_all_reduce
from mpkit.parallel.buckets import plan_buckets
from mpkit.parallel.checks import broadcast_module
from mpkit.parallel.data_parallel import DataParallel
from mpkit.layout import Layout
from mpkit.parallel.pipeline import Pipeline, pipeline, schedule, simulate
from mpkit.parallel.precision import LossScaler, MixedPrecision, autocast_layers
from mpkit.parallel.recompute import recompute_layers
from mpkit.parallel.sharded_optimizer import ShardedOptimizer
from mpkit.parallel.sequence_parallel import all_reduce_sequence_parallel_gradients, sequence_parallel
from mpkit.parallel.mappings import (
    copy_to_tensor_model_parallel_region, gather_from_sequence_parallel_region, gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region, reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region, scatter_to_tensor_model_parallel_region,
)
from mpkit.parallel.context_parallel import (
    all_gather_attention, context_parallel_attention, ring_attention, ring_work, sequence_positions, shard_sequence,
    ulysses_attention, usp_attention,
)
from mpkit.parallel.expert_parallel import (
    expert_load, expert_parallel, expert_parameters, full_expert_parameters, synchronize_expert_gradients,
)
from mpkit.parallel.functional import all_to_all
from mpkit.parallel.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, Split, full_parameters, head_split, tensor_parallel,
)

__all__ = ["DataParallel", "ShardedOptimizer", "ColumnParallelLinear", "RowParallelLinear", "Split",
           "tensor_parallel", "full_parameters", "head_split", "pipeline", "Pipeline", "schedule", "simulate",
           "Layout", "plan_buckets", "broadcast_module", "ring_all_reduce",
           "sequence_parallel", "all_reduce_sequence_parallel_gradients", "scatter_to_sequence_parallel_region",
           "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
           "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
           "scatter_to_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region", "ring_attention", "all_gather_attention", "ulysses_attention",
           "usp_attention", "sequence_positions",
           "shard_sequence", "ring_work", "context_parallel_attention", "expert_parallel", "expert_parameters",
           "full_expert_parameters", "expert_load", "synchronize_expert_gradients", "all_to_all",
           "MixedPrecision", "LossScaler", "autocast_layers", "recompute_layers"]
