"""The pipeline bubble against the number of micro-batches: measured points next to the formula.

``bubble({1: 0.77, 2: 0.66, 4: 0.55, 8: 0.45}, p=4)`` draws the measured share of rank-time not
spent in forward/backward (e.g. ``Trace.pipeline_bubble``) as dots, and the textbook share of
the step, (p-1)/(v·m+p-1), as a line over every m from 1 to the largest measured one.
"""
from __future__ import annotations

from matplotlib.ticker import PercentFormatter

from mpkit.i18n import t as text
from mpkit.plot.style import drawing, new_figure




def bubble(measured: dict, p: int, lang="en", v: int = 1, title=None):
    """``measured``: {micro-batches m: measured bubble share in [0, 1]}; ``p`` stages (ranks),
    ``v`` model chunks per rank (interleaved). Returns the Figure."""
    if not measured:
        raise ValueError("measured is empty; pass {micro_batches: measured bubble share}")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p={p!r}: pass the number of pipeline stages (a whole number >= 1)")
    for m, share in measured.items():
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"micro-batch count {m!r} must be a whole number >= 1")
        if not 0.0 <= float(share) <= 1.0:
            raise ValueError(f"measured[{m}] = {share!r} is not a share in [0, 1]")
    with drawing(lang):
        ms = sorted(measured)
        fig, ax = new_figure(7.0, 4.2)
        grid = list(range(1, max(ms) + 1))
        ax.plot(grid, [(p - 1) / (v * m + p - 1) for m in grid], color="#4C72B0", linewidth=2,
                label=text("bubble_formula" if v == 1 else "bubble_formula_v", lang), gid="formula")
        ax.plot(ms, [measured[m] for m in ms], "o", color="#C44E52", markersize=8,
                label=text("bubble_measured", lang), gid="measured")
        for m in ms:
            ax.annotate(f"{measured[m]:.0%}", (m, measured[m]), xytext=(6, 6), textcoords="offset points",
                        fontsize=9, color="#C44E52")
            formula = (p - 1) / (v * m + p - 1)
            ax.annotate(f"{formula:.0%}", (m, formula), xytext=(6, -14), textcoords="offset points",
                        fontsize=9, color="#4C72B0")
        if v == 1 and p > 1:
            ax.axhline((p - 1) / p, color="#8C8C8C", linestyle=":", linewidth=1, label=text("bubble_mp", lang), gid="mp")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.minorticks_off()
        ax.set_ylim(0, 1)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel(text("bubble_x", lang))
        ax.set_ylabel(text("bubble_y", lang))
        ax.set_title(title or text("bubble_title", lang, p=p, v="" if v == 1 else f", v = {v}"), fontsize=11, loc="left")
        ax.grid(color="#EEEEEE", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.legend(loc="lower left", fontsize=8, frameon=False)
    return fig
