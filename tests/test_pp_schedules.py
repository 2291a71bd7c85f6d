"""Pipeline schedules as data, tested on the instruction lists alone (no processes).

The simulator runs the per-rank lists with the executor's semantics (communication between
two computations is one batch that finishes only when every peer posted its side; messages
between two ranks are matched in posting order), on a clock where a Forward takes 1 unit and
a Backward 2 (backward ≈ 2x forward: two matmuls per forward matmul). Then with p stages and
m micro-batches every rank is busy 3m units and the makespan is 3(m+p-1), so the bubble is
(p-1)/(m+p-1) exactly, for GPipe and 1F1B alike. Interleaving v chunks per rank costs 1/v
and 2/v per chunk: the fill/drain shrinks to 3(p-1)/v, bubble (p-1)/(v·m+p-1) of the step,
i.e. (p-1)/(v·m) of the ideal time m·3 (the formula Narayanan et al. 2021 quote).
"""
from collections import Counter
from fractions import Fraction

import pytest

from mpkit.parallel.pipeline.schedules import (
    SCHEDULES, Backward, Forward, OptimizerStep, RecvAct, RecvGrad, ScheduleError, SendAct, SendGrad, schedule,
    simulate,
)

PS, MS = (1, 2, 3, 4), (1, 2, 4, 8)
INTERLEAVED = [(p, v, m) for p in (2, 3, 4) for v in (2, 3) for m in (p, 2 * p, 4 * p)]


def compute(program, kind):
    return [(ins.mb, ins.stage) for ins in program if isinstance(ins, kind)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("m", MS)
def test_runs_without_deadlock_every_micro_batch_once_and_the_bubble_formula(name, p, m):
    programs = schedule(name, p, m)
    assert len(programs) == p
    for rank, program in enumerate(programs):
        expected = sorted((mb, rank) for mb in range(m))
        assert sorted(compute(program, Forward)) == expected
        assert sorted(compute(program, Backward)) == expected
        assert program[-1] == OptimizerStep() and program.count(OptimizerStep()) == 1
    sim = simulate(programs)  # raises ScheduleError on deadlock or a mismatched message
    assert sim.makespan == 3 * (m + p - 1)
    assert sim.bubble == Fraction(p - 1, m + p - 1)


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("m", MS)
def test_in_flight_activations_gpipe_keeps_m_1f1b_keeps_p_minus_rank(p, m):
    assert simulate(schedule("gpipe", p, m)).peak_in_flight == [m] * p
    assert simulate(schedule("1f1b", p, m)).peak_in_flight == [min(m, p - r) for r in range(p)]


@pytest.mark.parametrize("p,v,m", INTERLEAVED)
def test_interleaved_no_deadlock_each_chunk_once_and_bubble_shrinks_by_v(p, v, m):
    programs = schedule("interleaved", p, m, virtual=v)
    for rank, program in enumerate(programs):
        chunks = [rank + c * p for c in range(v)]  # stage s lives on rank s % p
        expected = sorted((mb, s) for mb in range(m) for s in chunks)
        assert sorted(compute(program, Forward)) == expected
        assert sorted(compute(program, Backward)) == expected
    sim = simulate(programs, forward=Fraction(1, v), backward=Fraction(2, v))
    assert sim.bubble == Fraction(p - 1, v * m + p - 1)
    ideal = 3 * m  # per rank, in units of a whole stage's forward
    assert (sim.makespan - ideal) / ideal == Fraction(p - 1, v * m)
    gpipe = simulate(schedule("gpipe", p, m))
    assert sim.bubble < gpipe.bubble
    # Megatron's warm-up: 2(p-r-1) + (v-1)p forwards before the first backward, then one more
    warm = [min(2 * (p - r - 1) + (v - 1) * p + 1, m * v) for r in range(p)]
    assert sim.peak_in_flight == warm


def test_1f1b_order_warm_up_steady_cool_down():
    rank0 = [(type(i).__name__[0], i.mb) for i in schedule("1f1b", 4, 6)[0] if isinstance(i, (Forward, Backward))]
    assert rank0 == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4), ("B", 1), ("F", 5),
                     ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    last = [(type(i).__name__[0], i.mb) for i in schedule("1f1b", 4, 3)[3] if isinstance(i, (Forward, Backward))]
    assert last == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]


def test_messages_name_their_peers():
    rank1 = schedule("gpipe", 3, 1)[1]
    assert rank1 == [RecvAct(0, 1, 0), Forward(0, 1), SendAct(0, 1, 2), *rank1[3:]]
    il = schedule("interleaved", 2, 2, virtual=2)
    # the last stage of chunk 0 (rank 1) feeds chunk 1 on rank 0: activations wrap around
    assert SendAct(0, 1, 0) in il[1] and RecvAct(0, 2, 1) in il[0]


def test_simulator_catches_deadlock_mismatch_and_missing_inputs():
    # rank 0 waits for the gradient before sending the activation rank 1 needs to produce it
    cycle = [[Forward(0, 0), RecvGrad(0, 0, 1), Backward(0, 0), SendAct(0, 0, 1), OptimizerStep()],
             [RecvAct(0, 1, 0), Forward(0, 1), Backward(0, 1), SendGrad(0, 1, 0), OptimizerStep()]]
    with pytest.raises(ScheduleError, match="deadlock: rank 0 waits at \\[RecvGrad"):
        simulate(cycle)
    a, b = schedule("1f1b", 2, 2)
    with pytest.raises(ScheduleError, match="matched by"):  # rank 1 posts its receives out of order
        simulate([a, [RecvAct(1, 1, 0)] + b])
    with pytest.raises(ScheduleError, match="runs without"):
        simulate([[Backward(0, 0)]])
    with pytest.raises(ScheduleError, match="runs twice"):
        simulate([[Forward(0, 0), Forward(0, 0)]])


@pytest.mark.parametrize("args,match", [
    (("zb", 2, 4), "schedule='zb' is unknown; use one of 'gpipe', '1f1b', 'interleaved', 'looped_bfs', "
                   "'interleaved_zb', 'zbv'"),
    (("gpipe", 2, 0), "micro_batches=0"),
    (("interleaved", 2, 3, 2), "multiple of world_size=2"),
    (("interleaved", 2, 4, 1), "virtual_stages=1"),
    (("interleaved", 1, 4, 2), "world_size >= 2"),
])
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        schedule(*args)
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved", "looped_bfs", "interleaved_zb", "zbv", "dualpipev"}


def test_programs_are_plain_data():
    programs = schedule("interleaved", 4, 8, virtual=2)
    assert Counter(type(i).__name__ for p in programs for i in p)["Forward"] == 4 * 8 * 2
    assert hash(programs[0][0]) == hash(type(programs[0][0])(**vars(programs[0][0])))  # frozen, comparable
