"""mpkit.plot.bubble: measured dots next to the formula line, bad input refused."""
import pytest

import mpkit


def _gid(ax, gid):
    return next(line for line in ax.lines if line.get_gid() == gid)


def test_formula_line_and_measured_points():
    fig = mpkit.plot.bubble({1: 0.8, 2: 0.65, 8: 0.4}, p=4, lang="ko")
    ax = fig.axes[0]
    formula = _gid(ax, "formula")
    assert list(formula.get_xdata()) == list(range(1, 9))
    assert formula.get_ydata()[0] == pytest.approx(3 / 4) and formula.get_ydata()[-1] == pytest.approx(3 / 11)
    measured = _gid(ax, "measured")
    assert list(measured.get_xdata()) == [1, 2, 8] and list(measured.get_ydata()) == [0.8, 0.65, 0.4]
    assert any(line.get_gid() == "mp" for line in ax.lines)


def test_interleaved_formula_uses_v():
    ax = mpkit.plot.bubble({4: 0.3, 8: 0.2}, p=4, v=2).axes[0]
    assert _gid(ax, "formula").get_ydata()[-1] == pytest.approx(3 / 19)
    assert not any(line.get_gid() == "mp" for line in ax.lines)


@pytest.mark.parametrize("kwargs, match", [
    (dict(measured={}, p=4), "empty"),
    (dict(measured={0: 0.5}, p=4), "whole number"),
    (dict(measured={2: 1.5}, p=4), r"\[0, 1\]"),
    (dict(measured={2: 0.5}, p=0), "stages"),
    (dict(measured={2: 0.5}, p=4, lang="fr"), "lang"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mpkit.plot.bubble(**kwargs)
