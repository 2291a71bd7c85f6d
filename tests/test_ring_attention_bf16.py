"""Ring attention in bf16 is as accurate as a flash-attention-style ring (issue 45): its output and
gradient errors against float64 stay within 2x of ring-flash-attention's algorithm run on torch's
CPU flash kernel (``benchmarks/_common/ring_flash_reference.py``, which says which file and commit it
follows), on the same inputs, for 2 ranks, causal and not. The statistics and accumulators are
fp32, so the log-sum-exp is returned in fp32 and within 1e-5 of float64's.

Measured (BENCHMARKS.md "Ring attention in bf16", sequence 1024): mpkit's errors are 0.4-0.7x the
reference's; before the fp32 accumulators they were about 5x. The bound 2x is the issue's; an
error of 5x or more fails it. Accuracy, not timing: the numbers are deterministic.
"""
import importlib.util
from pathlib import Path

import pytest
import torch

import mpkit
from mpkit.parallel import ring_attention, shard_sequence

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "_common" / "ring_flash_reference.py"
spec = importlib.util.spec_from_file_location("ring_flash_reference", SCRIPT)
reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference)

SEEDS, SHAPE = (0, 1), dict(heads=2, seq=256, dim=64)


def _ours(ctx, causal):
    results = []
    for seed in SEEDS:
        q, k, v, d = reference.inputs(seed, **SHAPE)
        q, k, v = (shard_sequence(t, dim=2, split="contiguous").requires_grad_() for t in (q, k, v))
        out, lse = ring_attention(q, k, v, causal=causal, split="contiguous", return_lse=True)
        out.backward(shard_sequence(d, dim=2, split="contiguous"))
        results.append([t.detach() for t in (out, lse, q.grad, k.grad, v.grad)])
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("causal", [True, False])
def test_bf16_error_within_twice_the_reference_ring(causal):
    shards = mpkit.launch(_ours, 2, args=(causal,), timeout=100)
    for i, seed in enumerate(SEEDS):
        ours = [torch.cat([rank[i][j] for rank in shards], dim=2) for j in range(5)]
        assert ours[0].dtype == torch.bfloat16 and ours[1].dtype == torch.float32
        q, k, v, d = reference.inputs(seed, **SHAPE)
        want = reference.truth(q, k, v, d, causal)
        mine = reference.errors(ours, want)
        ref = reference.errors(reference.reference_ring(q, k, v, d, 2, causal), want)
        for key in ("out mean", "out max", "grad mean", "grad max"):
            assert mine[key] <= 2 * ref[key], (seed, key, mine[key], ref[key])
        assert mine["lse max"] <= 1e-5
