"""mpkit.sim.plan: the closed-form step model against hand-computed cases, the enumeration, the
memory filter with its reasons, the ranking, the links read from Layout, bad input, the fast answer
for huge sizes, and the planner widget driven headlessly."""
import importlib
import json
import math
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

from mpkit.layout import Layout
from mpkit.sim import MODELS, Hardware, Link, Transformer, formulas, get_hardware, plan
from mpkit.costmodel.analytic import USABLE_MEMORY, Setup, activation_bytes, estimate, transformer

GPT = Transformer(layers=4, hidden=1024, heads=8, seq_len=512, vocab=1000)
# no link costs and a pure FLOP clock, so the pipeline's bubble is the schedule's alone
IDEAL = Hardware(name="ideal", flops=1e12, mfu=1.0, mem_bw=math.inf, p2p=Link(0.0, 0.0), collective=Link(0.0, 0.0),
                 inter_node=Link(0.0, 0.0), devices_per_node=8, memory_bytes=80e9, precision="bf16")


# ---- formulas and shapes -------------------------------------------------------------------------

@pytest.mark.parametrize("t,sp,rec", [(1, False, "none"), (8, False, "none"), (8, True, "none"),
                                      (4, False, "selective"), (4, True, "selective"), (8, True, "full"),
                                      (8, False, "full")])
def test_activation_bytes_are_korthikanti_for_a_gpt_block(t, sp, rec):
    s, b, h, a = 2048, 2, 12288, 96
    model = Transformer(layers=2, hidden=h, heads=a, seq_len=s)
    expected = formulas.activation_memory_per_layer(s, b, h, a, t, sequence_parallel=sp, recompute=rec)
    assert s * b * activation_bytes(model, t, sp, rec, flash=False) == pytest.approx(expected)


def test_korthikanti_table_2_by_hand():
    s, b, h, a, t = 2048, 1, 4096, 32, 8
    sbh = s * b * h
    assert formulas.activation_memory_per_layer(s, b, h, a, t, sequence_parallel=True) == pytest.approx(
        sbh / t * (34 + 5 * a * s / h))
    selective = formulas.activation_memory_per_layer(s, b, h, a, t, recompute="selective")
    assert selective == pytest.approx(sbh * (10 + 24 / t))
    assert formulas.activation_memory_per_layer(s, b, h, a, t, sequence_parallel=True, recompute="full") == 2 * sbh / t
    with pytest.raises(ValueError, match="recompute"):
        formulas.activation_memory_per_layer(s, b, h, a, recompute="some")


def test_megatron_flops_matches_the_per_token_count():
    B, s, l, h, V = 8, 2048, 24, 2304, 51200
    forward_layer = 2 * 12 * h * h + 4 * s * h  # weights (2 FLOPs each) + attention scores, per token
    logits = 2 * V * h
    with_recompute = B * s * (l * 4 * forward_layer + 3 * logits)  # forward, backward (2x), forward again
    assert formulas.megatron_flops(B, s, l, h, V) == pytest.approx(with_recompute)
    without = B * s * 3 * (l * forward_layer + logits)
    assert formulas.megatron_flops(B, s, l, h, V, recompute=False) == pytest.approx(without)


def test_hierarchical_collectives_reduce_to_the_flat_ones():
    intra, inter = (5e-6, 1e-11), (15e-6, 5e-11)
    S = 1e9
    assert formulas.hierarchical_allreduce_time(S, 1, 16, intra, inter) == formulas.allreduce_time(S, 16, *inter)
    assert formulas.hierarchical_allreduce_time(S, 8, 1, intra, inter) == pytest.approx(
        formulas.ring_allreduce_time(S, 8, *intra))
    both = 2 * formulas.ring_reduce_scatter_time(S, 8, *intra) + formulas.allreduce_time(S / 8, 4, *inter)
    assert formulas.hierarchical_allreduce_time(S, 8, 4, intra, inter) == pytest.approx(both)
    assert formulas.hierarchical_reduce_scatter_time(S, 8, 4, intra, inter) == pytest.approx(
        formulas.ring_reduce_scatter_time(S, 8, *intra) + formulas.ring_reduce_scatter_time(S / 8, 4, *inter))


@pytest.mark.parametrize("layers,hidden,heads,billions", [(24, 2304, 24, 1.7), (36, 4096, 32, 7.5),
                                                           (96, 12288, 96, 174.6), (105, 20480, 128, 529.6),
                                                           (128, 25600, 160, 1008.0)])
def test_parameter_counts_match_megatron_table_1(layers, hidden, heads, billions):
    assert Transformer(layers, hidden, heads, 2048, 51200).parameters / 1e9 == pytest.approx(billions, abs=0.05)


def test_model_from_a_size_gets_gpt3_shapes():
    assert (transformer("175B").layers, transformer("175B").hidden, transformer("175B").heads) == (96, 12288, 96)
    assert (transformer(7e9).layers, transformer(7e9).hidden) == (32, 4096)
    # numpy sizes too (a count from an array sum): np.int64 and np.float32 were refused as no count
    assert transformer(np.int64(7_000_000_000)) == transformer(np.float32(7e9)) == transformer(7e9)
    assert transformer("llama3-405b") is MODELS["llama3-405b"]
    assert MODELS["llama3-405b"].parameters / 1e9 == pytest.approx(405.8, abs=0.5)  # Dubey et al. 2024: 405B
    assert transformer({"layers": 2, "hidden": 64, "heads": 4}).layers == 2


@pytest.mark.parametrize("bad", ["huge", -5, 0, 1e20, True, np.bool_(True), math.nan, math.inf, "12x"])
def test_bad_model_says_what_to_pass(bad):
    with pytest.raises(ValueError, match="preset"):
        transformer(bad)


# ---- one layout, by hand ----------------------------------------------------------------------------

def test_memory_of_a_layout_is_zero_states_plus_activations_in_flight():
    hw = get_hardware("8xH100-nvlink")
    setup = Setup(Layout(dp=2, pp=2, tp=2), micro_batch=1, zero=1, recompute="none", flash=False)
    e = estimate(GPT, hw, setup, global_batch=8)
    assert e.micro_batches == 4
    per_stage = 2 * GPT.layer_parameters
    first = per_stage + GPT.embedding_parameters  # tokens and positions
    last = per_stage + GPT.head_parameters + GPT.vocab * GPT.hidden  # a copy of the tied embedding
    states = formulas.zero_memory(max(first, last) / 2, 2, 1)
    for key in ("parameters", "gradients", "optimizer"):
        assert e.memory[key] == pytest.approx(states[key])
    s, h, a = GPT.seq_len, GPT.hidden, GPT.heads
    layer = formulas.activation_memory_per_layer(s, 1, h, a, 2, sequence_parallel=True)
    stage0 = min(2, 4) * 2 * layer  # 1F1B: stage 0 holds p micro-batches of its 2 layers
    stage1 = 1 * 2 * layer + 2 * 4 * s * GPT.vocab / 2  # one micro-batch + fp32 logits and their gradient
    assert e.memory["activations"] == pytest.approx(max(stage0, stage1))
    assert e.fits and e.memory_total == pytest.approx(sum(states.values()) + max(stage0, stage1))


def test_gpipe_keeps_every_micro_batch_and_recompute_keeps_layer_inputs():
    hw = get_hardware("8xH100-nvlink")
    base = Setup(Layout(dp=1, pp=4, tp=2), micro_batch=1, flash=False)
    one_f, gpipe = estimate(GPT, hw, base, 16), estimate(GPT, hw, replace(base, schedule="gpipe"), 16)
    assert gpipe.memory["activations"] > one_f.memory["activations"]
    assert gpipe.step_time == pytest.approx(one_f.step_time)  # same bubble (p-1)/(m+p-1)
    full = estimate(GPT, hw, replace(base, recompute="full"), 16)
    assert full.memory["activations"] < one_f.memory["activations"]
    assert full.time["compute"] > one_f.time["compute"]


def test_pipeline_bubble_is_the_schedule_formula_on_an_ideal_machine():
    model = Transformer(layers=8, hidden=1024, heads=8, seq_len=512, vocab=8)  # a tiny logit layer
    for schedule, v, m in (("1f1b", 1, 8), ("1f1b", 1, 32), ("interleaved", 2, 8)):
        e = estimate(model, IDEAL, Setup(Layout(dp=1, pp=4, tp=1), micro_batch=1, schedule=schedule, virtual=v), m)
        expected = formulas.bubble_fraction(4, m, v, "interleaved" if v > 1 else "1f1b", relative_to="step")
        assert e.bubble_share == pytest.approx(expected, rel=0.02), (schedule, v, m)


def test_links_come_from_the_layout_rank_grid():
    hw = get_hardware("4x8xH100-ib")
    layouts = (Layout(dp=4, pp=2, tp=4), Layout(dp=2, pp=4, tp=4), Layout(dp=8, pp=1, tp=4), Layout(dp=1, pp=4, tp=8))
    for layout in layouts:
        e = estimate(GPT, hw, Setup(layout, micro_batch=1), global_batch=16)
        for dim in ("tp", "pp", "dp"):
            spans = {len({r // 8 for r in group}) for group in layout.groups(dim)}
            assert len(spans) == 1  # aligned: every group spans the same number of nodes
            nodes = spans.pop()
            expected = "none" if getattr(layout, dim) == 1 else ("intra" if nodes == 1 else "inter")
            assert e.links[dim] == expected, (layout, dim)


# ---- the search -----------------------------------------------------------------------------------

def test_enumerates_every_layout_of_the_gpus():
    model = Transformer(layers=4, hidden=512, heads=8, seq_len=256, vocab=1000)
    table = plan(model, "8xH100-nvlink", gpus=8, global_batch=16)
    seen = {(e.setup.layout.dp, e.setup.layout.pp, e.setup.layout.tp) for e in table.rows + table.dropped}
    expected = {(d, p, t) for t in (1, 2, 4, 8) for p in (1, 2, 4) for d in (1, 2, 4, 8) if d * p * t == 8}
    assert seen == expected
    assert {e.setup.zero for e in table.rows if e.setup.layout.dp > 1} == {0, 1, 2, 3}
    assert {e.setup.zero for e in table.rows if e.setup.layout.dp == 1} == {0}
    assert {e.setup.recompute for e in table.rows} == {"none", "full"}  # selective = none under flash attention
    steps = [e.step_time for e in table.rows]
    assert steps == sorted(steps) and table.best is table.rows[0]
    assert all(e.fits for e in table.rows) and not any(e.fits for e in table.dropped)


def test_a_layout_that_cannot_fit_is_dropped_with_its_reason():
    table = plan("7B", "8xH100-nvlink", gpus=8, global_batch=64, dp=8, zero=0, recompute="none", micro_batch=8)
    assert table.best is None and len(table.dropped) == 1
    reason = table.dropped[0].over_memory()
    assert "GB per GPU >" in reason and f"{81559 * 2**20 * USABLE_MEMORY / 1e9:.1f} GB usable"  # nvidia-smi's 81,559 MiB in reason and "optimizer state" in reason
    assert "No layout fits" in str(table)
    assert "메모리" in table.to_text("ko")
    assert "No layout fits" in table.explain()


def test_zero_and_recompute_buy_memory_and_the_explanation_says_so():
    table = plan("gpt3-175b", "8x8xH100-ib", gpus=64, global_batch=256, recompute="full", zero=1, dp=2)
    best = table.best
    plain = estimate(table.model, table.hardware, replace(best.setup, zero=0, recompute="none"), 256)
    assert plain.memory_total > best.memory_total
    text = table.explain("en")
    assert "ZeRO-1 shards the optimizer states only" in text  # review F5: not "model states"
    assert "Recomputation (full)" in text


def test_tp_stays_inside_a_node_when_nvlink_is_faster():
    table = plan("gpt3-175b", "8x8xH100-ib", gpus=64, global_batch=512)
    best = table.best
    assert best.links["tp"] == "intra"
    tp_group = best.setup.layout.group_of(0, "tp")
    assert len({r // 8 for r in tp_group}) == 1
    assert all(e.setup.layout.tp <= 8 for e in table.rows + table.dropped)  # searched within a node
    wide = table.across_nodes()  # the best layout at the narrowest TP across nodes, priced on InfiniBand
    assert wide.setup.layout.tp == 16 and wide.links["tp"] == "inter"
    assert wide.step_time > best.step_time and wide.time["tp"] > best.time["tp"]
    text = table.explain("en")
    assert "That is why TP stays inside a node" in text and "bubble" in text
    # it says which wide layout it compares: the narrowest TP across nodes that fits, not every one
    assert "With TP widened across nodes to the narrowest width that fits in memory (tp=16)" in text
    assert "가장 작은 크기(tp=16)로 잡으면" in table.explain("ko") and "노드 안에 둡니다" in table.explain("ko")


def test_tp_across_nodes_is_compared_under_the_same_pins():
    """The wide-TP comparison changes only where TP runs: with gpipe and pp=8 pinned it used to
    compare with an unpinned 1f1b layout without recomputation and claim TP across nodes faster."""
    table = plan("gpt3-175b", "Nx8xA100-ib", gpus=1024, global_batch=1536, pp=8, tp=8, schedule="gpipe")
    best, wide = table.best, table.across_nodes()
    assert best.setup.schedule == "gpipe" and best.setup.recompute == "full"
    assert (wide.setup.layout.pp, wide.setup.layout.tp, wide.setup.schedule) == (8, 16, "gpipe")
    assert wide.step_time > best.step_time
    assert "That is why TP stays inside a node" in table.explain("en")


def test_tp_across_nodes_keeps_a_pin_to_one_stage_and_a_pinned_micro_batch():
    """Every pin of the table but tp is carried: pp=1 used to be passed as "unpinned" (the wide
    layout below took pp=2) and a pinned micro_batch was dropped (the wide layout took 16)."""
    flat = plan("gpt3-175b", "Nx8xA100-ib", gpus=128, global_batch=512, pp=1, zero=1)
    wide = flat.across_nodes()
    assert flat.pins["pp"] == 1 and flat.pins["zero"] == 1
    assert (wide.setup.layout.pp, wide.setup.layout.tp, wide.setup.zero) == (1, 16, 1) and wide.links["tp"] == "inter"
    small = plan("7B", "8x8xH100-ib", gpus=64, global_batch=512, micro_batch=2)
    wide = small.across_nodes()
    assert small.pins["micro_batch"] == 2 and (wide.setup.layout.tp, wide.setup.micro_batch) == (16, 2)
    assert {e.setup.micro_batch for e in small.rows} == {2}


def test_tp_across_nodes_keeps_a_pinned_dp_and_says_none_when_the_pins_leave_no_room():
    table = plan("7B", "8x8xH100-ib", gpus=64, global_batch=512, dp=4)
    wide = table.across_nodes()
    assert (wide.setup.layout.dp, wide.setup.layout.pp, wide.setup.layout.tp) == (4, 1, 16)
    assert plan("7B", "8x8xH100-ib", gpus=64, global_batch=512, dp=8, pp=1).across_nodes() is None  # tp must be 8


def test_pinned_knobs_are_respected():
    table = plan("gpt3-175b", "Nx8xA100-ib", gpus=1536, global_batch=2304, tp=8, pp=8, recompute="full", zero=0,
                 flash=False, sequence_parallel=False, overlap_dp=False)
    assert {(e.setup.layout.dp, e.setup.layout.pp, e.setup.layout.tp) for e in table.rows} == {(24, 8, 8)}
    assert {e.setup.recompute for e in table.rows} == {"full"} and not table.best.setup.flash


# ---- bad input, huge sizes ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(hardware="Nx8xH100-ib", gpus=12, global_batch=24), "not a multiple of the 8 GPUs per node"),
    (dict(hardware="8x8xH100-ib", gpus=64, global_batch=100, dp=8), "not divisible by dp=8"),
    (dict(hardware="tpu-v9", gpus=8, global_batch=8), "hardware='tpu-v9' is unknown"),
    (dict(hardware="8xH100-nvlink", gpus=64, global_batch=64), "multi-node preset such as '8x8xH100-ib'"),
    (dict(hardware="8xH100-nvlink", gpus=8, global_batch=8, dp=2, tp=2, pp=1), "dp\\*tp\\*pp = 4 but gpus=8"),
    (dict(hardware="8xH100-nvlink", gpus=8, global_batch=8, tp=3), "do not divide it"),
    (dict(hardware="8x8xH100-ib", gpus=64, global_batch=64, tp=64), "does not divide heads=96"),
    (dict(hardware="Nx8xH100-ib", gpus=256, global_batch=256, pp=128), "more than the 96 layers"),
    (dict(hardware="8xH100-nvlink", gpus=8, global_batch=None), "global_batch is required"),
    (dict(hardware="Nx8xH100-ib", global_batch=8), "gpus is required"),
    (dict(hardware="8xH100-nvlink", gpus=0, global_batch=8), "gpus=0"),
    (dict(hardware="8xH100-nvlink", gpus=8, global_batch=8, zero=4), "zero=4 is unknown"),
    (dict(hardware="8xH100-nvlink", gpus=8, global_batch=8, schedule="zigzag"), "schedule='zigzag'"),
    (dict(hardware="8xH100-nvlink", gpus=8, global_batch=8, lang="fr"), "lang"),
])
def test_bad_input_says_what_to_change(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan("gpt3-175b", **kwargs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gpus,batch", [(10**6, 10**6), (10**6, 1536), (2**20, 2**20)])
def test_huge_sizes_answer_fast(gpus, batch):
    start = time.perf_counter()
    table = plan("gpt3-175b", "Nx8xH100-ib", gpus=gpus, global_batch=batch)
    assert time.perf_counter() - start < 10  # ~0.4 s measured; generous for a busy 2-core CI machine
    assert table.gpus == gpus and all(e.setup.layout.world_size == gpus for e in table.rows)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("model,gpus,batch", [(1e15, 8 * 720720, 16 * 720720),
                                              (dict(layers=10**6, hidden=128, heads=128), 8 * 720720, 8 * 720720)])
def test_searches_too_large_to_price_in_a_second_are_refused_at_once(model, gpus, batch, monkeypatch):
    """Many layers (pp divisors) times many divisors of gpus: 73,000-153,000 layouts took 1.5-2.8 s.
    Refused at once means before any layout is priced (counted, so a busy machine cannot flake it);
    the clock only guards against a search that runs on."""
    planning = importlib.import_module("mpkit.costmodel.plan")
    priced = []
    monkeypatch.setattr(planning, "estimate", lambda *a, **k: priced.append(a) or estimate(*a, **k))
    start = time.perf_counter()
    with pytest.raises(ValueError, match="layouts to price for gpus=5765760; pin some of dp, tp, pp or micro_batch"):
        plan(model, "Nx8xH100-ib", gpus=gpus, global_batch=batch)
    # measured 0.27-0.29 s idle, 0.36-0.63 s with two busy loops on this 2-core machine
    assert time.perf_counter() - start < 5.0 and priced == []
    monkeypatch.undo()
    assert plan(model, "Nx8xH100-ib", gpus=gpus, global_batch=batch, tp=8, pp=4).gpus == gpus  # pinned: it answers


def test_numpy_integers_are_whole_numbers():
    """As everywhere else in mpkit (a sweep over np.arange): they used to be refused as
    'gpus=np.int64(64) must be a whole number >= 1'."""
    plain = plan("gpt3-175b", "8x8xH100-ib", gpus=64, global_batch=512, tp=8)
    numpy = plan("gpt3-175b", "8x8xH100-ib", gpus=np.int64(64), global_batch=np.int64(512), tp=np.int64(8))
    assert numpy.best.setup == plain.best.setup and numpy.best.step_time == plain.best.step_time
    assert type(numpy.gpus) is int and formulas.bubble_fraction(np.int64(4), np.int64(8)) == 3 / 11


def test_a_bool_zero_and_a_misspelt_model_field_are_refused_by_name():
    with pytest.raises(ValueError, match="zero=True is unknown; use one of 0, 1, 2, 3"):
        plan("7B", "8xH100-nvlink", gpus=8, global_batch=8, zero=True)  # was taken as ZeRO-1
    with pytest.raises(ValueError, match=r"'hiden' not a Transformer field; use layers, hidden, heads"):
        plan(dict(layers=2, hiden=128, heads=2), "8xH100-nvlink", gpus=8, global_batch=8)  # was a TypeError


def test_tp_on_pcie_cards_is_not_called_nvlink():
    text = plan("7B", "8xH100-pcie", gpus=8, global_batch=64, tp=8).explain("en")
    assert "Tensor parallel tp=8 talks over the links inside one node (PCIe, no NVLink)" in text
    assert "NVLink" in plan("7B", "8xH100-nvlink", gpus=8, global_batch=64, tp=8).explain("en")


def test_the_link_text_comes_from_the_hardware_links_not_its_name():
    """It used to be read off a '-pcie' suffix: a PCIe box under its own name was called NVLink."""
    pcie = replace(get_hardware("8xH100-pcie"), name="my-lab-box")
    assert (pcie.collective.kind, get_hardware("8xH100-nvlink").collective.kind) == ("pcie", "nvlink")
    text = plan("7B", pcie, gpus=8, global_batch=64, tp=8).explain("en")
    assert "Tensor parallel tp=8 talks over the links inside one node (PCIe, no NVLink)" in text
    named = replace(get_hardware("8xH100-nvlink"), name="looks-like-pcie")  # the name says nothing now
    assert "inside one node (NVLink)" in plan("7B", named, gpus=8, global_batch=64, tp=8).explain("en")
    assert IDEAL.collective.kind == ""  # a link of no stated kind: no brand name
    text = plan(GPT, IDEAL, gpus=8, global_batch=64, tp=8).explain("en")
    assert "talks over the links inside one node:" in text and "NVLink" not in text and "PCIe" not in text
    assert "tp=8는 한 노드 안의 링크로 통신합니다" in plan(GPT, IDEAL, gpus=8, global_batch=64, tp=8).explain("ko")


def test_tp_across_nodes_widens_until_a_layout_fits():
    """It tried only the narrowest TP that spans nodes and said None when that one did not fit."""
    pins = dict(pp=1, zero=0)   # 175B parameters with 16 bytes each must be cut by TP alone
    assert plan("gpt3-175b", "Nx8xH100-ib", gpus=96, global_batch=96, tp=16, **pins).best is None
    wide = plan("gpt3-175b", "Nx8xH100-ib", gpus=96, global_batch=96, **pins).across_nodes()
    assert wide is not None and wide.fits and (wide.setup.layout.tp, wide.setup.layout.pp) == (48, 1)
    assert all(plan("gpt3-175b", "Nx8xH100-ib", gpus=96, global_batch=96, tp=tp, **pins).best is None
               for tp in (24, 32))   # 48 is the narrowest that fits


def test_the_link_between_nodes_is_named_by_its_kind_too():
    """'InfiniBand' was written whatever the hardware's inter-node link was."""
    ib = get_hardware("8x8xH100-ib")
    text = plan("gpt3-175b", ib, gpus=64, global_batch=512).explain("en")
    assert "puts those collectives on InfiniBand between nodes" in text
    assert "stage boundaries run over InfiniBand between nodes" in text
    ethernet = replace(ib, inter_node=Link(ib.inter_node.alpha, ib.inter_node.beta))  # no stated kind
    text = plan("gpt3-175b", ethernet, gpus=64, global_batch=512).explain("en")
    assert "puts those collectives on the links between nodes" in text and "InfiniBand" not in text
    assert "이 통신을 노드 사이 링크에 올려" in plan("gpt3-175b", ethernet, gpus=64, global_batch=512).explain("ko")
    no_inter = replace(get_hardware("8xH100-nvlink"), inter_node=None, nodes=None)  # it crashed on None
    assert "the links between nodes" in plan("7B", no_inter, gpus=16, global_batch=64).explain("en")


def test_a_link_kind_round_trips_the_calibration_cache_and_an_unstated_one_is_not_written(tmp_path):
    from mpkit.simulator import machines
    path = tmp_path / "cpu-sim.json"
    hw = replace(IDEAL, p2p=Link(1e-6, 1e-9), collective=Link(2e-6, 2e-9, "pcie"), inter_node=None)
    machines._save(path, hw)
    saved = next(iter(json.loads(path.read_text()).values()))
    assert saved["p2p"] == {"alpha": 1e-6, "beta": 1e-9} and saved["collective"]["kind"] == "pcie"
    assert machines._load(path) == hw


def test_too_many_gpus_for_the_batch_says_so_not_add_gpus():
    """With global_batch=1 dp is 1, and 10**6 GPUs cannot be cut into pp <= 96 and tp <= 8:
    nothing was priced, so the advice is fewer GPUs or a larger batch (it used to say 'add GPUs')."""
    table = plan("gpt3-175b", "Nx8xH100-ib", gpus=10**6, global_batch=1)
    assert table.best is None and not table.dropped
    text = table.explain("en")
    assert "use fewer GPUs, a larger global_batch" in text and "add GPUs" not in text
    assert "GPU를 줄이거나" in table.to_text("ko")


# ---- the widget, headless ------------------------------------------------------------------------------

def test_planner_widget_recomputes_and_keeps_the_last_good_table():
    from mpkit.widgets.planwidget import Planner

    state = Planner(model="gpt3-175b", hardware="8x8xH100-ib", gpus=64, global_batch=512, lang="en")
    first = state.result
    assert first.best is not None and "<table>" in state.table.value and "Best:" in state.explanation.value
    state.controls["gpus"].value = 12  # not whole nodes: refused, last good table kept
    assert "not a multiple" in state.status.value and state.result is first
    state.controls["gpus"].value = 32
    assert state.result.gpus == 32 and "layouts fit" in state.status.value
    state.controls["model"].value = "13B"
    assert state.result.model.layers == 40
    state.controls["lang"].value = "ko"
    assert "최선" in state.explanation.value and state.controls["gpus"].description == "GPU 수"
    state.controls["hardware"].value = "8xH100-nvlink"  # 32 GPUs on one node: refused with the multi-node presets
    assert "Nx8xH100-ib" in state.status.value


def test_planning_a_cluster_does_not_import_torch():
    # sim.plan is closed-form arithmetic: a fresh interpreter paid ~2 s importing torch for it
    # (through mpkit.parallel's package and the cpu-sim cache key); now ~0.13 s in all
    code = ("import sys, mpkit.sim; t = mpkit.sim.plan('gpt3-175b', '8x8xH100-ib', gpus=64, global_batch=512); "
            "t.explain('ko'); t.explain('en'); assert t.best is not None; "
            "print(sorted(m for m in ('torch', 'numpy', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"

