"""The pipeline's two users of one dataflow: the schedule's own unit-cost timing (``simulate``, in
``mpkit.parallel.pipeline.schedules``) and the cost model's priced programs
(``mpkit.pricing.pipeline_program``) build the same simulator instructions, so on the same costs they
give the same timeline."""
from fractions import Fraction

import pytest

from mpkit.parallel.pipeline.schedules import (Backward, Forward, OptimizerStep, RecvAct, RecvGrad, ScheduleError,
                                               SendAct, SendGrad, schedule, simulate)
from mpkit.simulator.engine import Compute, simulate as play
from mpkit.pricing.pipeline_program import engine_program, engine_programs


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 3, 4, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2),
                                        ("looped_bfs", 2, 3, 2), ("interleaved_zb", 3, 6, 1), ("zbv", 2, 4, 1)])
def test_priced_programs_on_unit_costs_time_as_simulate(name, p, m, v):
    lists = schedule(name, p, m, v)
    ours = simulate(lists, forward=1, backward=2, comm=Fraction(1, 4))
    priced = play(engine_programs(lists, lambda s, mb: Fraction(1), lambda s, mb: Fraction(2),
                                  lambda kind, stage, src, dst: (0, Fraction(1, 4))))
    spans = sorted((e.rank, e.stage, e.micro_batch, e.name, e.start, e.end) for e in priced.events
                   if e.kind in ("forward", "backward"))
    assert spans == sorted((r, ins.stage, ins.mb, {"BackwardInput": "B", "BackwardWeight": "W"}.get(
        type(ins).__name__, ""), start, end) for r, ins, start, end in ours.spans)


def test_a_priced_stage_may_be_pieces_with_collectives_between():
    """3d's forward of a tensor-parallel stage: two compute pieces; the first needs the stage's
    input, the last produces its output, and the optimizer runs after the flush."""
    lists = schedule("gpipe", 2, 1)
    pieces = engine_program(lists[1], 1, lambda s, mb: [Compute("x", 1.0), Compute("x", 2.0)], lambda s, mb: 3.0,
                            lambda kind, stage, src, dst: (8, 0.5), optimizer=lambda rank: 4.0, peers=[5, 7])
    computes = [ins for ins in pieces if isinstance(ins, Compute)]
    assert [(c.kind, c.seconds) for c in computes] == [("forward", 1.0), ("forward", 2.0), ("backward", 3.0),
                                                      ("optimizer", 4.0)]
    assert computes[0].needs == (("in", 0, 1),) and computes[0].produces == ()
    assert computes[1].produces == (("out", 0, 1),)
    assert {op.peer for ins in pieces for op in getattr(ins, "ops", ())} == {5}  # pipeline rank 0 is global rank 5


def test_a_list_simulate_cannot_run_is_refused_by_name():
    lists = [[Forward(0, 0), SendAct(0, 0, 1), RecvGrad(0, 0, 1), Backward(0, 0), OptimizerStep()],
             [RecvAct(0, 1, 0), Forward(0, 1), Backward(0, 1), SendGrad(0, 1, -1), OptimizerStep()]]
    with pytest.raises(ScheduleError, match=r"rank 1's SendGrad\(mb=0, stage=1, to=-1\) addresses rank -1, "
                                            r"but the lists are for ranks 0..1"):
        simulate(lists)
    with pytest.raises(ScheduleError, match="rank 0's list holds 'forward', which is not an instruction"):
        simulate([["forward", OptimizerStep()]])
