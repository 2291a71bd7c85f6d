"""The CPU model of ``mpkit.costmodel.cpu`` and the fair-share step ``predict`` takes from it.

The model's coefficients are fitted by the calibration (tests/test_sim.py runs it); here they are
set by hand so that what ``predict`` does with them can be checked exactly.
"""
import math

import numpy as np
import pytest

from mpkit.observe.trace import Event, Trace, union_seconds
from mpkit.sim import Hardware, Link, predict
from mpkit.costmodel.cpu import TERMS, fit, program_terms, rank_cpu, ring_steps
from mpkit.simulator.hardware import runnable_per_core
from mpkit.simulator.engine import Collective, Compute, Msg, P2P, simulate
from mpkit.costmodel.prediction import concurrency, fair_share_play, play, with_wake_ups

COEFFICIENTS = {"compute": 1.5, "micro_batch_compute": 2.0, "collective_step": 1e-4, "collective_byte": 1e-9,
                "message": 3e-4, "message_byte": 2e-9}


def test_program_terms_count_ring_steps_and_bytes_a_rank_sends():
    program = [Compute("forward", 0.002), Compute("forward", 0.004, stage=0, micro_batch=1),
               Collective("all_reduce", (0, 1, 2, 3), 4000, 0.001, ("a",)),
               Collective("all_gather", (0, 1), 1000, 0.001, ("b",)), Compute("backward", 0.003),
               Collective("reduce_scatter", (0, 1), 2000, 0.001, ("c",)),
               P2P((Msg("send", 1, "x", 512, 0.0), Msg("recv", 1, "y", 256, 0.0))),
               Collective("all_reduce", (0,), 4000, 0.0, ("alone",))]  # a group of one sends nothing
    terms = program_terms(program)
    # gloo's reduce-scatter all-reduces the whole tensor and keeps a chunk: an all-reduce's steps
    assert ring_steps("all_reduce", 4) == ring_steps("reduce_scatter", 4) == 6 and ring_steps("all_gather", 4) == 3
    # a micro-batch's compute apart; 6 + 1 + 2 ring steps; each step of the 4-rank all-reduce sends
    # a quarter, of the 2-rank all-gather and reduce-scatter a half
    assert terms.tolist() == pytest.approx([0.005, 0.004, 9, 6 * 1000 + 1 * 500 + 2 * 1000, 2, 768])
    assert rank_cpu(COEFFICIENTS, program) == pytest.approx(
        1.5 * 0.005 + 2.0 * 0.004 + 9e-4 + 8500e-9 + 2 * 3e-4 + 768 * 2e-9)
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
    assert quiet.cpu_seconds == [] and quiet.step_time == quiet.played_time and not quiet.cpu_bound
    loaded = predict("pp", hardware=_machine(background=2.0, cpu=COEFFICIENTS), **kwargs)
    played = predict("pp", hardware=_machine(background=2.0), **kwargs)  # the same engine, no CPU model
    assert played.played_time == pytest.approx(loaded.played_time)
    assert len(loaded.cpu_seconds) == 2 and min(loaded.cpu_seconds) > 0
    k = runnable_per_core(concurrency(played.trace), 2.0, 2)
    assert loaded.sharing == pytest.approx(k) and 1.5 < k < 2.0  # 1-2 ranks busy at once, 2 spinners, 2 cores
    # the rank that needs the most CPU for its busy time: its busy part is now its CPU at 1/k of a core
    busy = [union_seconds(played.trace.of_rank(r)) for r in (0, 1)]
    r = max((0, 1), key=lambda r: loaded.cpu_seconds[r] / busy[r])
    assert k * loaded.cpu_seconds[r] > busy[r]  # this machine is CPU-bound
    assert union_seconds(loaded.trace.of_rank(r)) == pytest.approx(k * loaded.cpu_seconds[r], rel=0.02)
    assert loaded.cpu_bound and loaded.step_time > loaded.played_time
    start, end = loaded.trace.window()
    assert end - start == pytest.approx(loaded.step_time)  # the timeline is as long as the step
    assert sum(loaded.breakdown.values()) == pytest.approx(loaded.step_time)  # and so are its parts
    assert loaded.breakdown["compute"] > played.breakdown["compute"]
    assert len(loaded.trace.events) == len(quiet.trace.events)
    assert "CPU-bound" in loaded.summary() and "CPU-bound" not in quiet.summary()
    # the same machine with far fewer CPU seconds a step: the played step stands, unstretched
    light = predict("pp", hardware=_machine(background=2.0, cpu=dict.fromkeys(TERMS, 0.0) | {"compute": 0.01}),
                    **kwargs)
    assert not light.cpu_bound and light.step_time == pytest.approx(light.played_time)
    assert min(light.cpu_seconds) > 0


def _handoff(first_seconds=1.0, second_seconds=1.0):
    """Rank 0 computes, then sends to rank 1, which computes after it: one rank busy at a time."""
    message = "a", 0, 0.0  # key, bytes, seconds
    return [[Compute("forward", first_seconds), P2P((Msg("send", 1, *message),))],
            [P2P((Msg("recv", 0, *message),)), Compute("forward", second_seconds)]]


def test_the_fair_share_lengthens_each_rank_and_the_waits_follow():
    """On two cores with a busy loop pinned to each, the calibration's lone rank got half a core,
    so k = 2 (not the 1.5 of sharing all the cores). Rank 0 needs 0.5 CPU-s in its 1 busy second:
    at half a core it still takes 1 s; rank 1 needs 1 CPU-s: 2 s. Rank 1 starts when rank 0 is
    done, so the step is 3 s (k·C of the busiest alone would say 2; one stretch for all, 4)."""
    pinned = _machine(background=2.0, lone_share=0.5)
    assert pinned.sharing(1) == 2.0 and _machine(background=2.0).sharing(1) == 1.5
    trace, k = fair_share_play(_handoff(), [0.5, 1.0], pinned)
    assert k == 2.0 and trace.window() == pytest.approx((0.0, 3.0))
    assert [e.end for e in trace.events if e.kind == "forward"] == pytest.approx([1.0, 3.0])
    # both ranks need their whole busy time in CPU: each doubles, and rank 1 waits for rank 0's 2 s
    assert fair_share_play(_handoff(), [1.0, 1.0], pinned)[0].window() == pytest.approx((0.0, 4.0))
    # the two computing together (no message): the step is k·C of the busiest, nothing waits
    together = [[Compute("forward", 1.0)], [Compute("forward", 1.0)]]
    assert fair_share_play(together, [0.5, 1.0], pinned)[0].window() == pytest.approx((0.0, 2.0))
    # little CPU: the played step stands
    assert fair_share_play(_handoff(), [0.1, 0.1], pinned)[0].window() == pytest.approx((0.0, 2.0))


def test_a_receive_posted_after_its_send_waits_for_the_senders_wake_up():
    """gloo's sends are rendezvous: rank 0 sends at once, rank 1 computes 1 s before it posts the
    receive, so the send waited 1 s in rank 0's queue and the receive's notice must wake rank 0's
    event loop to send the data: both ends wait ``late_wait(1 s)`` beyond the 0.5 s transfer. A
    receive posted before its send (the handoff) pays nothing more; without ``late_wait`` neither
    does this one."""
    message = "a", 0, 0.5  # key, bytes, seconds
    late = [[P2P((Msg("send", 1, *message),))], [Compute("forward", 1.0), P2P((Msg("recv", 0, *message),))]]
    waited = []

    def late_wait(seconds):
        waited.append(seconds)
        return 0.25

    trace = simulate(late, late_wait=late_wait)
    assert waited == pytest.approx([1.0, 1.0])  # once at each end
    messages = sorted((e for e in trace.events if e.kind in ("send", "recv")), key=lambda e: e.kind)
    assert [e.kind for e in messages] == ["recv", "send"]
    assert [t for e in messages for t in (e.start, e.end)] == pytest.approx([1.0, 1.75, 1.0, 1.75])
    assert simulate(late).window() == pytest.approx((0.0, 1.5))
    assert simulate(_handoff(), late_wait=late_wait).window() == pytest.approx((0.0, 2.0)) and len(waited) == 2
    # a remote call (TensorPipe rpc) is not a rendezvous
    rpc = [[P2P((Msg("send", 1, *message, kind="rpc"),))],
           [Compute("forward", 1.0), P2P((Msg("recv", 0, *message, kind="rpc"),))]]
    assert simulate(rpc, late_wait=late_wait).window() == pytest.approx((0.0, 1.5)) and len(waited) == 2
    # predict plays with the machine's measured late waits (none on a machine without them)
    measured = _machine(late_waits=((1e-3, 3e-3), (2e-2, 4e-4)))
    assert play(late, measured).window() == pytest.approx((0.0, 1.5 + 4e-4))  # 1 s: flat beyond the last
    assert play(late, _machine()).window() == pytest.approx((0.0, 1.5))


def test_a_burst_of_sends_wakes_the_senders_loop_once():
    """Rank 0 posts two sends at once (GPipe's forwards); rank 1 receives the first after 1 s of
    compute and the second 0.1 s after the first arrived. Both sends waited in rank 0's queue, but
    its one event loop ran when it sent the first, so the second's receive finds it idle 0.1 s,
    not the 1.85 s since that send was posted: ``late_wait(0.1)`` (a short idle, cheap to wake),
    not ``late_wait(1.85)``."""
    a, b = ("a", 0, 0.5), ("b", 0, 0.5)  # key, bytes, seconds
    burst = [[P2P((Msg("send", 1, *a), Msg("send", 1, *b)))],
             [Compute("forward", 1.0), P2P((Msg("recv", 0, *a),)), Compute("forward", 0.1), P2P((Msg("recv", 0, *b),))]]
    idle = []

    def late_wait(seconds):
        idle.append(seconds)
        return 0.25 if seconds >= 0.5 else 0.05

    trace = simulate(burst, late_wait=late_wait)
    assert sorted(idle) == pytest.approx([0.1, 0.1, 1.0, 1.0])  # each message at each end
    received = [e for e in sorted(trace.of_rank(1), key=lambda e: e.start) if e.kind == "recv"]
    assert [(e.start, e.end) for e in received] == pytest.approx([(1.0, 1.75), (1.85, 2.4)])
    assert trace.window() == pytest.approx((0.0, 2.4))


def test_the_late_wait_is_interpolated_in_what_was_measured():
    """Not a curve but the measured points: beside busy loops a sender that waited 1 ms is slow to
    wake (it just ran), one that waited 20 ms is scheduled at once. From none at 0, linear between
    points, flat beyond the last; none on a machine without the measurement."""
    hw = _machine(late_waits=[[2e-2, 4e-4], [1e-3, 3e-3]])  # as read back from the JSON cache, in any order
    assert hw.late_wait(0.0) == 0.0 and hw.late_wait(5e-4) == pytest.approx(1.5e-3)
    assert hw.late_wait(1e-3) == pytest.approx(3e-3)
    assert hw.late_wait(1.05e-2) == pytest.approx((3e-3 + 4e-4) / 2)
    assert hw.late_wait(1.0) == pytest.approx(4e-4)
    assert _machine().late_wait(1e-3) == 0.0


def test_a_receive_that_slept_waits_to_be_scheduled():
    """Rank 1 sleeps 1 s in its receive while rank 0 computes; beside busy loops it then waits
    ``wake_wait(1 s)`` more before its own compute. Rank 0's send and a machine without the
    measurement are left alone."""
    woken = _machine(wake_max=0.003, wake_tau=0.001)
    assert woken.wake_wait(0.0) == 0.0 and woken.wake_wait(1.0) == pytest.approx(0.003)
    assert woken.wake_wait(0.001) == pytest.approx(0.003 * (1 - math.exp(-1)))
    programs = _handoff()
    lengthened = with_wake_ups(programs, simulate(programs), woken)
    assert lengthened[1][0].ops[0].seconds == pytest.approx(0.003) and lengthened[0] == programs[0]
    assert simulate(lengthened).window() == pytest.approx((0.0, 2.003))
    assert with_wake_ups(programs, simulate(programs), _machine()) == programs
    # a hop priced 2 ms beyond its link's transfer (a measured relay's, whose receivers slept and
    # woke too) already holds 2 ms of the 3 ms wake-up: 1 ms more, not 3
    link = woken.p2p.time(0)
    held = [[Compute("forward", 1.0), P2P((Msg("send", 1, "a", 0, link + 0.002),))],
            [P2P((Msg("recv", 0, "a", 0, link + 0.002),)), Compute("forward", 1.0)]]
    assert with_wake_ups(held, simulate(held), woken)[1][0].ops[0].seconds == pytest.approx(link + 0.003)
    # in predict: the same pipeline, only the measurement differs, is longer by the waits
    kwargs = dict(world_size=2, model="mlp", hidden=64, layers=4, batch_size=32, schedule="gpipe", micro_batches=4)
    plain, waiting = predict("pp", hardware=_machine(), **kwargs), predict("pp", hardware=woken, **kwargs)
    assert plain.step_time + 0.001 < waiting.step_time < plain.step_time + 0.003 * 16  # 8 receives a rank, < 3 ms each


def test_concurrency_counts_a_rank_once_and_skips_idle():
    # a rank's overlapping events (compute beside an async collective) are one busy span
    overlapping = Trace(events=[_event(0, "forward", 0, 1), _event(0, "all_reduce", 0.5, 1.5), _event(1, "forward", 0, 1)])
    assert concurrency(overlapping) == pytest.approx((2 ** 2 * 1 + 1 ** 2 * 0.5) / (2 * 1 + 1 * 0.5))
    # a measured trace's idle events are not work
    idle = Trace(events=[_event(0, "forward", 0, 1), _event(1, "idle", 0, 1)])
    assert concurrency(idle) == pytest.approx(1.0)


def _event(rank, kind, start, end):
    return Event(rank=rank, kind=kind, start=start, end=end)


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
    assert pred.cpu_seconds == [] and pred.step_time == pred.played_time and not pred.cpu_bound


def test_predict_stays_a_function_after_the_calibration_module_loads():
    """``mpkit.sim.predict`` is the function; a submodule of that name would replace it on the
    package the moment the calibration (or the what-if widget) imported it."""
    import mpkit.sim
    from mpkit.sim import calibrate, whatif  # noqa: F401  (their modules import the prediction module)
    assert callable(mpkit.sim.predict) and mpkit.sim.predict is predict

