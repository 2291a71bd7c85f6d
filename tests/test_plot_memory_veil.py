"""The memory plot's stack of per-category maxima is taller than the peak total whenever the
categories peak at different moments; the part above the peak is veiled and named in the legend,
so the bar is not read as the peak (a newcomer did)."""
from matplotlib.patches import Rectangle

from mpkit import plot
from mpkit.i18n import t as text
from mpkit.observe.memory import CATEGORIES, MemoryReport

MIB = 1024 * 1024


def report(rank, by_category, peak_total):
    values = {c: int(by_category.get(c, 0)) for c in CATEGORIES}
    return MemoryReport(rank, None, peak_total, values, values, [(0.0, tuple(values.values()))])


def veils(ax):
    return [(p.get_x() + p.get_width() / 2, p.get_y(), p.get_height()) for p in ax.patches
            if isinstance(p, Rectangle) and p.get_gid() == "above_peak"]


def legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_part_of_the_stack_above_the_peak_is_veiled_and_named():
    # rank 0: gradients (4) and activations (2) never live together, peak 16 of a stack of 18;
    # rank 1: everything at once, the stack is the peak
    run = [report(0, {"parameters": 4 * MIB, "gradients": 4 * MIB, "optimizer": 8 * MIB, "activations": 2 * MIB},
                  16 * MIB),
           report(1, {"parameters": 4 * MIB, "optimizer": 8 * MIB}, 12 * MIB)]
    for lang in ("en", "ko"):
        ax = plot.memory(run, lang=lang).axes[0]
        assert veils(ax) == [(0, 16, 2)]
        assert text("above_peak", lang) in legend(ax)


def test_no_veil_when_the_stack_is_the_peak_or_for_the_peak_breakdown():
    whole = [report(0, {"parameters": 4 * MIB, "activations": 2 * MIB}, 6 * MIB)]
    ax = plot.memory(whole).axes[0]
    assert veils(ax) == [] and text("above_peak", "en") not in legend(ax)
    apart = [report(0, {"parameters": 4 * MIB, "activations": 2 * MIB}, 5 * MIB)]
    assert veils(plot.memory(apart, kind="peak").axes[0]) == []   # only the stack of maxima is veiled
