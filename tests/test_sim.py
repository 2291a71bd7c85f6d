"""The cost model: formulas on hand-computed cases, predicted pipeline timelines, memory against
the ZeRO formulas, bad inputs, the what-if widget, and the cpu-sim calibration."""
import json
import math
from dataclasses import replace

import matplotlib
import pytest

from mpkit.models import ModelConfig, parameter_count
from mpkit.sim import GPU_PRESETS, Hardware, Link, formulas, predict
from mpkit.simulator.engine import simulate
from mpkit.parallel.pipeline.schedules import schedule
from mpkit.pricing.pipeline_program import engine_programs

matplotlib.use("Agg")

GB = 1e9
# A machine with no communication cost and a pure FLOP clock: durations follow FLOPs exactly.
IDEAL = Hardware(name="ideal", flops=1e9, mfu=1.0, mem_bw=math.inf,
                 op_overhead={"forward": 0.0, "backward": 0.0, "optimizer": 0.0},
                 p2p=Link(0.0, 0.0), collective=Link(0.0, 0.0))


# ---- formulas ------------------------------------------------------------------------------

def test_bubble_fractions():
    assert formulas.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert formulas.bubble_fraction(4, 4, schedule="1f1b") == pytest.approx(3 / 7)
    assert formulas.bubble_fraction(4, 8, v=2, schedule="interleaved") == pytest.approx(3 / 16)
    assert formulas.bubble_fraction(4, 8, v=2, schedule="interleaved", relative_to="step") == pytest.approx(3 / 19)
    assert formulas.bubble_fraction(4, 4, relative_to="ideal") == pytest.approx(3 / 4)
    assert formulas.bubble_fraction(1, 4) == 0


def test_inflight_activations():
    assert [formulas.inflight_activations("gpipe", 4, 8, r) for r in range(4)] == [8] * 4
    assert [formulas.inflight_activations("1f1b", 4, 8, r) for r in range(4)] == [4, 3, 2, 1]
    assert formulas.inflight_activations("1f1b", 4, 2, 0) == 2
    assert formulas.inflight_activations("interleaved", 4, 8, 0, v=2) == 2 * 3 + 4 + 1


def test_formulas_take_numpy_numbers():
    """A sweep over np.arange hands numpy integers (and numpy floats) to every formula:
    inflight_activations refused rank=np.int64(2), _positive np.int64 bytes, zero_memory and the
    alpha-beta times numpy sizes. One predicate each (mpkit.whole.is_whole and is_number) decides."""
    import numpy as np
    from mpkit.config import is_number, is_whole
    from mpkit.whole import is_number as number, is_whole as whole
    assert is_whole is whole and is_whole(np.int64(2)) and not is_whole(True) and not is_whole(2.0)
    # and one real-number predicate, for the formulas' sizes and train's learning rate
    assert is_number is number and is_number(np.float32(0.5)) and is_number(np.int64(2)) and is_number(2.0)
    assert not is_number(True) and not is_number("1") and not is_number(1j)
    assert [formulas.inflight_activations("1f1b", np.int64(4), np.int64(8), np.int64(r)) for r in range(4)] == \
        [4, 3, 2, 1]
    assert formulas.inflight_activations("interleaved", 4, 8, np.int32(0), v=np.int64(2)) == 2 * 3 + 4 + 1
    assert formulas.ring_allreduce_bytes(np.int64(100), np.int64(4)) == 150
    assert formulas.zero_memory(np.int64(1000), 4, 3, np.int64(2), np.float32(2), 12)["parameters"] == 500
    assert formulas.p2p_time(np.int64(1000), np.float32(0.5), 0.0) == 0.5
    for bad in (True, 2.0, -1, np.int64(4)):
        with pytest.raises(ValueError, match="rank="):
            formulas.inflight_activations("1f1b", 4, 8, bad)
    with pytest.raises(ValueError, match="S=True must be a positive, finite number"):
        formulas.ring_allreduce_bytes(True, 4)


def test_collective_bytes_and_bus_bandwidth():
    S = 100e6
    assert formulas.ring_allreduce_bytes(S, 4) == pytest.approx(150e6)
    assert formulas.reduce_scatter_bytes(S, 4) == pytest.approx(75e6)
    assert formulas.all_gather_bytes(S, 4) == pytest.approx(75e6)
    assert formulas.bus_bandwidth(100 * GB, 8) == pytest.approx(175 * GB)
    # nccl-tests' factor is per collective, not the all-reduce's for all (doc/PERFORMANCE.md)
    assert formulas.bus_bandwidth(100 * GB, 8, "all_gather") == pytest.approx(87.5 * GB)
    assert formulas.bus_bandwidth(100 * GB, 8, "reduce_scatter") == pytest.approx(87.5 * GB)
    assert formulas.bus_bandwidth(100 * GB, 8, "broadcast") == pytest.approx(100 * GB)
    with pytest.raises(ValueError, match="collective='allreduce': use one of 'all_reduce'"):
        formulas.bus_bandwidth(100 * GB, 8, "allreduce")


def test_zero_memory_mixed_precision():
    psi, n = 1e9, 8
    totals = [sum(formulas.zero_memory(psi, n, stage).values()) for stage in (0, 1, 2, 3)]
    assert totals == pytest.approx([16 * GB, 5.5 * GB, 3.75 * GB, 2 * GB])
    fp32 = formulas.zero_memory(psi, n, 1, param_bytes=4, grad_bytes=4, optim_bytes=8)
    assert fp32 == pytest.approx({"parameters": 4 * GB, "gradients": 4 * GB, "optimizer": 1 * GB})


def test_activation_memory_korthikanti():
    s, b, h, a = 2048, 1, 4096, 32
    assert formulas.activation_memory_per_layer(s, b, h, a) == s * b * h * (34 + 5 * a * s / h) == 956_301_312
    assert formulas.activation_memory_per_layer(s, b, h, a, t=8) == pytest.approx(s * b * h * (10 + 3 + 10))


def test_alpha_beta_times():
    alpha, beta = 1e-5, 1e-9
    assert formulas.p2p_time(1e6, alpha, beta) == pytest.approx(1e-5 + 1e-3)
    assert formulas.ring_allreduce_time(4e6, 4, alpha, beta) == pytest.approx(6 * (1e-5 + 1e-3))
    assert formulas.ring_reduce_scatter_time(4e6, 4, alpha, beta) == pytest.approx(3 * (1e-5 + 1e-3))
    assert formulas.tree_allreduce_time(4e6, 4, alpha, beta) == pytest.approx(4 * (1e-5 + 4e-3))
    small, large = 64, 64e6  # tree wins on latency, ring on bandwidth
    assert formulas.allreduce_time(small, 8, alpha, beta) == formulas.tree_allreduce_time(small, 8, alpha, beta)
    assert formulas.allreduce_time(large, 8, alpha, beta) == formulas.ring_allreduce_time(large, 8, alpha, beta)


@pytest.mark.parametrize("call", [
    lambda: formulas.ring_allreduce_bytes(-1, 4), lambda: formulas.ring_allreduce_bytes(100, 0),
    lambda: formulas.zero_memory(0, 8, 1), lambda: formulas.zero_memory(1e9, 8, 4),
    lambda: formulas.bubble_fraction(4, 0), lambda: formulas.bubble_fraction(4, 4, schedule="zigzag"),
    lambda: formulas.activation_memory_per_layer(-2, 1, 1, 1), lambda: formulas.p2p_time(0, 1e-6, 1e-9),
    lambda: formulas.p2p_time(10, -1, 1e-9), lambda: formulas.inflight_activations("1f1b", 4, 4, 4),
])
def test_formulas_reject_bad_sizes(call):
    with pytest.raises(ValueError):
        call()


# ---- pipeline timelines ----------------------------------------------------------------------

def _equal_stage_trace(name, p, m, v=1, f=1.0, b=2.0):
    programs = engine_programs(schedule(name, p, m, v), lambda s, mb: f / v, lambda s, mb: b / v,
                                 lambda kind, stage, src, dst: (0, 0.0), lambda rank: 0.0)
    return simulate(programs).filter(category="compute")


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 4, 1), ("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1),
                                        ("1f1b", 3, 5, 1), ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3)])
def test_bubble_of_predicted_trace_equals_formula(name, p, m, v):
    trace = _equal_stage_trace(name, p, m, v)
    expected = formulas.bubble_fraction(p, m, v, name, relative_to="step")
    assert trace.bubble_share() == pytest.approx(expected, abs=1e-9)


def _in_flight(trace, rank):
    """Most forwards done on ``rank`` whose backward has not finished."""
    marks = sorted([(e.end, 1) for e in trace.of_rank(rank) if e.kind == "forward"]
                   + [(e.end, -1) for e in trace.of_rank(rank) if e.kind == "backward"])
    level = peak = 0
    for _, delta in marks:
        level += delta
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_predicted_pipeline_shape(name):
    p, m = 4, 8
    pred = predict("pp", hardware=IDEAL, world_size=p, model="mlp", d_in=64, hidden=64, classes=64,
                   batch_size=32, schedule=name, micro_batches=m)
    trace = pred.trace
    first = {r: min(e.start for e in trace.of_rank(r) if e.kind == "forward") for r in range(p)}
    slot = {r: next(e.duration for e in trace.of_rank(r) if e.kind == "forward") for r in range(p)}
    for r in range(p):  # rank r waits for r forward slots of the ranks before it
        assert first[r] == pytest.approx(sum(slot[q] for q in range(r)))
    in_flight = [_in_flight(trace, r) for r in range(p)]
    assert in_flight == ([m] * p if name == "gpipe" else [p - r for r in range(p)])
    events = [e for e in trace.events if e.kind in ("forward", "backward")]
    assert {(e.stage, e.micro_batch) for e in events} == {(s, i) for s in range(p) for i in range(m)}
    assert all(e.step == 0 for e in trace.events)


def test_pp_follows_the_strategy_schedule_order():
    pred = predict("pp", hardware=IDEAL, world_size=2, schedule="1f1b", micro_batches=4)
    lists = schedule("1f1b", 2, 4)
    for rank in range(2):
        predicted = [(e.kind, e.micro_batch) for e in pred.trace.of_rank(rank) if e.kind in ("forward", "backward")]
        expected = [(type(i).__name__.lower(), i.mb) for i in lists[rank] if type(i).__name__ in ("Forward", "Backward")]
        assert predicted == expected


def test_engine_reports_a_deadlock_instead_of_hanging():
    from mpkit.simulator.engine import Msg, P2P

    waits_for_each_other = [[P2P((Msg("recv", 1, "a", 4, 0.0),)), P2P((Msg("send", 1, "b", 4, 0.0),))],
                            [P2P((Msg("recv", 0, "b", 4, 0.0),)), P2P((Msg("send", 0, "a", 4, 0.0),))]]
    with pytest.raises(RuntimeError, match="deadlock: rank 0 waits"):
        simulate(waits_for_each_other)


def test_dp_overlap_hides_communication():
    kw = dict(hardware=GPU_PRESETS["8xH100-pcie"], world_size=8, model="mlp", hidden=1024, layers=8,
              batch_size=64, bucket_mb=1)
    plain, overlapped = predict("dp", **kw), predict("dp", overlap=True, **kw)
    assert plain.breakdown["compute"] == pytest.approx(overlapped.breakdown["compute"])
    assert overlapped.breakdown["comm"] < plain.breakdown["comm"]
    assert overlapped.step_time < plain.step_time


def test_dp_communication_is_the_ring_formula():
    hw = GPU_PRESETS["8xA100-nvlink"]
    pred = predict("dp", hardware=hw, world_size=8, model="mlp", hidden=1024, batch_size=64, bucket_mb=1000,
                   first_bucket_mb=1000)
    size = parameter_count(ModelConfig(kind="mlp", hidden=1024)) * 2  # one bf16 bucket
    comm = [e for e in pred.trace.of_rank(0) if e.kind == "all_reduce"]
    assert len(comm) == 1 and comm[0].bytes == size
    expected = min(formulas.ring_allreduce_time(size, 8, hw.collective.alpha, hw.collective.beta),
                   formulas.tree_allreduce_time(size, 8, hw.collective.alpha, hw.collective.beta))
    assert comm[0].duration == pytest.approx(expected)
    assert pred.breakdown["comm"] == pytest.approx(expected)


def test_tp_issues_two_all_reduces_per_block_each_way():
    pred = predict("tp", hardware=IDEAL, world_size=2, model="gpt", layers=3)
    names = [e.name for e in pred.trace.of_rank(0) if e.kind == "all_reduce"]
    assert sum(n.startswith("g forward") for n in names) == 2 * 3
    assert sum(n.startswith("f backward") for n in names) == 2 * 3


# ---- memory ------------------------------------------------------------------------------------

def _psi(**sizes):
    return parameter_count(ModelConfig(**sizes))


def test_zero1_memory_is_the_formula():
    n, psi = 4, _psi(kind="mlp", hidden=128)
    pred = predict("zero1", hardware=IDEAL, world_size=n, hidden=128)
    states = formulas.zero_memory(psi, n, 1, param_bytes=4, grad_bytes=4, optim_bytes=8)
    for mem in pred.memory:
        assert mem["parameters"] == states["parameters"]
        assert mem["optimizer"] == states["optimizer"] + 4  # + Adam's one step counter (one flat tensor)
        assert mem["gradients"] >= states["gradients"]


def test_fsdp_memory_is_sharded_like_zero3():
    n = 4
    cfg = dict(kind="mlp", hidden=128, d_in=128, classes=128)  # every dim 0 divisible by n: no padding
    psi = _psi(**cfg)
    pred = predict("fsdp", hardware=IDEAL, world_size=n, model="mlp", hidden=128, d_in=128, classes=128)
    states = formulas.zero_memory(psi, n, 3, param_bytes=4, grad_bytes=4, optim_bytes=8)
    assert pred.memory[0]["parameters"] == states["parameters"]
    assert pred.memory[0]["gradients"] == states["gradients"]
    assert pred.memory[0]["optimizer"] == states["optimizer"] + 4 * 8  # 4 layers x (weight, bias) counters


def test_tp_memory_splits_the_big_matrices():
    h, t, layers = 64, 4, 2
    pred = predict("tp", hardware=IDEAL, world_size=t, model="gpt", hidden=h, layers=layers)
    cfg = ModelConfig(kind="gpt", hidden=h, layers=layers)
    split = layers * (3 * h * h + 3 * h + h * h + 4 * h * h + 4 * h + 4 * h * h)  # qkv, proj w, up, down w
    expected = parameter_count(cfg) - split + split // t
    assert pred.memory[0]["parameters"] == 4 * expected
    assert pred.memory[0]["optimizer"] == 8 * expected + 4 * sum(1 for _ in _named(cfg))


def _named(cfg):
    from mpkit.models import build_model

    return list(build_model(cfg).parameters())


def test_pipeline_activations_follow_in_flight_micro_batches():
    kw = dict(hardware=IDEAL, world_size=4, micro_batches=8, batch_size=64, hidden=128)
    gpipe, one_f = predict("pp", schedule="gpipe", **kw), predict("pp", schedule="1f1b", **kw)
    assert one_f.memory[0]["activations"] < gpipe.memory[0]["activations"]
    assert gpipe.memory[0]["parameters"] == one_f.memory[0]["parameters"]


def test_gpu_presets_use_mixed_precision_states():
    psi = _psi(kind="mlp", hidden=256)
    pred = predict("zero1", hardware="8xH100-nvlink", world_size=8, hidden=256, batch_size=64)
    states = formulas.zero_memory(psi + (-psi) % 8, 8, 1)
    assert pred.memory[0]["parameters"] == pytest.approx(states["parameters"])
    assert pred.memory[0]["optimizer"] == pytest.approx(states["optimizer"])


def test_prediction_plots_like_a_run():
    from mpkit import plot

    pred = predict("pp", hardware=IDEAL, world_size=2, micro_batches=2)
    assert plot.timeline(pred) is not None
    assert plot.memory(pred) is not None


# ---- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(strategy="warp"), "unknown; use one of"),
    (dict(strategy="dp", hardware="tpu-v9"), "cpu-sim, 8xA100-nvlink"),
    (dict(strategy="tp", world_size=3, model="gpt"), "does not divide heads"),
    (dict(strategy="tp", world_size=8, model="gpt"), "heads"),
    (dict(strategy="pp", world_size=8, model="mlp"), "more than the 4 layers"),
    (dict(strategy="dp", batch_size=-4), "batch_size"),
    (dict(strategy="dp", hidden=-8), "hidden"),
    (dict(strategy="pp", schedule="zigzag"), "gpipe"),
    (dict(strategy="ps", mode="async", batch_size=30), "mode='sync'"),
    (dict(strategy="dp", bogus=1), "options are"),
])
def test_bad_inputs_name_the_choices(kwargs, match):
    kwargs.setdefault("hardware", IDEAL)
    with pytest.raises(ValueError, match=match):
        predict(**kwargs)


# ---- what-if widget -------------------------------------------------------------------------

def test_whatif_recomputes_on_slider_change():
    from mpkit.widgets.whatif import WhatIf

    state = WhatIf("pp", hardware="8xA100-nvlink", draw=False)
    assert state.prediction.world_size == 4
    state.controls["world_size"].value = 2
    assert state.prediction.world_size == 2
    before = state.prediction.step_time
    state.controls["micro_batches"].value = 8
    assert len(state.prediction.trace.filter(kind="forward").events) == 2 * 8
    assert state.prediction.step_time != before
    slow = state.prediction.step_time
    state.controls["bandwidth"].value = 0.1
    assert state.prediction.step_time > slow
    state.controls["micro_batches"].value = 5  # 32 % 5 != 0: refused, last good prediction kept
    assert "micro_batches" in state.status.value and state.prediction.config.options["micro_batches"] == 8


def test_whatif_hardware_switch_resets_bandwidth():
    from mpkit.widgets.whatif import WhatIf

    state = WhatIf("dp", hardware="8xA100-nvlink", draw=False)
    state.controls["hardware"].value = "8xH100-pcie"
    assert state.controls["bandwidth"].value == pytest.approx(GPU_PRESETS["8xH100-pcie"].p2p.bandwidth / 1e9)
    assert state.prediction.hardware.flops == GPU_PRESETS["8xH100-pcie"].flops


def test_whatif_speaks_korean_or_english(monkeypatch):
    """Lab 05's what-if widget was English only (issue 46): its labels, status line and plots follow
    ``lang`` (a control, as the planner's)."""
    from mpkit.widgets import whatif as module

    drawn = []
    monkeypatch.setattr(module.plot, "timeline", lambda run, lang: drawn.append(("timeline", lang)))
    monkeypatch.setattr(module.plot, "memory", lambda run, lang: drawn.append(("memory", lang)))
    monkeypatch.setattr(module, "display", lambda fig: None)
    box = module.whatif("pp", hardware="8xA100-nvlink", lang="ko")
    state = box.whatif
    assert [state.controls[k].description for k in ("world_size", "micro_batches", "hidden", "layers")] == \
        ["랭크 수", "마이크로배치", "은닉 크기", "레이어"]
    assert state.status.value.startswith("스텝 ") and "통신" in state.status.value
    assert drawn == [("timeline", "ko"), ("memory", "ko")]
    state.controls["lang"].value = "en"
    assert state.controls["world_size"].description == "world size" and state.status.value.startswith("step ")
    assert drawn[-2:] == [("timeline", "en"), ("memory", "en")]
    state.controls["micro_batches"].value = 5  # refused: said in the widget's language, the error's text kept
    assert "not predicted" in state.status.value and "micro_batches" in state.status.value
    with pytest.raises(ValueError, match="lang must be one of 'ko', 'en'"):
        module.whatif("pp", hardware="8xA100-nvlink", lang="fr")


def test_measured_tables_interpolate_and_replace_the_formula():
    def sweep(rows, gap=1e-4):
        return {"gap": gap, "rows": rows}

    table = {"all_reduce/2": {"warm": sweep([[1000, 1e-3], [3000, 3e-3]]),
                              "cold": sweep([[1000, 3e-3], [3000, 5e-3]], gap=2.1e-3)},
             "p2p/2": {"warm": sweep([[1000, 2e-4], [2000, 4e-4]])}}
    hw = Hardware(name="t", flops=1e12, mfu=1.0, mem_bw=1e11, collective=Link(1e-5, 1e-9), p2p=Link(1e-5, 1e-9),
                  measured=table)
    assert hw.measured_time("all_reduce", 500, 2) == 1e-3  # below the table: its first row
    assert hw.measured_time("all_reduce", 2000, 2) == pytest.approx(2e-3)  # between rows: linear
    assert hw.measured_time("all_reduce", 5000, 2) == pytest.approx(5e-3)  # beyond: the last segment's slope
    assert hw.measured_time("all_reduce", 2000, 4) is None and hw.measured_time("all_gather", 2000, 2) is None
    # after compute: halfway between the warm and the cold sweep's gaps, halfway in time; clamped beyond
    assert hw.measured_time("all_reduce", 2000, 2, gap=1.1e-3) == pytest.approx(3e-3)
    assert hw.measured_time("all_reduce", 2000, 2, gap=1.0) == pytest.approx(4e-3)
    assert hw.measured_time("p2p", 1500, 2, gap=1.0) == pytest.approx(3e-4)  # no cold sweep: the warm one
    noisy = Hardware(**{**hw.__dict__, "measured": {"p2p/2": {"warm": sweep([[1000, 2e-4], [2000, 4e-4]]),
                                                              "cold": sweep([[1000, 1e-4], [2000, 2e-4]], gap=1e-3)}}})
    assert noisy.measured_time("p2p", 1500, 2, gap=1.0) == pytest.approx(3e-4)  # cold below warm: noise, warm wins
    pred = predict("dp", hardware=hw, world_size=2, hidden=64)  # 2 ranks: the table, not alpha-beta
    bucket = next(e for e in pred.trace.events if e.kind == "all_reduce")
    before = sum(e.end - e.start for e in pred.trace.of_rank(0) if e.category == "compute" and e.end <= bucket.start)
    assert 0 < before < 2e-3  # between the sweeps' gaps, so the gap matters
    assert bucket.end - bucket.start == pytest.approx(hw.measured_time("all_reduce", bucket.bytes, 2, gap=before))
    sends = [e for e in predict("pp", hardware=hw, world_size=2, hidden=64).trace.events if e.kind == "send"]
    assert sends and all(e.end - e.start == pytest.approx(hw.measured_time("p2p", e.bytes, 2)) for e in sends)
    assert hw.with_bandwidth(10).measured == {}  # a bandwidth slider overrides this machine's tables


def test_compute_concurrency_is_what_a_second_of_compute_shares():
    from mpkit.observe.trace import Event, Trace
    from mpkit.costmodel.prediction import compute_concurrency

    def ev(rank, kind, start, end):
        return Event(rank=rank, kind=kind, start=start, end=end)

    # rank 0 computes 0-2 s, rank 1 1-2 s (its recv 0-1 s does not count): c = 1 then 2,
    # so (1·1² + 1·2²) / (1·1 + 1·2) = 5/3 — the plain average (3 s of compute over 2 s) would say 1.5
    trace = Trace(events=[ev(0, "forward", 0, 2), ev(1, "recv", 0, 1), ev(1, "backward", 1, 2)])
    assert compute_concurrency(trace) == pytest.approx(5 / 3)
    # four data-parallel ranks computing together, then all waiting: 4, however long the wait
    together = Trace(events=[ev(r, "forward", 0, 1) for r in range(4)] + [ev(r, "all_reduce", 1, 9) for r in range(4)])
    assert compute_concurrency(together) == pytest.approx(4)
    slow = Hardware(name="t", flops=1e9, mfu=1.0, mem_bw=1e11, collective=Link(1e-5, 1e-9), p2p=Link(1e-5, 1e-9))
    shared = Hardware(**{**slow.__dict__, "cores": 2})
    assert predict("dp", hardware=shared, world_size=4).slowdown == pytest.approx(2.0)  # 4 ranks on 2 cores


def test_stage_overhead_lengthens_each_pipeline_instruction():
    base = Hardware(name="t", flops=1e12, mfu=1.0, mem_bw=1e11, collective=Link(1e-5, 1e-9), p2p=Link(1e-5, 1e-9))
    slow = Hardware(**{**base.__dict__, "stage_overhead": {"forward": 1e-3, "backward": 2e-3}})
    kw = dict(world_size=2, schedule="1f1b", micro_batches=4)
    plain, padded = predict("pp", hardware=base, **kw).trace, predict("pp", hardware=slow, **kw).trace
    for kind, extra in (("forward", 1e-3), ("backward", 2e-3)):
        a = sorted(e.duration for e in plain.events if e.kind == kind)
        b = sorted(e.duration for e in padded.events if e.kind == kind)
        assert len(a) == len(b) == 8 and all(y == pytest.approx(x + extra) for x, y in zip(a, b))
    optimizer = [e.duration for e in plain.events if e.kind == "optimizer"]
    assert optimizer == pytest.approx([e.duration for e in padded.events if e.kind == "optimizer"])


def test_monotone_pools_dips_into_their_neighbours():
    from mpkit.costmodel.calibration import monotone

    rows = [[1, 1.0], [2, 0.5], [3, 1.12], [4, 2.0], [5, 1.8], [6, 8.0]]
    assert monotone(rows) == [[1, 0.75], [2, 0.75], [3, 1.12], [4, pytest.approx(1.9)], [5, pytest.approx(1.9)], [6, 8.0]]
    assert monotone([[1, 3.0], [2, 2.0], [3, 1.0]]) == [[1, 2.0], [2, 2.0], [3, 2.0]]  # all pooled: the mean
    already = [[1, 0.1], [2, 0.2]]
    assert monotone(already) == already


def test_step_overhead_leads_every_rank():
    hw = Hardware(name="t", flops=1e12, mfu=1.0, mem_bw=1e11, collective=Link(1e-5, 1e-9), p2p=Link(1e-5, 1e-9),
                  step_overhead=2e-3)
    without = predict("dp", hardware=Hardware(**{**hw.__dict__, "step_overhead": 0.0}), world_size=2)
    pred = predict("dp", hardware=hw, world_size=2)
    assert pred.step_time == pytest.approx(without.step_time + 2e-3)
    for rank in (0, 1):
        first = min(pred.trace.of_rank(rank), key=lambda e: e.start)
        assert first.kind == "compute" and first.end - first.start == pytest.approx(2e-3)


def test_phase_times_price_the_slow_tail():
    """The compute fit reads each phase's mean after the warm-up, not its median: beside a busy loop
    one forward in four waits a time slice, and a step pays that wait on average."""
    from types import SimpleNamespace

    from mpkit.observe.trace import Event
    from mpkit.costmodel.calibration import _CAL_WARMUP, phase_times

    events, t = [], 0.0
    for step in range(_CAL_WARMUP + 4):
        forward = 9e-3 if step == _CAL_WARMUP + 1 else 1e-3  # one steady forward in four waits a slice
        forward = forward if step >= _CAL_WARMUP else 50e-3  # the warm-up's slow steps do not count
        for kind, seconds in (("forward", forward), ("backward", 2e-3), ("optimizer", 1e-3)):
            events.append(Event(0, kind, t, t + seconds, step=step))
            t += seconds
        t += 0.5e-3  # the loop's own work between the phases of consecutive steps
    starts = sorted({e.step: e.start for e in reversed(events)}.items())
    run = SimpleNamespace(trace=SimpleNamespace(events=events),
                          step_periods=lambda: [b - a for (_, a), (_, b) in zip(starts, starts[1:])])
    times, outside = phase_times(run)
    assert times["forward"] == pytest.approx(3e-3)  # (9 + 1 + 1 + 1) / 4 ms; the median would say 1 ms
    assert times["backward"] == pytest.approx(2e-3) and times["optimizer"] == pytest.approx(1e-3)
    assert outside == pytest.approx(0.5e-3)


# ---- calibration (forks ranks) ------------------------------------------------------------

@pytest.mark.timeout(150)
def test_cpu_sim_calibration_is_measured_and_cached(tmp_path, no_leftovers):
    from mpkit.costmodel import calibration
    from mpkit.simulator import machines

    path = tmp_path / "cpu-sim.json"
    with pytest.raises(machines.NotCalibrated, match=r"run mpkit.sim.calibrate\(\) once first"):
        machines.cpu_sim(cache_file=path)  # predicting never measures by itself
    hw = calibration.calibrate(refresh=True, cache_file=path)
    assert 1e8 < hw.flops < 1e13 and hw.mem_bw > 1e8
    assert all(0 < v < 1e-3 for v in hw.op_overhead.values())
    assert 0 < hw.p2p.alpha < 0.05 and hw.p2p.bandwidth > 1e7
    assert 0 < hw.collective.alpha < 0.05 and hw.collective.bandwidth > 1e6
    # a mean of per-step samples (a step's period less its own phases, which lie inside it): > 0
    # by construction, not by the luck of subtracting separately measured statistics
    assert 0 < hw.step_overhead < 0.05 and hw.background >= 0
    assert 0.05 < hw.lone_share <= 1.05  # a share of one core, CPU time over wall time
    assert 0 <= hw.wake_max < 0.05 and hw.wake_tau > 0  # a wait of milliseconds at most, fitted
    assert [s for s, _ in hw.late_waits] == list(calibration._LATE_GAPS) and all(0 <= w < 0.05 for _, w in hw.late_waits)
    assert set(hw.stage_overhead) == {"forward", "backward"} and all(0 <= v < 0.01 for v in hw.stage_overhead.values())
    # the CPU model, fitted to real multi-rank steps: priced compute costs CPU about one for one (a
    # rank's CPU per second of priced compute, 0.65-2.2 fitted here quiet and loaded), and
    # communication costs some CPU per operation (gloo's threads, the executor)
    from mpkit.costmodel.cpu import TERMS
    assert set(hw.cpu) == set(TERMS) and all(v >= 0 for v in hw.cpu.values())
    assert 0.3 < hw.cpu["compute"] < 5, hw.cpu
    assert hw.cpu["collective_step"] + hw.cpu["message"] > 0, hw.cpu
    expected = {f"{kind}/{world}" for kind in ("all_reduce", "reduce_scatter", "all_gather", "p2p") for world in (2, 4)}
    assert set(hw.measured) == expected
    # Warm and cold differ by the compute before each operation, fixed in matmuls (20x more for
    # cold), and the measured gaps must say so: cold is ~20x warm's ~3 ms of timed work, so one
    # table could reverse only if a rank were descheduled for >50 ms inside it; 7 of 8 leaves room
    # for that, while swapped or mislabelled sweeps fail every table.
    longer = [entry["cold"]["gap"] > entry["warm"]["gap"] for entry in hw.measured.values()]
    assert sum(longer) >= len(longer) - 1, {k: (e["warm"]["gap"], e["cold"]["gap"]) for k, e in hw.measured.items()}
    for key, entry in hw.measured.items():
        assert set(entry) == {"warm", "cold"}
        assert entry["warm"]["matmuls"] == calibration._GAPS["warm"][key.startswith("p2p")]
        assert entry["cold"]["matmuls"] == calibration._GAPS["cold"][key.startswith("p2p")]
        assert entry["warm"]["matmuls"] < entry["cold"]["matmuls"]
        for sweep in entry.values():
            assert 0 < sweep["gap"] < 1.0
            # a relay's two barriers are timed alone and taken out of its hops; collectives have none
            assert (0 <= sweep["barrier"] < 0.1) if key.startswith("p2p") else "barrier" not in sweep
            times = [t for _, t in sweep["rows"]]
            assert len(times) >= 4 and all(0 < t < 1.0 for t in times) and times == sorted(times)
    assert machines.cpu_sim(cache_file=path) is hw  # this process's copy
    machines._memory.clear()
    again = machines.cpu_sim(cache_file=path)  # from the file, not measured again
    assert again == hw and json.loads(path.read_text())
    pred = predict("dp", hardware=again, world_size=2)
    assert pred.step_time > 0 and pred.breakdown["comm"] > 0
    assert len(pred.cpu_seconds) == 2 and min(pred.cpu_seconds) > 0 and pred.step_time >= pred.played_time > 0


def test_compute_stretch_is_processor_sharing_with_the_background():
    two = Hardware(name="two cores", flops=1e9, mfu=1.0, mem_bw=1e9, cores=2)
    assert [two.compute_stretch(c) for c in (1, 2, 4)] == [1.0, 1.0, 2.0]  # idle machine: c/cores past 2
    loaded = Hardware(name="two cores, two spinners", flops=1e9, mfu=1.0, mem_bw=1e9, cores=2, background=2.0)
    # calibrated at share 2/3 (1 rank + 2 spinners on 2 cores); 2 ranks get 2/4, 4 ranks 2/6
    assert loaded.compute_stretch(1) == 1.0
    assert loaded.compute_stretch(2) == pytest.approx(4 / 3)
    assert loaded.compute_stretch(4) == pytest.approx(2.0)
    # one busy loop pinned to each core: the calibration's lone rank shared its core with one (1/2);
    # 2 ranks get 1/2 each too (one per core), 4 ranks 1/3
    pinned = replace(loaded, lone_share=0.5)
    assert [pinned.compute_stretch(c) for c in (1, 2, 4)] == pytest.approx([1.0, 1.0, 1.5])
    assert Hardware(name="gpu", flops=1e9, mfu=1.0, mem_bw=1e9).compute_stretch(8) == 1.0  # own devices


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, True])
def test_byte_and_time_coefficients_refuse_nan_and_inf(bad):
    with pytest.raises(ValueError, match=r"psi=.* must be a positive, finite number"):
        formulas.zero_memory(bad, 4, 1)
    # nan < 0 is False: zero_memory returned nan bytes and p2p_time nan seconds, silently
    with pytest.raises(ValueError, match=r"param_bytes=.* must be a finite number >= 0"):
        formulas.zero_memory(1000, 4, 1, param_bytes=bad)
    with pytest.raises(ValueError, match=r"alpha=.* must be a finite number of seconds"):
        formulas.p2p_time(1000, bad, 1e-9)

