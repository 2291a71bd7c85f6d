"""Several runs' timelines stacked in one figure on a common time scale, so that "the same
step with and without overlap" (or any two options) can be compared by eye: equal lengths on
the x axis are equal durations in every panel."""
from __future__ import annotations

from mpkit.plot.style import drawing, new_figure
from mpkit.plot.timeline import figsize, timeline


def _runs(runs):
    if isinstance(runs, dict) and runs:
        return [(str(k), v) for k, v in runs.items()]
    if isinstance(runs, (list, tuple)) and runs:
        return [(getattr(r, "strategy", None), r) for r in runs]
    raise ValueError("runs: pass a non-empty dict {label: Run} or list of Runs (or predictions)")


def timelines(runs, lang="en", step=None):
    """One ``timeline`` panel per run (top to bottom in the given order), every panel showing a
    window as long as the longest run's, starting at that run's own first event. The labels of
    a dict become the panel titles. Returns the Figure."""
    with drawing(lang):
        items = _runs(runs)
        heights = []
        for _, run in items:
            ranks = len(getattr(run, "trace", run).ranks)
            heights.append(figsize(max(ranks, 1))[1] + 0.4)
        fig, axes = new_figure(12.0, sum(heights), nrows=len(items), squeeze=False,
                               gridspec_kw={"height_ratios": heights})
        axes = axes[:, 0]
        for ax, (label, run) in zip(axes, items):
            timeline(run, lang=lang, step=step, ax=ax, title=label)
        width = max(ax.get_xlim()[1] - ax.get_xlim()[0] for ax in axes)
        for ax in axes:
            start = ax.get_xlim()[0]
            ax.set_xlim(start, start + width)
        fig.subplots_adjust(hspace=0.6)
    return fig


__all__ = ["timelines"]
