"""What the planner says (issue 31, content review 2: F3-F8, F21, T1): its assumptions are
stated and switchable, MFU and HFU both shown, and the explanation's sentences are true of the
numbers beside them."""
import pytest

from mpkit.sim import plan, planner
from mpkit.widgets.planwidget import Planner

LAB = dict(model="gpt3-175b", hardware="128x8xA100-ib", gpus=1024, global_batch=1536)


@pytest.fixture(scope="module")
def lab_table():
    return plan(**LAB, zero=1)


def test_the_table_states_what_it_assumed_and_what_was_pinned(lab_table):
    # F3: sequence parallelism and flash attention decide whether the winner fits (130 GB without)
    text = str(lab_table)
    assert "Assumed: sequence parallelism on, flash attention on" in text and "pinned: zero=1" in text
    off = plan(**LAB, zero=1, sequence_parallel=False, flash=False, top=3)
    assert "sequence parallelism off, flash attention off" in str(off)
    assert "시퀀스 병렬화(sequence parallelism) 끔" in off.to_text("ko")
    assert "pinned: nothing" in str(plan(**LAB, top=1))


def test_switching_them_off_costs_activation_memory_as_the_review_measured(lab_table):
    # the review's winner (DP outermost; the planner now also searches Megatron's PP-outermost order)
    pinned = dict(dp=32, pp=8, tp=4, micro_batch=1, schedule="interleaved", virtual=4, zero=1, recompute="none",
                  order="dp-pp-cp-tp")
    assert plan(**LAB, **{k: v for k, v in pinned.items() if k not in ("dp", "pp", "tp", "micro_batch", "schedule",
                                                                       "virtual")}).best.setup == \
        plan(**LAB, **pinned).best.setup
    on = plan(**LAB, **pinned).best
    off = plan(**LAB, **pinned, sequence_parallel=False, flash=False).dropped[0]
    assert on.memory["activations"] / 1e9 == pytest.approx(25.0, abs=0.1)  # review F3: 25.0 GB
    assert off.memory_total / 1e9 == pytest.approx(130.5, abs=0.1) and not off.fits  # review F3: 130.5 GB


def test_hfu_counts_recomputation_and_mfu_does_not():
    full = plan(**LAB, zero=1, recompute="full", top=1).best
    none = plan(**LAB, zero=1, recompute="none", top=1).best
    assert none.hfu == pytest.approx(none.mfu)
    # full recomputation runs every forward again: 8 instead of 6 FLOPs per weight (Korthikanti 2022 §6)
    assert full.hfu / full.mfu == pytest.approx(full.hardware_flops_per_token / full.model_flops_per_token)
    assert 1.3 < full.hfu / full.mfu < 1.34
    assert "HFU" in str(plan(**LAB, zero=1, top=1)).splitlines()[2]


def test_the_explanation_says_what_zero_1_shards_and_what_tp_and_pp_send(lab_table):
    text = lab_table.explain("en")
    assert "ZeRO-1 shards the optimizer states only" in text  # F5: not "model states"
    assert "during the last micro-batch's backward, bucket by bucket" in text  # F6
    assert "the planner assumes none is hidden" in text and "tp_comm_overlap" in text  # F7
    assert "its 1/tp slice (12,583 KB) of one micro-batch's 50,332 KB activation" in text  # F8: 4 x 12,583
    assert "With these pins (zero=1) no layout without a pipeline fits" in text  # F4: the pin named
    assert "ZeRO-3 (FSDP)" in text


def test_korean_text_says_layout_not_batch(lab_table):
    ko = lab_table.to_text("ko") + lab_table.explain("ko")
    batches = ko.replace("전역 배치", "").replace("마이크로배치", "")
    assert "레이아웃" in ko and "배치" not in batches  # T1: 배치 is a batch (전역 배치, 마이크로배치) only


def test_the_widget_pins_tp_and_zero_and_switches_the_software():
    # the lab's "try it yourself": planner(..., tp=16) raised TypeError; ZeRO could not be pinned
    box = planner(model="gpt3-175b", hardware="Nx8xA100-ib", gpus=1024, global_batch=1536, tp=16, zero=3, lang="en")
    state = box.planner
    assert state.result.best.setup.layout.tp == 16 and state.result.best.setup.zero == 3
    state.controls["lang"].value = "ko"  # relabelling the dropdowns keeps their values
    assert state.controls["tp"].value == 16 and state.controls["tp"].description == "tp 고정"
    state.controls["tp"].value = None
    state.controls["zero"].value = 1
    assert state.result.pins["tp"] is None and state.result.best.setup.zero == 1
    state.controls["flash"].value = False
    assert state.result.best.setup.flash is False and "플래시 어텐션(flash attention) 끔" in state.table.value
    with pytest.raises(ValueError, match="tp=12: the widget offers"):
        Planner(tp=12)
