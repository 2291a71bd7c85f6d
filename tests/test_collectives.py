"""mpkit.parallel.collectives.ring_all_reduce: the same sums as dist.all_reduce, and exactly the bytes the
ring formula 2(N-1)/N·S promises, read from the rank's own send events."""
import pytest
import torch
import torch.distributed as dist

import mpkit
from mpkit.parallel.collectives import ring_all_reduce, ring_bytes_sent, ring_chunks
from mpkit.sim.formulas import ring_allreduce_bytes


def _data(rank, numel, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(numel, generator=gen).to(dtype)


def _compare(ctx, numel, op="sum", wire_dtype=None, shape=None):
    """Ring result, dist.all_reduce result of the same data, and this rank's send events."""
    x = _data(ctx.rank, numel)
    if shape is not None:
        x = x.view(shape)
    reference = x.clone()
    dist.all_reduce(reference)
    if op == "avg":
        reference /= ctx.world_size
    before = len(ctx.trace.events)
    out = ring_all_reduce(ctx, x, op=op, wire_dtype=wire_dtype)
    events = ctx.trace.events[before:]
    sends = [(e.bytes, e.name) for e in events if e.kind == "send"]
    return {"same_object": out is x, "result": x.clone(), "reference": reference, "sends": sends,
            "recv_bytes": sum(e.bytes for e in events if e.kind == "recv"),
            "other_kinds": sorted({e.kind for e in events} - {"send", "recv"})}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_matches_dist_all_reduce_and_the_byte_formula(world_size, no_leftovers):
    numel = 1200  # divisible by 2, 3 and 4: every chunk is S/N
    results = mpkit.launch(_compare, world_size, args=(numel,), timeout=40)
    S = numel * 4
    for rank, r in enumerate(results):
        assert r["same_object"]
        torch.testing.assert_close(r["result"], r["reference"], rtol=1e-6, atol=1e-6)
        assert torch.equal(r["result"], results[0]["result"]), "ranks disagree"
        sent = sum(b for b, _ in r["sends"])
        assert sent == ring_allreduce_bytes(S, world_size) == 2 * (world_size - 1) * S // world_size
        assert len(r["sends"]) == 2 * (world_size - 1)  # 2(N-1) steps, one S/N message each
        assert all(b == S // world_size for b, _ in r["sends"])
        names = [name for _, name in r["sends"]]
        assert names == [f"reduce-scatter {k}" for k in range(world_size - 1)] + \
                        [f"all-gather {k}" for k in range(world_size - 1)]
        assert r["recv_bytes"] == 0 and r["other_kinds"] == []  # receives record 0 bytes: nothing left the rank


@pytest.mark.timeout(60)
def test_trace_bytes_from_launch_result():
    """What lab 05 reads: the merged trace's bytes_by_kind, per rank."""
    results = mpkit.launch(_compare, 4, args=(1024,), timeout=40)
    S = 1024 * 4
    assert results.trace.bytes_by_kind() == {r: {"send": 2 * 3 * S // 4} for r in range(4)}


@pytest.mark.timeout(60)
def test_uneven_chunks():
    """1003 elements over 4 ranks: chunks of 251, 251, 251, 250; per-rank bytes follow the chunks
    a rank sends, and all ranks together send exactly 2(N-1)·S."""
    numel, n = 1003, 4
    results = mpkit.launch(_compare, n, args=(numel,), timeout=40)
    assert ring_chunks(numel, n) == [251, 251, 251, 250]
    per_rank = [sum(b for b, _ in r["sends"]) for r in results]
    assert per_rank == [ring_bytes_sent(numel, 4, n, rank) for rank in range(n)]
    assert sum(per_rank) == 2 * (n - 1) * numel * 4
    for r in results:
        torch.testing.assert_close(r["result"], r["reference"], rtol=1e-6, atol=1e-6)


@pytest.mark.timeout(60)
def test_tiny_tensor_skips_empty_chunks():
    results = mpkit.launch(_compare, 4, args=(2,), timeout=40)  # chunks 1, 1, 0, 0
    for rank, r in enumerate(results):
        torch.testing.assert_close(r["result"], r["reference"])
        assert sum(b for b, _ in r["sends"]) == ring_bytes_sent(2, 4, 4, rank)


@pytest.mark.timeout(60)
def test_avg_and_non_contiguous_input():
    results = mpkit.launch(_noncontiguous_avg, 3, timeout=40)
    for r in results:
        torch.testing.assert_close(r["result"], r["reference"], rtol=1e-6, atol=1e-6)
        assert r["strides"] == (1, 30)  # still the caller's transposed view


def _noncontiguous_avg(ctx):
    x = _data(ctx.rank, 600).view(20, 30).t()  # a transposed view: not contiguous
    reference = x.clone()
    dist.all_reduce(reference)
    reference /= ctx.world_size
    ring_all_reduce(ctx, x, op="avg")
    return {"result": x.clone(), "reference": reference, "strides": x.stride()}


@pytest.mark.timeout(60)
def test_fp16_on_the_wire_halves_the_bytes():
    numel, n = 4096, 4
    results = mpkit.launch(_compare, n, args=(numel, "sum", torch.float16), timeout=40)
    for r in results:
        assert sum(b for b, _ in r["sends"]) == ring_allreduce_bytes(numel * 2, n)  # 2 bytes per element
        assert r["result"].dtype == torch.float32
        assert torch.equal(r["result"], results[0]["result"])  # rounding is the same everywhere
        error = (r["result"] - r["reference"]).abs().max().item()
        assert 0 < error < 1e-2  # lossy, but only at fp16's precision


def _single_rank(ctx):
    x = torch.arange(4.0)
    ring_all_reduce(ctx, x, op="avg")
    return x.tolist(), len(ctx.trace.events)


@pytest.mark.timeout(60)
def test_one_rank_is_a_no_op():
    [(values, events)] = mpkit.launch(_single_rank, 1, timeout=20)
    assert values == [0.0, 1.0, 2.0, 3.0] and events == 0


class _Ctx:
    rank, world_size = 0, 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="op='max' is unknown"):
        ring_all_reduce(_Ctx(), torch.zeros(4), op="max")
    with pytest.raises(TypeError, match="torch.Tensor"):
        ring_all_reduce(_Ctx(), [1.0, 2.0])
    with pytest.raises(ValueError, match="floating-point"):
        ring_all_reduce(_Ctx(), torch.zeros(4, dtype=torch.int64), op="avg")


def test_byte_helper_closed_form():
    for n in (2, 3, 4, 8):
        for rank in range(n):
            assert ring_bytes_sent(64 * n, 4, n, rank) == ring_allreduce_bytes(64 * n * 4, n)
    assert ring_bytes_sent(10, 4, 1, 0) == 0
