"""mpkit.parallel.collectives: the same results as torch.distributed's collectives (in the whole world and
in a subgroup), and exactly the bytes the ring formula 2(N-1)/N·S promises, read from the rank's own send events."""
import pytest
import torch
import torch.distributed as dist

import mpkit
from mpkit.parallel.collectives import ring_all_reduce, ring_bytes_sent, ring_chunks
from mpkit.simulator.formulas import ring_allreduce_bytes


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
    out = ring_all_reduce(x, op=op, wire_dtype=wire_dtype)
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
    ring_all_reduce(x, op="avg")
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
    ring_all_reduce(x, op="avg")
    return x.tolist(), len(ctx.trace.events)


@pytest.mark.timeout(60)
def test_one_rank_is_a_no_op():
    [(values, events)] = mpkit.launch(_single_rank, 1, timeout=20)
    assert values == [0.0, 1.0, 2.0, 3.0] and events == 0


def test_bad_arguments():
    """Refused before any message, so no process group is needed to see the error."""
    with pytest.raises(ValueError, match="op='max' is unknown"):
        ring_all_reduce(torch.zeros(4), op="max")
    with pytest.raises(TypeError, match="torch.Tensor"):
        ring_all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="floating-point"):
        ring_all_reduce(torch.zeros(4, dtype=torch.int64), op="avg")
    with pytest.raises(RuntimeError, match="a hand-written collective needs a process group"):
        ring_all_reduce(torch.zeros(4))


def test_byte_helper_closed_form():
    for n in (2, 3, 4, 8):
        for rank in range(n):
            assert ring_bytes_sent(64 * n, 4, n, rank) == ring_allreduce_bytes(64 * n * 4, n)
    assert ring_bytes_sent(10, 4, 1, 0) == 0


def _six(ctx, root):
    from mpkit.parallel.collectives import six_collectives
    return six_collectives(ctx, root)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world_size,root", [(2, 0), (3, 2), (4, 0), (4, 1)])
def test_six_collectives_match_torch_and_their_byte_formulas(world_size, root, no_leftovers):
    """What lab 05 shows: each hand-written collective gives torch.distributed's result on every
    rank, and sends exactly the bytes its formula says (S = 4·N bytes: N float32 values)."""
    from mpkit.parallel.collectives import COLLECTIVES, bytes_per_rank
    results = mpkit.launch(_six, world_size, args=(root,), timeout=60)
    n, S = world_size, 4 * world_size
    total = [sum(10 ** r for r in range(n)) * (j + 1) for j in range(n)]   # [11..1, 22..2, ...]
    for step, name in enumerate(COLLECTIVES):
        for rank, r in enumerate(results):
            assert r[name]["after"] == r[name]["torch"], (name, rank)
            sent = sum(e.bytes for e in results.trace.filter(kind="send", step=step).of_rank(rank))
            assert sent == bytes_per_rank(name, S, n, rank, root), (name, rank, sent)
    assert all(r["broadcast"]["after"] == results[root]["broadcast"]["before"] for r in results)
    assert [r["reduce"]["after"] for r in results] == [total if k == root else None for k in range(n)]
    assert all(r["all_reduce"]["after"] == total for r in results)
    assert [r["reduce_scatter"]["after"] for r in results] == [[v] for v in total]
    assert all(r["all_gather"]["after"] == total for r in results)
    assert [r["all_to_all"]["after"] for r in results] == [[(j + 1) * 10.0 ** k for k in range(n)] for j in range(n)]


def _bad_input(ctx, case):
    from mpkit.parallel import collectives
    if case == "root":
        collectives.chain_broadcast(torch.zeros(4), src=ctx.world_size)
    else:
        collectives.pairwise_all_to_all(torch.zeros(5))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,message", [("root", "root rank 2 is not a rank of this world"),
                                          ("blocks", "5 elements cannot be cut into 2 equal blocks")])
def test_bad_input_is_a_clear_error_naming_the_rank(case, message):
    with pytest.raises(mpkit.LaunchError, match=message):
        mpkit.launch(_bad_input, 2, args=(case,), timeout=40)



def _six_in_halves(ctx):
    """Ranks {0, 2} and {1, 3} as two groups (members not consecutive, so group and global ranks
    differ), each running the six collectives with its second member, a global rank, as the root."""
    halves = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    from mpkit.parallel.collectives import six_collectives
    return six_collectives(ctx, root=ctx.rank % 2 + 2, group=halves[ctx.rank % 2])


@pytest.mark.timeout(90)
def test_six_collectives_in_a_subgroup_match_torch_in_that_group(no_leftovers):
    """group= works as in torch.distributed: results equal torch's own collectives in the same group,
    roots are global ranks, and every rank sends the bytes of a 2-rank group, to members only."""
    from mpkit.parallel.collectives import COLLECTIVES, bytes_per_rank
    results = mpkit.launch(_six_in_halves, 4, timeout=60)
    for step, name in enumerate(COLLECTIVES):
        for rank, r in enumerate(results):
            assert r[name]["after"] == r[name]["torch"], (name, rank)
            sends = list(results.trace.filter(kind="send", step=step).of_rank(rank))
            assert sum(e.bytes for e in sends) == bytes_per_rank(name, 4 * 2, 2, rank // 2, root=1), (name, rank)
    assert [r["all_reduce"]["after"] for r in results] == [[11.0, 22.0]] * 4  # each half sums its own two ranks
    assert [r["reduce"]["after"] for r in results] == [None, None, [11.0, 22.0], [11.0, 22.0]]  # on the roots 2, 3


def _outsider(ctx):
    group = dist.new_group([0, 1])
    ring_all_reduce(torch.ones(4), group=group)


@pytest.mark.timeout(60)
def test_a_rank_outside_the_group_is_told_so():
    with pytest.raises(mpkit.LaunchError, match="rank 2 is not a member of the group"):
        mpkit.launch(_outsider, 3, timeout=40)


def _untraced(ctx):
    """Outside a recording rank (a user's own init_process_group world) active.comm() is a plain
    pass-through to torch.distributed: the same sums, no events."""
    from mpkit.observe import active
    x = _data(ctx.rank, 10)
    reference = x.clone()
    dist.all_reduce(reference)
    before = len(ctx.trace.events)
    with active.quiet():
        ring_all_reduce(x)
    return {"result": x, "reference": reference, "events": len(ctx.trace.events) - before}


@pytest.mark.timeout(60)
def test_outside_a_recording_rank_it_runs_on_plain_torch_distributed():
    for r in mpkit.launch(_untraced, 3, timeout=40):
        torch.testing.assert_close(r["result"], r["reference"], rtol=1e-6, atol=1e-6)
        assert r["events"] == 0

@pytest.mark.parametrize("lang", ["en", "ko"])
def test_collectives_figure_colours_each_value_by_where_it_came_from(lang):
    """mpkit.plot.collectives on hand-made results (no launch): a panel per collective, a cell per
    value, one rank's data in that rank's colour, the sum over all ranks dark, undefined hatched."""
    from matplotlib.colors import to_hex

    from mpkit.plot.collectives import RANK_COLOURS, SUM_COLOUR
    from mpkit.plot import collectives
    n = 2
    rank_data = [[1.0, 2.0], [10.0, 20.0]]
    results = [{"all_reduce": {"before": rank_data[r], "after": [11.0, 22.0]},
                "reduce": {"before": rank_data[r], "after": [11.0, 22.0] if r == 0 else None}} for r in range(n)]
    fig = collectives(results, lang=lang)
    panels = [ax for ax in fig.axes if ax.get_title(loc="left")]
    assert [ax.get_title(loc="left").split(" — ")[0] for ax in panels] == ["all-reduce", "reduce"]
    all_reduce = [to_hex(p.get_facecolor()) for p in panels[0].patches]
    assert all_reduce == [RANK_COLOURS[0].lower()] * 2 + [SUM_COLOUR.lower()] * 2 + \
                        [RANK_COLOURS[1].lower()] * 2 + [SUM_COLOUR.lower()] * 2
    assert sum(p.get_hatch() == "///" for p in panels[1].patches) == 1   # reduce: rank 1 undefined
