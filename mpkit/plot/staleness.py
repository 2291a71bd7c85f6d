"""Asynchronous parameter-server training: the loss of each applied update and its staleness.

``staleness(run)`` takes a ``Run`` of ``mpkit.train("ps", ...)`` (the server's ``run.extra[0]``:
``staleness`` and ``apply_order``; ``run.losses``: one loss per applied push) or a plain dict
with ``losses``, ``workers`` and ``staleness`` lists (the TensorFlow demo of lab 08).
"""
from __future__ import annotations

from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from mpkit.plot.style import drawing, new_figure

_LABELS = {
    "ko": {"title": "파라미터 서버 (비동기): 적용된 업데이트마다의 손실", "loss": "손실",
           "update": "파라미터 서버에 적용된 업데이트 순서", "stale": "지연(staleness)",
           "stale_title": "그 사이 다른 워커가 먼저 적용한 업데이트 수", "rank": "rank {}", "worker": "워커 {}",
           "mean": "이동 평균 (업데이트 {}개)"},
    "en": {"title": "Parameter server (async): loss of each applied update", "loss": "loss",
           "update": "order in which the server applied the updates", "stale": "staleness",
           "stale_title": "updates other workers applied in between", "rank": "rank {}", "worker": "worker {}",
           "mean": "running mean ({} updates)"},
}
_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")


def _series(source):
    """(losses, workers, staleness, label key) from a ps Run or a dict."""
    if isinstance(source, dict):
        return list(source["losses"]), list(source["workers"]), list(source["staleness"]), "worker"
    server = next((e for e in source.extra if e and e.get("role") == "server"), None)
    if getattr(source, "strategy", None) != "ps" or server is None:
        raise ValueError("staleness() needs a Run of mpkit.train('ps', ...) or a dict with losses, workers, staleness")
    return list(source.losses), [w for w, _ in server["apply_order"]], list(server["staleness"]), "rank"


def staleness(source, lang="ko", title=None, log=None):
    """Two panels: loss per applied update (a dot per update, coloured by the worker that pushed
    it, and a running mean over as many updates as there are workers) and the staleness of each update (bars). ``log``: log-scale loss (default: when the loss
    spans more than 20x). Returns a matplotlib Figure."""
    losses, workers, stale, key = _series(source)
    if not (len(losses) == len(workers) == len(stale)) or not losses:
        raise ValueError(f"need one loss, worker and staleness per update; got {len(losses)}, {len(workers)}, "
                         f"{len(stale)}")
    with drawing(lang):
        labels = _LABELS[lang]
        fig, (top, bottom) = new_figure(8.0, 5.2, nrows=2, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
        order = list(range(1, len(losses) + 1))
        ids = sorted(set(workers))
        colour = {w: _COLOURS[i % len(_COLOURS)] for i, w in enumerate(ids)}
        top.plot(order, losses, color="#BAB0AC", lw=1, zorder=1)
        for w in ids:
            top.scatter([o for o, x in zip(order, workers) if x == w], [l for l, x in zip(losses, workers) if x == w],
                        color=colour[w], label=labels[key].format(w), zorder=2)
        window = len(ids)
        if window > 1 and len(losses) > window:   # one update per worker: smooths the per-shard noise
            means = [sum(losses[i - window + 1:i + 1]) / window for i in range(window - 1, len(losses))]
            top.plot(order[window - 1:], means, color="#222222", lw=1.8, label=labels["mean"].format(window), zorder=3)
        if log if log is not None else max(losses) > 20 * max(min(losses), 1e-30):
            top.set_yscale("log")
            top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # no mathtext minus glyphs
            top.yaxis.set_minor_formatter(NullFormatter())
        top.set_ylabel(labels["loss"])
        top.set_title(title or labels["title"])
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)   # outside: never over the dots
        top.grid(alpha=0.3)
        bottom.bar(order, stale, color=[colour[w] for w in workers])
        bottom.set_ylabel(labels["stale"])
        bottom.set_xlabel(labels["update"])
        bottom.set_title(labels["stale_title"], fontsize=9)
        bottom.set_ylim(0, max(2, max(stale) + 1))
        bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
    return fig


__all__ = ["staleness"]
