"""Per-rank memory by category as stacked bars — the plot that shows what sharding saves.

Several runs of the same model side by side (single | dp | zero1 | fsdp | tp | pp) make the
lesson visible: data parallelism repeats everything on every rank, ZeRO/FSDP shrink the
optimizer-state and parameter blocks, model/pipeline parallelism splits parameters by layer.
"""
from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from mpkit.observe.memory import CATEGORIES, mib
from mpkit.plot.inputs import as_runs
from mpkit.i18n import t as text
from mpkit.plot.style import CATEGORY_COLOURS, drawing, new_figure

# kind -> (MemoryReport attribute, subtitle key)
MEMORY_KINDS = {"max": ("max_by_category", "memory_max"), "peak": ("peak_breakdown", "memory_peak"),
                "final": ("final_by_category", "memory_final")}
_CATEGORY_KEYS = {"optimizer": "optimizer_state"}
BAR_WIDTH = 0.8


def category_label(category: str, lang: str) -> str:
    return text(_CATEGORY_KEYS.get(category, category), lang)


def _positions(runs) -> list[list[float]]:
    """x of each rank's bar, groups one empty slot apart."""
    out, x = [], 0.0
    for _, reports in runs:
        out.append([x + i for i in range(len(reports))])
        x += len(reports) + 1
    return out


def _checked(run_or_runs, kind, labels):
    if kind not in MEMORY_KINDS:
        raise ValueError(f"kind={kind!r} is unknown; pass one of {', '.join(map(repr, MEMORY_KINDS))}")
    runs = as_runs(run_or_runs)
    if labels is not None:
        if isinstance(labels, str) or len(labels) != len(runs):
            raise ValueError(f"labels: pass a list of {len(runs)} names, one per run (got {labels!r})")
        runs = [(str(label), reports) for label, (_, reports) in zip(labels, runs)]
    return runs


def _draw_group(ax, reports, xs, attr, lang):
    bottoms = [0.0] * len(reports)
    for category in CATEGORIES:
        heights = [mib(getattr(r, attr)[category]) for r in reports]
        ax.bar(xs, heights, BAR_WIDTH, bottom=bottoms, color=CATEGORY_COLOURS[category], gid=category,
               edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    above = False
    for x, top, report in zip(xs, bottoms, reports):
        peak = mib(report.peak_total)
        if attr == "max_by_category" and top > peak * (1 + 1e-9):
            _veil(ax, x, peak, top)
            above = True
        ax.plot([x - BAR_WIDTH / 2, x + BAR_WIDTH / 2], [peak, peak], color="black", linewidth=1.4, gid="peak")
        ax.annotate(f"{peak:.3g}", (x, max(top, peak)), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=6.5, gid="peak_label")
    capacities = {r.capacity for r in reports if r.capacity}
    for capacity in capacities:
        ax.hlines(mib(capacity), xs[0] - 0.5, xs[-1] + 0.5, colors="#C44E52", linestyles="--", linewidth=1.2,
                  gid="capacity")
    return bool(capacities), above


def _veil(ax, x, peak, top):
    """Pale, hatched cover over the part of a stack of maxima above the peak total: each category
    peaked at its own moment, so that much was never held at once (readers took the bar for the peak)."""
    ax.bar([x], [top - peak], BAR_WIDTH, bottom=[peak], color=(1, 1, 1, 0.6), hatch="////",
           edgecolor="#666666", linewidth=0, gid="above_peak")


def memory(run_or_runs, lang="en", kind="max", labels=None):
    """Stacked MiB per rank and category for one run, or for a list/dict of runs side by side.

    ``kind``: ``"max"`` — each category's largest value during the run (the black tick is the
    peak total, which is lower when categories peak at different times; the part of the stack
    above it is veiled and hatched, so the bar is not read as the peak), ``"peak"`` — the
    breakdown at the moment of the peak, ``"final"`` — what stays resident after the last step.
    ``labels`` renames the runs. The dashed red line is the simulated device capacity, if set.
    """
    with drawing(lang):
        runs = _checked(run_or_runs, kind, labels)
        attr, subtitle = MEMORY_KINDS[kind]
        positions = _positions(runs)
        n_slots = positions[-1][-1] + 1
        fig, ax = new_figure(max(4.5, 2.8 + 0.42 * n_slots), 4.6)
        with_capacity = with_veil = False
        for (_, reports), xs in zip(runs, positions):
            capacity, veil = _draw_group(ax, reports, xs, attr, lang)
            with_capacity, with_veil = with_capacity or capacity, with_veil or veil

        ax.set_xticks([x for xs in positions for x in xs],
                      [str(r.rank) for _, reports in runs for r in reports], fontsize=8)
        ax.set_xlim(-0.7, n_slots - 0.3)
        ax.margins(y=0.12)
        named = len(runs) > 1 or bool(runs[0][0])
        if named:
            for (label, _), xs in zip(runs, positions):
                ax.annotate(label, ((xs[0] + xs[-1]) / 2, 0), xycoords=("data", "axes fraction"), xytext=(0, -26),
                            textcoords="offset points", ha="center", va="top", fontsize=9)
        ax.set_xlabel(text("ranks", lang), labelpad=26 if named else 4)
        ax.set_ylabel(text("mib", lang))
        ax.set_title(text("memory", lang) + "\n" + text(subtitle, lang), fontsize=11, loc="left")
        ax.grid(axis="y", color="#EEEEEE", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        handles = [Line2D([], [], color=CATEGORY_COLOURS[c], linewidth=8, label=category_label(c, lang))
                   for c in reversed(CATEGORIES)]
        handles.append(Line2D([], [], color="black", linewidth=1.4, label=text("peak_total", lang)))
        if with_veil:
            handles.append(Patch(facecolor="white", hatch="////", edgecolor="#666666", linewidth=0,
                                 label=text("above_peak", lang)))
        if with_capacity:
            handles.append(Line2D([], [], color="#C44E52", linestyle="--", label=text("capacity", lang)))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return fig
