"""Memory of each rank through time, on the trace's clock: activations pile up during forward
and drain in backward; gradients appear in backward; optimizer state appears at the first step.

A strip on top of each panel repeats the rank's compute spans, so a rise in memory can be read
against the forward/backward that caused it.
"""
from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from mpkit.observe.memory import CATEGORIES, mib
from mpkit.plot.inputs import as_trace, reports_of, select_step
from mpkit.i18n import t as text
from mpkit.plot.style import title
from mpkit.plot.memory import category_label
from mpkit.plot.style import CATEGORY_COLOURS, KIND_COLOURS, drawing, new_figure

STRIP = (0.92, 0.08)  # compute strip: axes-fraction y and height


def _window(trace, reports, step):
    if step is not None:
        return select_step(trace, step, "run").window()
    t0 = getattr(trace, "t0", 0.0)
    times = [t - t0 for r in reports for t, _ in r.samples] + list(trace.window())
    return min(times), max(times)


def curve(report, t0, start, end):
    """(times in s, [values per category in bytes]) inside [start, end], step-wise: the value
    in force at ``start`` first, the last one held until ``end``."""
    points = report.timeline(t0)
    before = [p for p in points if p[0] <= start]
    inside = [p for p in points if start < p[0] <= end]
    kept = ([(start, before[-1][1])] if before else []) + inside
    if not kept:
        return [], []
    kept.append((end, kept[-1][1]))
    return [t for t, _ in kept], [[v[c] for _, v in kept] for c in CATEGORIES]


def _checked_ranks(ranks, by_rank):
    if ranks is None:
        return sorted(by_rank)
    wanted = [ranks] if isinstance(ranks, int) else list(ranks)
    unknown = [r for r in wanted if r not in by_rank]
    if unknown or not wanted:
        raise ValueError(f"ranks={ranks!r}: pass None or some of the run's ranks {sorted(by_rank)}")
    return wanted


def _draw_rank(ax, report, trace, t0, start, end, lang):
    times, values = curve(report, t0, start, end)
    xs = [t * 1e3 for t in times]
    lower = [0.0] * len(xs)
    for category, series in zip(CATEGORIES, values):
        upper = [lo + mib(v) for lo, v in zip(lower, series)]
        ax.fill_between(xs, lower, upper, step="post", color=CATEGORY_COLOURS[category], linewidth=0, gid=category)
        lower = upper
    ax.step(xs, lower, where="post", color="black", linewidth=0.8, gid="total")
    if report.capacity:
        ax.axhline(mib(report.capacity), color="#C44E52", linestyle="--", linewidth=1.2, gid="capacity")
    strip = ax.get_xaxis_transform()
    for e in trace.of_rank(report.rank):
        if e.category == "compute" and e.end >= start and e.start <= end:
            ax.add_patch(Rectangle((e.start * 1e3, STRIP[0]), e.duration * 1e3, STRIP[1], transform=strip,
                                   facecolor=KIND_COLOURS[e.kind], linewidth=0, gid="strip"))
    top = max(lower + [mib(report.capacity or 0)])
    ax.set_ylim(0, top * 1.18 if top > 0 else 1.0)
    ax.set_ylabel(text("rank", lang, rank=report.rank) + "\nMiB", fontsize=9)
    ax.grid(axis="both", color="#EEEEEE", linewidth=0.6)
    ax.set_axisbelow(True)


def _legends(axes, kinds, lang):
    """Memory categories beside the top panel, the strip's compute kinds beside the bottom one."""
    handles = [Patch(facecolor=CATEGORY_COLOURS[c], label=category_label(c, lang)) for c in reversed(CATEGORIES)]
    handles.append(Line2D([], [], color="black", linewidth=0.8, label=text("total", lang)))
    first = axes[0].legend(handles=handles, title=text("memory_legend", lang), loc="upper left",
                           bbox_to_anchor=(1.005, 1.0), fontsize=8, title_fontsize=8, frameon=False,
                           alignment="left")
    strip = [Patch(facecolor=KIND_COLOURS[k], label=text(k, lang)) for k in KIND_COLOURS if k in kinds]
    if strip:
        if axes[-1] is axes[0]:  # one panel: a second legend() would replace the first
            axes[0].add_artist(first)
            first.set_clip_on(False)  # add_artist clips to the axes; this legend lives beside them
        axes[-1].legend(handles=strip, title=text("strip_legend", lang), loc="lower left",
                        bbox_to_anchor=(1.005, 0.0), fontsize=8, title_fontsize=8, frameon=False,
                        alignment="left")


def memory_over_time(run, lang="en", ranks=None, step=None):
    """Stacked memory by category per rank (one panel each) against trace time in ms.

    Memory samples and events share one clock; ``Trace.merge`` moved events by ``trace.t0`` and
    the samples are moved by the same amount. ``step=`` zooms to one optimizer step.
    """
    with drawing(lang):
        reports = reports_of(run)
        trace = as_trace(run, "run")
        t0 = getattr(trace, "t0", 0.0)
        by_rank = {r.rank: r for r in reports}
        shown = _checked_ranks(ranks, by_rank)
        start, end = _window(trace, reports, step)
        fig, axes = new_figure(11.0, 1.3 + 1.9 * len(shown), nrows=len(shown), sharex=True, squeeze=False)
        axes = axes[:, 0]
        for ax, rank in zip(axes, shown):
            _draw_rank(ax, by_rank[rank], trace, t0, start, end, lang)
        axes[-1].set_xlim(start * 1e3, end * 1e3)
        axes[-1].set_xlabel(text("time_ms", lang))
        axes[0].set_title(title("memory_over_time", run, lang, step), fontsize=11, loc="left")
        _legends(axes, {e.kind for e in trace.events if e.category == "compute"}, lang)
    return fig
