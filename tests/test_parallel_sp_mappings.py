"""Megatron-LM's own tests of its communication mappings, run against ``mpkit.parallel``'s functions
of the same names (issue 45).

Ported from NVIDIA/Megatron-LM ``tests/unit_tests/tensor_parallel/test_mappings.py`` (read at
commit 118369a1ca7eabb77f4eaedf2506645eb1cb2220): every case of its seven tests
(``test_CopyToModelParallelRegion``, ``test_ReduceFromModelParallelRegion``,
``test_ScatterToModelParallelRegion``, ``test_GatherFromModelParallelRegion``,
``test_ScatterToSequenceParallelRegion``, ``test_GatherFromSequenceParallelRegion``,
``test_ReduceScatterToSequenceParallelRegion``), same world (8 ranks,
``initialize_model_parallel(4, 2)``: tensor-parallel groups {0..3} and {4..7}), same inputs and
expected values. The adapter only maps names: Megatron's functions default to its
tensor-parallel group, ours take ``group=``; where Megatron calls ``_Function.backward(ctx, grad)``
directly with a stand-in ctx, we run the same gradient through the public function's backward
with autograd. Left out: its ``symbolic(...)`` checks (ONNX export). Added: the case Megatron
leaves untested, ``gather_from_sequence_parallel_region(tensor_parallel_output_grad=False)``,
and the old mpkit default it would have caught (one rank's gradient, not the group's sum).
Exact equality as in Megatron: every value is a small integer.
"""
import pytest
import torch
import torch.distributed as dist

import mpkit
from mpkit.parallel import (
    copy_to_tensor_model_parallel_region, gather_from_sequence_parallel_region, gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region, reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region, scatter_to_tensor_model_parallel_region,
)

WORLD, TP = 8, 4


def backward_of(fn, shape, grad):
    """The gradient ``fn``'s backward gives an input of ``shape`` for output gradient ``grad`` (a
    copy: f's all-reduce works in place on the gradient it is handed, as Megatron's ``_reduce``)."""
    x = torch.zeros(shape, requires_grad=True)
    fn(x).backward(grad.clone())
    return x.grad


def _cases(ctx):
    groups = [dist.new_group(list(range(i, i + TP))) for i in range(0, WORLD, TP)]
    rank = ctx.rank
    tp = groups[rank // TP]
    tp_rank = rank % TP
    offset = 4 if rank >= 4 else 0
    ones_by_rank = torch.cat([torch.ones(8) * r for r in range(TP)]) + offset  # Megatron's expected_output
    sums = torch.ones(1) * (22 if rank >= 4 else 6)  # 0+1+2+3 and 4+5+6+7
    rows = torch.vstack([torch.ones(4) * r for r in range(TP)])
    data = torch.rand((8, 4), generator=torch.Generator().manual_seed(rank))
    rank_data = torch.ones(1) * rank
    got = {}
    # test_CopyToModelParallelRegion: backward all-reduces, forward is the identity
    got["copy backward"] = (backward_of(lambda x: copy_to_tensor_model_parallel_region(x, tp), (1,), rank_data), sums)
    got["copy forward"] = (copy_to_tensor_model_parallel_region(rank_data, tp), rank_data)
    # test_ReduceFromModelParallelRegion: forward all-reduces, backward is the identity
    got["reduce forward"] = (reduce_from_tensor_model_parallel_region(rank_data.clone(), tp), sums)
    got["reduce backward"] = (backward_of(lambda x: reduce_from_tensor_model_parallel_region(x, tp), (1,), rank_data),
                              rank_data)
    # test_ScatterToModelParallelRegion: this rank's column forward, all-gather of the last dim backward
    got["scatter tp forward"] = (scatter_to_tensor_model_parallel_region(data, tp), data[:, tp_rank].reshape((8, 1)))
    got["scatter tp backward"] = (backward_of(lambda x: scatter_to_tensor_model_parallel_region(x, tp), (32,),
                                              torch.ones(8) * rank), ones_by_rank)
    # test_GatherFromModelParallelRegion: backward keeps this rank's column, forward all-gathers
    got["gather tp backward"] = (backward_of(lambda x: gather_from_tensor_model_parallel_region(x, tp), (8, 1), data),
                                 data[:, tp_rank].reshape((8, 1)))
    got["gather tp forward"] = (gather_from_tensor_model_parallel_region(torch.ones(8) * rank, tp), ones_by_rank)
    # test_ScatterToSequenceParallelRegion: rows 2·tp_rank.. forward, all-gather of the first dim backward
    got["scatter sp forward"] = (scatter_to_sequence_parallel_region(data, tp), data[2 * tp_rank:2 * tp_rank + 2, :])
    got["scatter sp backward"] = (backward_of(lambda x: scatter_to_sequence_parallel_region(x, tp), (16,),
                                              torch.ones(4) * rank), ones_by_rank.view(4, 8)[:, :4].reshape(-1))
    # test_GatherFromSequenceParallelRegion: forward all-gathers; backward (tensor_parallel_output_grad=True)
    # reduce-scatters: row tp_rank summed over the 4 ranks
    got["gather sp forward"] = (gather_from_sequence_parallel_region(torch.ones(4) * rank, group=tp),
                                ones_by_rank.view(4, 8)[:, :4].reshape(-1))
    got["gather sp backward"] = (backward_of(lambda x: gather_from_sequence_parallel_region(x, group=tp), (1, 4), rows)[0],
                                 torch.ones(4) * 4 * tp_rank)
    got["gather sp backward, output replicated"] = (
        backward_of(lambda x: gather_from_sequence_parallel_region(x, False, tp), (1, 4), rows)[0], torch.ones(4) * tp_rank)
    # test_ReduceScatterToSequenceParallelRegion: forward row tp_rank summed; backward all-gathers
    got["reduce-scatter sp forward"] = (reduce_scatter_to_sequence_parallel_region(rows, tp)[0],
                                        torch.ones(4) * 4 * tp_rank)
    got["reduce-scatter sp backward"] = (backward_of(lambda x: reduce_scatter_to_sequence_parallel_region(x, tp), (16,),
                                                     torch.ones(4) * rank), ones_by_rank.view(4, 8)[:, :4].reshape(-1))
    return {case: (g.detach(), want) for case, (g, want) in got.items()}


@pytest.fixture(scope="module")
def results():
    return mpkit.launch(_cases, WORLD, timeout=120)


CASES = ["copy backward", "copy forward", "reduce forward", "reduce backward", "scatter tp forward",
         "scatter tp backward", "gather tp backward", "gather tp forward", "scatter sp forward", "scatter sp backward",
         "gather sp forward", "gather sp backward", "gather sp backward, output replicated",
         "reduce-scatter sp forward", "reduce-scatter sp backward"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", CASES)
def test_megatron_mapping_case(results, case):
    for rank, by_case in enumerate(results):
        got, want = by_case[case]
        assert torch.equal(got, want), (rank, got, want)


def test_the_second_argument_is_megatrons_flag_not_the_group():
    # mpkit's old gather_from_sequence_parallel_region(x, group) would read a group as the flag
    with pytest.raises(TypeError, match="pass the group by name, group="):
        gather_from_sequence_parallel_region(torch.ones(2), dist.group.WORLD)
