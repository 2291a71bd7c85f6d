"""Context and expert parallelism in the planner (issue 32): the rank grid with a cp dimension as
Llama 3 and Megatron-Core lay it out, the cost model's CP and EP terms, Llama 3 405B's published
128K layout (TP 8, CP 16, PP 16, DP 8) priced and explained, and clear errors for what cannot split."""
from dataclasses import replace

import pytest

from mpkit.layout import Layout
from mpkit.sim import plan
from mpkit.costmodel.analytic import MODELS, Setup, Transformer, estimate
from mpkit.simulator.machines import get_hardware

LLAMA3_128K = replace(MODELS["llama3-405b"], seq_len=131072)


def test_cp_sits_just_outside_tp_as_in_llama3_figure5_and_megatron_core():
    # Dubey et al. 2024, Figure 5: 16 GPUs, |TP|=|CP|=|PP|=|DP|=2 in the order [TP, CP, PP, DP]:
    # GPU0 and GPU1 share a TP group, GPU0 and GPU2 a CP group, GPU0 and GPU4 PP, GPU0 and GPU8 DP
    llama = Layout(dp=2, pp=2, tp=2, cp=2)
    assert llama.dims == ("dp", "pp", "cp", "tp") and llama.world_size == 16
    assert [llama.group_of(0, d) for d in ("tp", "cp", "pp", "dp")] == [[0, 1], [0, 2], [0, 4], [0, 8]]
    # Megatron-Core's default "tp-cp-ep-dp-pp" (innermost first): DP inside PP
    megatron = Layout(dp=2, pp=2, tp=2, cp=2, order="pp-dp-cp-tp")
    assert megatron.dims == ("pp", "dp", "cp", "tp")
    assert [megatron.group_of(0, d) for d in ("tp", "cp", "dp", "pp")] == [[0, 1], [0, 2], [0, 4], [0, 8]]
    for rank in range(16):
        assert megatron.rank(**megatron.coords(rank)) == rank
    assert Layout(2, 2, 2).dims == ("dp", "pp", "cp", "tp") and Layout(2, 2, 2).shape == (2, 2, 1, 2)  # cp=1: size 1


def test_ep_is_carved_out_of_dp():
    assert Layout(dp=4, ep=2).world_size == 4  # no ranks of its own
    with pytest.raises(ValueError, match="ep=3 does not divide dp=4"):
        Layout(dp=4, ep=3)


def test_cp_splits_the_tokens_and_prices_the_kv_exchange():
    hw, model = get_hardware("Nx8xH100-ib"), replace(MODELS["llama3-8b"], seq_len=32768)
    one = estimate(model, hw, Setup(Layout(dp=2, tp=8)), 16)
    two = estimate(model, hw, Setup(Layout(dp=1, tp=8, cp=2)), 16)  # same 16 GPUs, each sequence on 2 of them
    # one micro-batch in flight (no pipeline): half its tokens, half the activations
    assert two.memory["activations"] == pytest.approx(one.memory["activations"] / 2, rel=1e-9)
    assert two.comm_bytes["tp"] == one.comm_bytes["tp"] / 2
    assert two.links["cp"] == "inter" and two.time["cp"] >= 0 and one.time["cp"] == 0
    ring = estimate(model, hw, Setup(Layout(dp=1, tp=8, cp=2), attention="ring"), 16)
    gather = estimate(model, hw, Setup(Layout(dp=1, tp=8, cp=2), attention="all-gather"), 16)
    assert ring.time["cp"] <= gather.time["cp"]  # the ring hides its passes behind attention where they are shorter
    assert gather.time["cp"] > 0


def test_llama3_405b_128k_priced_with_its_published_layout_and_explained():
    # Dubey et al. 2024, Table 4, third row: 16,384 H100s, TP 8, CP 16, PP 16, DP 8, 131,072-token
    # sequences, 16 per DP group (16M tokens per batch); CP by all-gathering K and V (§3.3.2)
    table = plan(LLAMA3_128K, "Nx8xH100-ib", gpus=16384, global_batch=8 * 16, tp=8, pp=16, cp=16, dp=8,
                 attention="all-gather", order="dp-pp-cp-tp")
    best = table.best
    assert best is not None and best.setup.layout == Layout(8, 16, 8, "dp-pp-cp-tp", cp=16)
    assert best.global_batch * LLAMA3_128K.seq_len == 16 * 2 ** 20
    assert "cp 16, K/V exchanged by all-gather" in str(table).splitlines()[1]
    text = table.explain("en")
    for words in ("Tensor parallel tp=8", "Pipeline pp=16", "Data parallel dp=8", "Context parallelism spans 16 GPUs",
                  "8,192 of every sequence's 131,072 tokens"):
        assert words in text
    assert "컨텍스트 병렬화" in table.explain("ko")


def test_cp_search_finds_that_long_sequences_want_it_and_says_what_cp_1_costs():
    table = plan(LLAMA3_128K, "Nx8xH100-ib", gpus=16384, global_batch=128, tp=8, pp=16, cp="search",
                 attention="all-gather")
    assert table.best.setup.layout.cp > 1
    flat = next(e for e in table.rows if e.setup.layout.cp == 1)
    assert flat.step_time > table.best.step_time
    assert f"The best layout without context parallelism ({flat.setup.describe(flat.micro_batches)})" in table.explain()


def test_mixtral_shape_and_expert_parallel():
    mixtral = MODELS["mixtral-8x7b"]
    # Jiang et al. 2024: 46.7B parameters, 12.9B active per token
    assert mixtral.parameters / 1e9 == pytest.approx(46.7, abs=0.1)
    assert mixtral.active_parameters / 1e9 == pytest.approx(12.9, abs=0.1)
    hw = get_hardware("Nx8xH100-ib")
    whole = estimate(mixtral, hw, Setup(Layout(dp=8, tp=1)), 64)
    split = estimate(mixtral, hw, Setup(Layout(dp=8, tp=1, ep=8)), 64)
    assert split.memory["parameters"] < whole.memory["parameters"] / 3  # 1 expert of 8 per rank
    assert split.time["ep"] > 0 and whole.time["ep"] == 0
    assert split.comm_bytes["ep"] == mixtral.seq_len * mixtral.hidden * 2 * 2  # tokens x hidden x top_k x bf16
    table = plan(mixtral, hw, gpus=64, global_batch=256, ep="search")
    assert {e.setup.layout.ep for e in table.rows} > {1}
    assert "expert" in table.explain("en").lower()


@pytest.mark.parametrize("kwargs,message", [
    (dict(cp=3), "seq_len=8192 is not divisible by 2·cp"),
    (dict(cp=2, attention="flash"), "attention='flash' is unknown"),
    (dict(cp="all"), "cp='all' is unknown"),
    (dict(ep=2), "dense"),
])
def test_bad_cp_and_ep_are_refused_before_planning(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan("llama3-8b", "Nx8xH100-ib", gpus=48, global_batch=48, **kwargs)


def test_bad_experts_are_refused():
    with pytest.raises(ValueError, match="ep=3 does not divide experts=8"):
        plan("mixtral-8x7b", "Nx8xH100-ib", gpus=48, global_batch=48, ep=3)
    with pytest.raises(ValueError, match="top_k=3 is more than experts=2"):
        Transformer(2, 64, 4, experts=2, top_k=3)


def test_simplest_prefers_fewer_dimensions_only_within_the_band():
    table = plan("megatron-22b", "8xA100-nvlink", gpus=8, global_batch=4, recompute="full", sequence_parallel=False,
                 flash=False, overlap_dp=False, zero=0)
    fastest, simple = table.best, table.simplest(within=0.10)
    assert simple.step_time <= fastest.step_time * 1.10
    close = [e for e in table.rows if e.step_time <= fastest.step_time * 1.10]
    assert (simple.setup.layout.pp > 1, simple.setup.layout.tp > 1) == min(
        (e.setup.layout.pp > 1, e.setup.layout.tp > 1) for e in close)
    assert table.simplest(within=0.0).step_time == fastest.step_time  # no band: the fastest itself


def test_the_explanation_gives_the_rank_formula_with_cp():
    table = plan(LLAMA3_128K, "Nx8xH100-ib", gpus=16384, global_batch=128, tp=8, pp=16, cp=16, dp=8,
                 attention="all-gather", order="dp-pp-cp-tp")
    assert "·cp·tp + cp index·tp + tp index" in table.explain("en")
    lay = table.best.setup.layout
    c = lay.coords(12345)  # the formula the sentence gives: (dp·pp + pp)·cp·tp + cp·tp + tp
    assert (c["dp"] * lay.pp + c["pp"]) * lay.cp * lay.tp + c["cp"] * lay.tp + c["tp"] == 12345


def test_the_widget_has_cp_ep_and_attention_controls():
    from mpkit.widgets.planwidget import Planner
    state = Planner(model="llama3-405b", hardware="Nx8xH100-ib", gpus=16384, global_batch=2048, tp=8, cp=2,
                    attention="all-gather", lang="en")
    assert state.result.best.setup.layout.cp == 2 and state.result.best.setup.attention == "all-gather"
    state.controls["cp"].value = None  # "search"
    assert state.result.pins["cp"] == "search" and state.controls["cp"].description == "pin cp"
    state.controls["model"].value = "mixtral-8x7b"
    state.controls["gpus"].value, state.controls["global_batch"].value = 64, 256
    state.controls["ep"].value = 8
    assert state.result.best.setup.layout.ep == 8 and "Expert parallelism spans 8" in state.explanation.value


def test_the_widget_refuses_an_unknown_attention_kind_by_name():
    from mpkit.widgets.planwidget import Planner
    with pytest.raises(ValueError, match="attention='flash2': give one of 'ring'"):
        Planner(attention="flash2")
