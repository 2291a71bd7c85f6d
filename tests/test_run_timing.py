"""Run.step_times (first-to-last event window) and Run.step_periods (start-to-start on a rank)."""
import statistics

import pytest

import mpkit


@pytest.mark.timeout(120)
def test_step_periods_are_start_to_start_gaps_per_rank():
    run = mpkit.train("dp", world_size=2, steps=4, memory=False)
    periods = run.step_periods()
    assert len(periods) == 3 and all(p > 0 for p in periods)
    for step, period in enumerate(periods, start=1):
        gaps = []
        for rank in range(2):
            start = {s: min(e.start for e in run.trace.of_rank(rank) if e.step == s) for s in (step - 1, step)}
            gaps.append(start[step] - start[step - 1])
        assert period == pytest.approx(statistics.median(gaps), abs=1e-12)
    for step, window in enumerate(run.step_times()):
        # the first-to-last window over all ranks covers every rank's own span of that step
        own = [max(e.end for e in run.trace.of_rank(r) if e.step == step)
               - min(e.start for e in run.trace.of_rank(r) if e.step == step) for r in range(2)]
        assert window >= max(own) - 1e-12
