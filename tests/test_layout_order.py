"""Rank order as a ``Layout`` option (issue 31): DP outermost (picotron, mpkit's 3d run: the default,
unchanged) or PP outermost (Megatron-LM), and the planner prices each on the links it really uses."""
import itertools

import pytest

from mpkit.layout import DIMS, Layout
from mpkit.sim import plan
from mpkit.costmodel.analytic import _span, aligned


@pytest.mark.parametrize("dp,pp,tp", list(itertools.product([1, 2, 3], [1, 2, 4], [1, 2])))
def test_the_default_order_is_unchanged_and_megatrons_is_pp_outermost(dp, pp, tp):
    default, megatron = Layout(dp, pp, tp), Layout(dp, pp, tp, order="pp-dp-tp")
    assert default == Layout(dp=dp, pp=pp, tp=tp, order="dp-pp-tp") and default.shape == (dp, pp, tp)
    assert default.dims == DIMS and megatron.dims == ("pp", "dp", "tp") and megatron.shape == (pp, dp, tp)
    for rank in range(dp * pp * tp):
        c = default.coords(rank)
        assert rank == (c["dp"] * pp + c["pp"]) * tp + c["tp"] == default.rank(**c)
        c = megatron.coords(rank)
        assert rank == (c["pp"] * dp + c["dp"]) * tp + c["tp"] == megatron.rank(**c)
    assert megatron.groups("tp") == default.groups("tp")  # TP innermost either way


def test_an_unknown_order_is_refused():
    with pytest.raises(ValueError, match="order='tp-dp-pp' is unknown; use 'dp-pp-tp' or 'pp-dp-tp'"):
        Layout(2, 2, 2, order="tp-dp-pp")
    with pytest.raises(ValueError, match="order='dp-tp-pp' is unknown"):
        plan("gpt3-175b", "8x8xH100-ib", gpus=64, global_batch=512, order="dp-tp-pp")


def test_tp2_pp4_filling_a_node_puts_pp_or_dp_on_the_network_by_order():
    """The issue's case: TP 2 x PP 4 fills a node. DP outermost keeps the pipeline on NVLink and
    sends DP over InfiniBand; Megatron's order is the reverse (DP 4 inside the node, pipeline across)."""
    dp_out, pp_out = Layout(16, 4, 2), Layout(16, 4, 2, order="pp-dp-tp")
    assert _span(dp_out, "pp", 8) == (4, 1) and _span(dp_out, "dp", 8) == (1, 16)
    assert _span(pp_out, "dp", 8) == (4, 4) and _span(pp_out, "pp", 8) == (1, 4)
    kw = dict(model="13B", hardware="16x8xH100-ib", gpus=128, global_batch=512, tp=2, pp=4, dp=16, zero=1)
    picotron, megatron = plan(**kw, order="dp-pp-tp").best, plan(**kw, order="pp-dp-tp").best
    assert (picotron.links["pp"], picotron.links["dp"]) == ("intra", "inter")
    assert (megatron.links["pp"], megatron.links["dp"]) == ("inter", "inter")  # DP spans 4 nodes, 4 ranks each
    assert picotron.time["pp"] < megatron.time["pp"]  # hops on NVLink instead of InfiniBand


def test_aligned_reads_the_inner_block_of_the_order():
    # tp=2 with dp=3 inside (Megatron's order) makes blocks of 6 ranks: they straddle 8-GPU nodes
    assert aligned(Layout(3, 8, 2), 8) and not aligned(Layout(3, 8, 2, order="pp-dp-tp"), 8)


def test_the_planner_searches_both_orders_and_explains_its_choice():
    table = plan("gpt3-175b", "128x8xA100-ib", gpus=1024, global_batch=1536, zero=1)
    orders = {e.setup.layout.order for e in table.rows if e.setup.layout.dp > 1 and e.setup.layout.pp > 1}
    assert orders == {"dp-pp-tp", "pp-dp-tp"}
    assert all(e.setup.layout.order == "dp-pp-tp" for e in table.rows if e.setup.layout.pp == 1)  # no twins
    text = table.explain("en")
    outer = table.best.setup.layout.dims[0].upper()
    assert f"{outer} outermost" in text and f"With {'DP' if outer == 'PP' else 'PP'} outermost instead" in text
    assert "outermost" in str(table).splitlines()[2]
