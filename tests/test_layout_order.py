"""The rank order is data (issues 31, 42): ``Layout(order=...)`` takes any permutation of dp, pp, cp,
tp, outermost first, with presets for the published orders (DP outermost as picotron, mpkit's
default; PP outermost as Megatron-Core and torchtitan); the old three-name spellings still work; the
groups (dp, pp, cp, tp, ep carved out of dp, edp, dp x cp) follow the order; and the planner prices
each published order on the links it really uses."""
import itertools

import pytest

from mpkit.costmodel.analytic import _span, aligned
from mpkit.layout import DIMS, GROUPS, ORDERS, PRESETS, Layout
from mpkit.sim import plan

ALL_ORDERS = ["-".join(p) for p in itertools.permutations(DIMS)]


@pytest.mark.parametrize("dp,pp,tp", list(itertools.product([1, 2, 3], [1, 2, 4], [1, 2])))
def test_the_default_order_is_dp_outermost_and_megatrons_is_pp_outermost(dp, pp, tp):
    default, megatron = Layout(dp, pp, tp), Layout(dp, pp, tp, order="megatron")
    assert default == Layout(dp=dp, pp=pp, tp=tp, order="dp-pp-cp-tp") == Layout(dp, pp, tp, "picotron")
    assert default.dims == DIMS and default.shape == (dp, pp, 1, tp)
    assert megatron.order == "pp-dp-cp-tp" == Layout(dp, pp, tp, "torchtitan").order and megatron.shape == (pp, dp, 1, tp)
    for rank in range(dp * pp * tp):
        c = default.coords(rank)
        assert rank == (c["dp"] * pp + c["pp"]) * tp + c["tp"] == default.rank(**c)
        c = megatron.coords(rank)
        assert rank == (c["pp"] * dp + c["dp"]) * tp + c["tp"] == megatron.rank(**c)
    assert megatron.groups("tp") == default.groups("tp")  # TP innermost either way


@pytest.mark.parametrize("order", ALL_ORDERS)
def test_any_order_is_a_mixed_radix_number_outermost_first(order):
    layout = Layout(dp=2, pp=3, tp=2, cp=2, order=order)
    assert layout.dims == tuple(order.split("-")) and list(layout.coords(5)) == list(layout.dims)
    sizes = [getattr(layout, d) for d in layout.dims]
    for rank in range(layout.world_size):
        c, number = layout.coords(rank), 0
        for d, size in zip(layout.dims, sizes):
            number = number * size + c[d]
        assert number == rank == layout.rank(**c)
    inner = layout.dims[-1]  # the innermost dimension's groups are adjacent ranks
    assert layout.groups(inner)[0] == list(range(getattr(layout, inner)))


def test_groups_are_the_ranks_whose_other_coordinates_agree():
    # Megatron's order on 16 ranks with ep=2 carved out of dp=4 (pp=2, cp=1, tp=2): rank = (pp·4 + dp)·2 + tp
    lay = Layout(dp=4, pp=2, tp=2, order="megatron", ep=2)
    assert lay.group_of(0, "tp") == [0, 1] and lay.group_of(0, "dp") == [0, 2, 4, 6] and lay.group_of(0, "pp") == [0, 8]
    assert lay.group_of(0, "ep") == [0, 2]  # ep neighbouring dp coordinates
    assert lay.group_of(0, "edp") == [0, 4]  # the same experts, other data
    assert lay.group_of(0, "dp_cp") == lay.group_of(0, "dp")  # cp=1
    cp = Layout(dp=2, cp=2, tp=2, ep=2)
    assert cp.group_of(0, "dp_cp") == [0, 2, 4, 6] and cp.group_of(0, "edp") == [0, 2]  # CP folded into both
    for layout in (lay, cp, Layout(2, 2, 2, "tp-cp-dp-pp", 2)):
        for name in GROUPS:
            groups = layout.groups(name)
            assert sorted(r for g in groups for r in g) == list(range(layout.world_size))  # a partition
            assert all(len(g) == layout.size(name) for g in groups)
            assert all(layout.group_of(r, name) == g for g in groups for r in g)


def test_bad_orders_and_groups_are_refused_with_what_to_pass():
    with pytest.raises(ValueError, match="order='tp-dp-pp' is unknown; pass the four dimensions dp, pp, cp, tp"):
        Layout(2, 2, 2, order="tp-dp-pp")
    with pytest.raises(ValueError, match="'megatron' \\(pp-dp-cp-tp\\)"):
        Layout(order="dp-dp-cp-tp")
    with pytest.raises(ValueError, match="group 'xp' is unknown; use one of dp, pp, cp, tp, ep, edp, dp_cp"):
        Layout().groups("xp")
    with pytest.raises(ValueError, match="order='dp-tp-pp' is unknown"):
        plan("gpt3-175b", "8x8xH100-ib", gpus=64, global_batch=512, order="dp-tp-pp")
    with pytest.raises(ValueError, match="the planner prices the published orders"):
        plan("gpt3-175b", "8x8xH100-ib", gpus=64, global_batch=512, order="tp-cp-pp-dp")


def test_the_old_three_name_spellings_still_work_and_say_what_to_write():
    for old, new in (("dp-pp-tp", "dp-pp-cp-tp"), ("pp-dp-tp", "pp-dp-cp-tp")):
        with pytest.warns(DeprecationWarning, match=f"write order='{new}'"):
            assert Layout(2, 2, 2, order=old) == Layout(2, 2, 2, order=new)
    with pytest.warns(DeprecationWarning):
        table = plan("gpt3-175b", "8x8xH100-ib", gpus=64, global_batch=512, order="pp-dp-tp", tp=8, pp=4)
    assert table.best.setup.layout.order == "pp-dp-cp-tp"
    assert set(ORDERS) == set(PRESETS.values())


def test_tp2_pp4_filling_a_node_puts_pp_or_dp_on_the_network_by_order():
    """The issue's case: TP 2 x PP 4 fills a node. DP outermost keeps the pipeline on NVLink and
    sends DP over InfiniBand; Megatron's order is the reverse (DP 4 inside the node, pipeline across)."""
    dp_out, pp_out = Layout(16, 4, 2), Layout(16, 4, 2, order="pp-dp-cp-tp")
    assert _span(dp_out, "pp", 8) == (4, 1) and _span(dp_out, "dp", 8) == (1, 16)
    assert _span(pp_out, "dp", 8) == (4, 4) and _span(pp_out, "pp", 8) == (1, 4)
    kw = dict(model="13B", hardware="16x8xH100-ib", gpus=128, global_batch=512, tp=2, pp=4, dp=16, zero=1)
    picotron, megatron = plan(**kw, order="picotron").best, plan(**kw, order="megatron").best
    assert (picotron.links["pp"], picotron.links["dp"]) == ("intra", "inter")
    assert (megatron.links["pp"], megatron.links["dp"]) == ("inter", "inter")  # DP spans 4 nodes, 4 ranks each
    assert picotron.time["pp"] < megatron.time["pp"]  # hops on NVLink instead of InfiniBand


def test_aligned_reads_the_inner_block_of_the_order():
    # tp=2 with dp=3 inside (Megatron's order) makes blocks of 6 ranks: they straddle 8-GPU nodes
    assert aligned(Layout(3, 8, 2), 8) and not aligned(Layout(3, 8, 2, order="pp-dp-cp-tp"), 8)


def test_the_planner_searches_both_orders_and_explains_its_choice():
    table = plan("gpt3-175b", "128x8xA100-ib", gpus=1024, global_batch=1536, zero=1)
    orders = {e.setup.layout.order for e in table.rows if e.setup.layout.dp > 1 and e.setup.layout.pp > 1}
    assert orders == set(ORDERS)
    assert all(e.setup.layout.order == "dp-pp-cp-tp" for e in table.rows if e.setup.layout.pp == 1)  # no twins
    text = table.explain("en")
    outer = table.best.setup.layout.dims[0].upper()
    assert f"{outer} outermost" in text and f"With {'DP' if outer == 'PP' else 'PP'} outermost instead" in text
    assert "outermost" in str(table).splitlines()[2]
