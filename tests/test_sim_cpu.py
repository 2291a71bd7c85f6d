"""The CPU model of ``mpkit.sim.cpu`` and the fair-share step ``predict`` takes from it.

The model's coefficients are fitted by the calibration (tests/test_sim.py runs it); here they are
set by hand so that what ``predict`` does with them can be checked exactly.
"""
import numpy as np
import pytest

from mpkit.observe.trace import Event, Trace, union_seconds
from mpkit.sim import Hardware, Link, predict
from mpkit.sim.cpu import TERMS, fit, program_terms, rank_cpu, ring_steps
from mpkit.sim.hardware import runnable_per_core
from mpkit.sim.engine import Collective, Compute, Msg, P2P
from mpkit.sim.prediction import concurrency, fair_share_step

COEFFICIENTS = {"compute": 1.5, "micro_batch_compute": 2.0, "collective_step": 1e-4, "collective_byte": 1e-9,
                "message": 3e-4, "message_byte": 2e-9}


def test_program_terms_count_ring_steps_and_bytes_a_rank_sends():
    program = [Compute("forward", 0.002), Compute("forward", 0.004, stage=0, micro_batch=1),
               Collective("all_reduce", (0, 1, 2, 3), 4000, 0.001, ("a",)),
               Collective("all_gather", (0, 1), 1000, 0.001, ("b",)), Compute("backward", 0.003),
               P2P((Msg("send", 1, "x", 512, 0.0), Msg("recv", 1, "y", 256, 0.0))),
               Collective("all_reduce", (0,), 4000, 0.0, ("alone",))]  # a group of one sends nothing
    terms = program_terms(program)
    assert ring_steps("all_reduce", 4) == 6 and ring_steps("reduce_scatter", 4) == 3
    # a micro-batch's compute apart; 6 + 1 ring steps; each step of the 4-rank all-reduce sends a
    # quarter, of the 2-rank all-gather a half
    assert terms.tolist() == pytest.approx([0.005, 0.004, 7, 6 * 1000 + 1 * 500, 2, 768])
    assert rank_cpu(COEFFICIENTS, program) == pytest.approx(
        1.5 * 0.005 + 2.0 * 0.004 + 7e-4 + 6500e-9 + 2 * 3e-4 + 768 * 2e-9)
    assert rank_cpu({}, program) == 0.0  # an uncalibrated machine has no CPU model


def test_fit_recovers_coefficients_and_drops_negative_ones():
    rng = np.random.default_rng(0)
    truth = np.array([COEFFICIENTS[t] for t in TERMS])
    terms = [rng.uniform([1e-3, 0, 0, 0, 0, 0], [2e-2, 2e-2, 40, 4e6, 40, 1e6]) for _ in range(30)]
    assert fit([(x, float(x @ truth)) for x in terms]) == pytest.approx(COEFFICIENTS, rel=1e-6)
    # measured CPU that *falls* with the bytes of messages (noise) would fit a negative cost per
    # byte: that term is set to 0 and the others refitted, close to the truth
    noisy = [(x, float(x @ truth) - 5e-9 * x[5]) for x in terms]
    unconstrained = np.linalg.lstsq(np.array([x / c for x, c in noisy]), np.ones(len(noisy)), rcond=None)[0]
    assert unconstrained[5] < 0  # the case the constraint exists for
    fitted = fit(noisy)
    assert fitted["message_byte"] == 0.0 and set(fitted) == set(TERMS)
    assert all(value >= 0 for value in fitted.values())
    assert fitted["compute"] == pytest.approx(COEFFICIENTS["compute"], rel=0.5)


def test_runnable_per_core():
    assert runnable_per_core(2, 0.0, 2) == 1.0
    assert runnable_per_core(1, 0.0, 2) == 1.0  # an idle core does not make a rank faster
    assert runnable_per_core(4, 2.0, 2) == 3.0


def _machine(**changes):
    base = dict(name="two cores", flops=1e9, mfu=1.0, mem_bw=1e10, op_overhead=dict.fromkeys(
        ("forward", "backward", "optimizer"), 1e-5), p2p=Link(1e-4, 1e-9), collective=Link(1e-4, 1e-9),
        devices_per_node=1 << 20, cores=2, allreduce="ring")
    return Hardware(**{**base, **changes})


def test_a_loaded_machine_sets_the_step_by_the_fair_share():
    kwargs = dict(world_size=2, model="mlp", hidden=64, layers=4, batch_size=32, schedule="gpipe", micro_batches=4)
    quiet = predict("pp", hardware=_machine(), **kwargs)
    assert quiet.cpu_seconds == [] and quiet.fair_share == 0.0 and not quiet.cpu_bound
    loaded = predict("pp", hardware=_machine(background=2.0, cpu=COEFFICIENTS), **kwargs)
    played = predict("pp", hardware=_machine(background=2.0), **kwargs)  # the same engine, no CPU model
    assert len(loaded.cpu_seconds) == 2 and min(loaded.cpu_seconds) > 0
    # each rank's CPU at 1/k of a core fills its busy part of the played step, which stretches alike
    k = runnable_per_core(concurrency(played.trace), 2.0, 2)
    busy = [union_seconds(played.trace.of_rank(r)) for r in (0, 1)]
    assert loaded.sharing == pytest.approx(k) and 1.5 < k < 2.0  # 1-2 ranks busy at once, 2 spinners, 2 cores
    assert loaded.fair_share == pytest.approx(max(played.played_time * k * c / b for c, b in zip(loaded.cpu_seconds, busy)))
    assert loaded.cpu_bound and loaded.step_time == pytest.approx(loaded.fair_share)
    start, end = loaded.trace.window()
    assert end - start == pytest.approx(loaded.step_time)  # the timeline is as long as the step
    assert sum(loaded.breakdown.values()) == pytest.approx(loaded.step_time)  # and so are its parts
    assert played.played_time == pytest.approx(loaded.played_time)
    stretch = loaded.step_time / loaded.played_time
    assert loaded.breakdown["compute"] == pytest.approx(played.breakdown["compute"] * stretch)
    assert len(loaded.trace.events) == len(quiet.trace.events)
    assert "CPU-bound" in loaded.summary() and "CPU-bound" not in quiet.summary()
    # the same machine with far fewer CPU seconds a step: the played step stands, unstretched
    light = predict("pp", hardware=_machine(background=2.0, cpu=dict.fromkeys(TERMS, 0.0) | {"compute": 0.01}),
                    **kwargs)
    assert not light.cpu_bound and light.step_time > light.fair_share > 0


def _event(rank, kind, start, end):
    return Event(rank=rank, kind=kind, start=start, end=end)


def test_a_pipeline_handoff_waits_through_the_fair_share():
    """Rank 0 works 0-1 s, then rank 1 works 1-2 s: one rank busy at a time. On two cores with a
    busy loop pinned to each, the calibration's lone rank got half a core, so k = 2 (not the 1.5 of
    sharing all the cores); rank 1 needs 1 CPU-second in its 1 busy second, so its busy part takes 2 s
    and rank 0's wait for it too: the step is 4 s, where k·C alone would say 2."""
    handoff = Trace(events=[_event(0, "forward", 0, 1), _event(1, "forward", 1, 2)])
    assert concurrency(handoff) == pytest.approx(1.0)
    pinned = _machine(background=2.0, lone_share=0.5)
    assert fair_share_step(handoff, [0.5, 1.0], pinned) == pytest.approx((4.0, 2.0))
    # both ranks busy together (data parallel): the step is k·C of the busiest, nothing waits
    together = Trace(events=[_event(r, "forward", 0, 1) for r in (0, 1)])
    assert fair_share_step(together, [0.5, 1.0], pinned) == pytest.approx((2.0, 2.0))
    # a rank's overlapping events (compute beside an async collective) are one busy span
    overlapping = Trace(events=[_event(0, "forward", 0, 1), _event(0, "all_reduce", 0.5, 1.5), _event(1, "forward", 0, 1)])
    assert concurrency(overlapping) == pytest.approx((2 ** 2 * 1 + 1 ** 2 * 0.5) / (2 * 1 + 1 * 0.5))


def test_simulated_device_time_needs_no_cpu():
    """``layer_ms`` layers sleep in place of device work: the step is longer, its CPU is not."""
    hw = _machine(background=2.0, cpu=COEFFICIENTS)
    kwargs = dict(world_size=2, model="mlp", hidden=64, layers=4, batch_size=32, schedule="gpipe", micro_batches=4)
    plain = predict("pp", hardware=hw, **kwargs)
    sleeping = predict("pp", hardware=hw, layer_ms=10, **kwargs)
    assert sleeping.cpu_seconds == pytest.approx(plain.cpu_seconds)
    assert sleeping.played_time > plain.played_time + 0.04 * 4  # 4 micro-batches x 2 layers x 10 ms forward at least


def test_gpu_presets_have_no_cpu_model():
    pred = predict("dp", hardware="8xH100-nvlink", world_size=8, model="gpt")
    assert pred.cpu_seconds == [] and pred.fair_share == 0.0 and not pred.cpu_bound


def test_predict_stays_a_function_after_the_calibration_module_loads():
    """``mpkit.sim.predict`` is the function; a submodule of that name would replace it on the
    package the moment the calibration (or the what-if widget) imported it."""
    import mpkit.sim
    from mpkit.sim import calibrate, whatif  # noqa: F401  (their modules import the prediction module)
    assert callable(mpkit.sim.predict) and mpkit.sim.predict is predict

