"""mpkit.plot.breakdown (predicted step split into compute / comm / bubble) and mpkit.plot.timelines
(several runs stacked on one time scale), on hand-built inputs with known values."""
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.patches import Rectangle

from mpkit import plot
from mpkit.observe.trace import Event, Trace

MS = 1e-3


def prediction(strategy, compute, comm, bubble, hardware="8xH100-nvlink"):
    return SimpleNamespace(strategy=strategy, hardware=SimpleNamespace(name=hardware),
                           breakdown={"compute": compute * MS, "comm": comm * MS, "bubble": bubble * MS})


def bars(ax, gid):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_gid() == gid]


def test_breakdown_stacks_the_three_parts_in_order():
    preds = {"dp": prediction("dp", 10, 2, 0), "pp": prediction("pp", 8, 1, 5)}
    fig = plot.breakdown(preds, lang="ko")
    ax = fig.axes[0]
    compute, comm, bubble = (bars(ax, g) for g in ("compute", "comm", "bubble"))
    assert [round(b.get_width(), 9) for b in compute] == [10, 8]
    assert [round(b.get_x(), 9) for b in comm] == [10, 8] and [round(b.get_width(), 9) for b in comm] == [2, 1]
    assert [round(b.get_x(), 9) for b in bubble] == [12, 9] and [round(b.get_width(), 9) for b in bubble] == [0, 5]
    assert compute[0].get_y() > compute[1].get_y()  # first item on top
    positions = dict(zip((t.get_text() for t in ax.get_yticklabels()), ax.get_yticks()))
    assert positions["dp"] > positions["pp"]  # labels follow their bars
    totals = sorted(t.get_text() for t in ax.texts if t.get_gid() == "total")
    assert totals == ["12", "14"]
    assert ax.get_title(loc="left") == "예측한 스텝 시간"


def test_breakdown_labels_a_list_by_strategy_and_hardware():
    fig = plot.breakdown([prediction("tp", 1, 1, 0, "8xH100-pcie")], lang="en")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["tp · 8xH100-pcie"]


@pytest.mark.parametrize("bad", [{}, [], {"x": object()}, {"x": SimpleNamespace(breakdown={"compute": 1})}])
def test_breakdown_rejects_what_is_not_a_prediction(bad):
    with pytest.raises(ValueError, match="predictions"):
        plot.breakdown(bad)


def run_of(length_ms, offset_ms=0.0, ranks=2):
    events = [Event(r, "forward", offset_ms * MS, (offset_ms + length_ms) * MS, step=0) for r in range(ranks)]
    return SimpleNamespace(trace=Trace(events=events, enabled=False), strategy="dp")


def test_timelines_share_one_time_scale():
    short, long = run_of(2.0, offset_ms=5.0), run_of(6.0, ranks=3)
    fig = plot.timelines({"short": short, "long": long}, lang="en")
    top, bottom = fig.axes[0], fig.axes[1]
    assert top.get_xlim() == pytest.approx((5.0, 11.0)) and bottom.get_xlim() == pytest.approx((0.0, 6.0))
    assert top.get_title(loc="left").startswith("short\n") and bottom.get_title(loc="left").startswith("long\n")
    assert len(fig.axes) >= 2


def test_timelines_rejects_empty():
    with pytest.raises(ValueError, match="runs"):
        plot.timelines({})
