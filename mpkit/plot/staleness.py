"""Asynchronous parameter-server training: the loss of each applied update and its staleness.

``staleness(run)`` takes a ``Run`` of ``mpkit.train("ps", ...)`` (the server's ``run.extra[0]``:
``staleness`` and ``apply_order``; ``run.losses``: one loss per applied push) or a plain dict
with ``losses``, ``workers`` and ``staleness`` lists (the TensorFlow demo of lab 08).
"""
from __future__ import annotations

from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from mpkit.i18n import t
from mpkit.plot.style import drawing, new_figure

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
        fig, (top, bottom) = new_figure(8.0, 5.2, nrows=2, sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
        order = list(range(1, len(losses) + 1))
        ids = sorted(set(workers))
        colour = {w: _COLOURS[i % len(_COLOURS)] for i, w in enumerate(ids)}
        top.plot(order, losses, color="#BAB0AC", lw=1, zorder=1)
        for w in ids:
            top.scatter([o for o, x in zip(order, workers) if x == w], [l for l, x in zip(losses, workers) if x == w],
                        color=colour[w], label=t(f"staleness_{key}", lang, n=w), zorder=2)
        window = len(ids)
        if window > 1 and len(losses) > window:   # one update per worker: smooths the per-shard noise
            means = [sum(losses[i - window + 1:i + 1]) / window for i in range(window - 1, len(losses))]
            top.plot(order[window - 1:], means, color="#222222", lw=1.8, label=t("staleness_mean", lang, n=window), zorder=3)
        if log if log is not None else max(losses) > 20 * max(min(losses), 1e-30):
            top.set_yscale("log")
            top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # no mathtext minus glyphs
            top.yaxis.set_minor_formatter(NullFormatter())
        top.set_ylabel(t("staleness_loss", lang))
        top.set_title(title or t("staleness_title", lang))
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)   # outside: never over the dots
        top.grid(alpha=0.3)
        bottom.bar(order, stale, color=[colour[w] for w in workers])
        bottom.set_ylabel(t("staleness_stale", lang))
        bottom.set_xlabel(t("staleness_update", lang))
        bottom.set_title(t("staleness_stale_title", lang), fontsize=9)
        bottom.set_ylim(0, max(2, max(stale) + 1))
        bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
    return fig


__all__ = ["staleness"]
