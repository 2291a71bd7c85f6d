"""When to checkpoint: Young's and Daly's intervals reproduce Daly's published optima, Daly's
estimate sits at the minimum of the expected run time it approximates, the widget's numbers follow
its sliders in both languages, and the two plots draw (interval; a run's restarts from its history)."""
import matplotlib
import pytest

from mpkit import plot
from mpkit.simulator import formulas as f
from mpkit.widgets.checkpoint_interval import LLAMA3_MTBF_HOURS, IntervalChoice

matplotlib.use("Agg")
MINUTE, HOUR = 60.0, 3600.0


@pytest.mark.parametrize("mtbf, published", [(24 * HOUR, 117), (6 * HOUR, 57), (15 * MINUTE, 9.1)])
def test_daly_reproduces_his_papers_optima(mtbf, published):
    """Daly 2006, Figs. 3-5: delta = 5 min, M = 24 h, 6 h, 15 min -> tau_opt = 117, 57, 9.1 min."""
    assert f.daly_interval(5 * MINUTE, mtbf) / MINUTE == pytest.approx(published, abs=0.05 * published)
    assert f.young_interval(5 * MINUTE, mtbf) == pytest.approx((2 * 5 * MINUTE * mtbf) ** 0.5)


def test_daly_is_the_minimum_of_the_expected_run_time():
    checkpoint, mtbf, restart = 5 * MINUTE, 6 * HOUR, 10 * MINUTE
    best = min(range(60, 20000, 10), key=lambda tau: f.expected_runtime(1e6, tau, checkpoint, mtbf, restart))
    assert abs(best - f.daly_interval(checkpoint, mtbf)) < 60  # within the search's 10 s grid and a flat bottom
    assert f.waste_fraction(best, checkpoint, mtbf, restart) < f.waste_fraction(best / 4, checkpoint, mtbf, restart)
    assert f.waste_fraction(best, checkpoint, mtbf, restart) < f.waste_fraction(best * 4, checkpoint, mtbf, restart)


def test_llama3s_failure_rate_and_bad_input():
    assert f.mtbf_of(419, 54) / HOUR == pytest.approx(3.09, abs=0.01) == pytest.approx(LLAMA3_MTBF_HOURS, abs=0.01)
    assert f.daly_interval(10 * HOUR, 3 * HOUR) == 3 * HOUR  # a save longer than 2M: Daly's tau = M
    with pytest.raises(ValueError, match="mtbf=0"):
        f.young_interval(60, 0)
    with pytest.raises(ValueError, match="restart=-1"):
        f.expected_runtime(1, 1, 1, 1, restart=-1)


def test_the_widget_follows_its_sliders_in_both_languages():
    choice = IntervalChoice(checkpoint=120, mtbf_hours=3, restart_minutes=10, interval_minutes=60, lang="en", draw=False)
    n = choice.numbers
    assert n["lost_per_failure"] == 30 * MINUTE and n["young"] == pytest.approx(f.young_interval(120, 3 * HOUR))
    assert n["waste"] == pytest.approx(f.waste_fraction(3600, 120, 3 * HOUR, 600)) and n["waste"] > n["best_waste"]
    assert "Optimum: Young" in choice.status.value
    choice.controls["mtbf"].value = 30  # ten times rarer failures: check point less often
    assert choice.numbers["young"] == pytest.approx(f.young_interval(120, 30 * HOUR))
    choice.controls["lang"].value = "ko"
    assert "최적" in choice.status.value and choice.controls["mtbf"].description == "평균 고장 간격(시간)"


def test_the_plots_draw_an_interval_and_a_run_with_a_failure():
    fig = plot.checkpoint_interval(120, 3 * HOUR, 600, interval=1800, lang="ko")
    assert len(fig.axes[0].lines) == 6  # waste, its two parts, Young, Daly, the chosen interval
    history = [{"event": "start", "step": 0, "time": 0.0}, {"event": "step", "step": 0, "time": 0.1},
               {"event": "step", "step": 1, "time": 0.2}, {"event": "save", "step": 2, "time": 0.3},
               {"event": "step", "step": 2, "time": 0.31}, {"event": "start", "step": 2, "time": 1.0},
               {"event": "step", "step": 2, "time": 1.1}, {"event": "save", "step": 3, "time": 1.2},
               {"event": "end", "step": 3, "time": 1.21}]
    fig = plot.restarts(history, lang="en")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"replayed step", "failure", "checkpoint saved"} <= set(labels)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["attempt 2 (from step 2)", "attempt 1 (from step 0)"]
    with pytest.raises(ValueError, match="history is empty"):
        plot.restarts([])
