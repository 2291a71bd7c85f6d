"""mpkit.plot.staleness: loss per applied update and staleness, from a ps Run or a plain dict."""
import pytest

import mpkit
from mpkit.plot.staleness import staleness


@pytest.fixture(scope="module")
def async_run():
    return mpkit.train("ps", world_size=3, steps=3, batch_size=8, mode="async")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lang", ["ko", "en"])
def test_from_an_async_ps_run(async_run, lang):
    fig = staleness(async_run, lang=lang)
    top, bottom = fig.axes
    server = async_run.extra[0]
    assert len(bottom.patches) == len(async_run.losses) == len(server["staleness"]) == 6
    assert [p.get_height() for p in bottom.patches] == server["staleness"]
    legend = [t.get_text() for t in top.get_legend().get_texts()]
    assert legend == (["랭크 1", "랭크 2", "이동 평균 (업데이트 2개)"] if lang == "ko"
                      else ["rank 1", "rank 2", "running mean (2 updates)"])


def test_from_a_dict_with_log_scale():
    fig = staleness({"losses": [10.0, 1.0, 0.1], "workers": [0, 1, 0], "staleness": [0, 1, 0]}, lang="en",
                    title="t")
    top, _ = fig.axes
    assert top.get_yscale() == "log" and top.get_title() == "t"
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["worker 0", "worker 1", "running mean (2 updates)"]


@pytest.mark.parametrize("bad, match", [
    ({"losses": [1.0], "workers": [0, 1], "staleness": [0]}, "one loss, worker and staleness"),
    ({"losses": [], "workers": [], "staleness": []}, "one loss"),
])
def test_rejects_mismatched_series(bad, match):
    with pytest.raises(ValueError, match=match):
        staleness(bad)


def test_rejects_a_run_of_another_strategy():
    run = mpkit.train("single", steps=1)
    with pytest.raises(ValueError, match="Run of mpkit.train"):
        staleness(run)


def test_rejects_unknown_lang():
    with pytest.raises(ValueError):
        staleness({"losses": [1.0], "workers": [0], "staleness": [0]}, lang="fr")
