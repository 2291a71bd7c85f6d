"""The six collectives side by side: what every rank holds before and after, from a real run.

``collectives(mpkit.launch(six_collectives, world_size=4))`` draws one panel per collective of
``mpkit.parallel.collectives.six_collectives``: a row per rank, its values before (left) and after
(right). The demo's data encodes where each value came from: rank r starts with
[1, 2, ..., N]·10^r, so a value with one non-zero digit came from one rank (the power of ten
says which, and the cell takes that rank's colour), and a value with N non-zero digits is the sum
over all ranks (dark cell). Zeros are empty buffers; a hatched cell is left undefined.
"""
from __future__ import annotations

from matplotlib.patches import Rectangle

from mpkit.i18n import t
from mpkit.plot.style import drawing, new_figure

RANK_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C", "#CCB974")
SUM_COLOUR = "#34495E"
# bytes each rank sends, S = the tensor a rank holds (all-gather: the gathered result)
BYTES = {"broadcast": "≤ S", "reduce": "≤ S", "all_reduce": "2(N-1)/N·S", "reduce_scatter": "(N-1)/N·S",
         "all_gather": "(N-1)/N·S", "all_to_all": "(N-1)/N·S"}


def _source(value, n):
    """The rank a demo value came from, "sum" for the sum over all ranks, None for an empty 0."""
    whole = int(round(value))
    if whole == 0:
        return None
    digits = [int(d) for d in str(whole)]
    nonzero = sum(d != 0 for d in digits)
    if nonzero == 1:
        return len(digits) - 1
    return "sum" if nonzero == n else "partial"


def _row(ax, x0, y, values, n):
    for j, value in enumerate(values):
        source = _source(value, n)
        colour = {None: "white", "sum": SUM_COLOUR, "partial": "#BAB0AC"}.get(source) \
            or RANK_COLOURS[source % len(RANK_COLOURS)]
        ax.add_patch(Rectangle((x0 + j, y), 0.94, 0.8, facecolor=colour, edgecolor="#666666", linewidth=0.6))
        ax.text(x0 + j + 0.47, y + 0.4, f"{value:g}", ha="center", va="center", fontsize=7,
                color="black" if source is None else "white")


def collectives(results, lang="en", title=None):
    """``results``: the per-rank return values of ``six_collectives``. Returns the Figure."""
    if not results or not isinstance(results[0], dict):
        raise ValueError("collectives() needs the result of mpkit.launch(six_collectives, ...): a dict per rank")
    n = len(results)
    names = list(results[0])
    width = max(len(r[name]["after"] or []) for r in results for name in names)
    width = max(width, max(len(r[name]["before"]) for r in results for name in names))
    with drawing(lang):
        cols = 3
        rows = -(-len(names) // cols)
        fig, axes = new_figure(4.2 * cols, (0.5 * n + 1.3) * rows, nrows=rows, ncols=cols, squeeze=False)
        for ax, name in zip(axes.flat, names):
            for rank, r in enumerate(results):
                y = n - 1 - rank
                ax.text(-0.2, y + 0.4, t("rank", lang, rank=rank), ha="right", va="center", fontsize=8)
                _row(ax, 0, y, r[name]["before"], n)
                after = r[name]["after"]
                if after is None:
                    ax.add_patch(Rectangle((width + 1.2, y), width - 0.06, 0.8, facecolor="white",
                                           edgecolor="#999999", hatch="///", linewidth=0.6))
                    ax.text(width + 1.2 + width / 2, y + 0.4, t("undefined", lang), ha="center", va="center",
                            fontsize=7, color="#555555", bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
                else:
                    _row(ax, width + 1.2, y, after, n)
            ax.annotate("", xy=(width + 1.05, n / 2), xytext=(width + 0.15, n / 2),
                        arrowprops={"arrowstyle": "->", "color": "#444444"})
            ax.text(width / 2, n + 0.1, t("before", lang), ha="center", fontsize=8)
            ax.text(width + 1.2 + width / 2, n + 0.1, t("after", lang), ha="center", fontsize=8)
            ax.set_title(f"{t(name, lang)} — {t('sent_per_rank', lang)} {BYTES.get(name, '?')}", fontsize=10, loc="left")
            ax.set_xlim(-1.6, 2 * width + 1.4)
            ax.set_ylim(-0.3, n + 0.6)
            ax.axis("off")
        for ax in list(axes.flat)[len(names):]:
            ax.axis("off")
        fig.suptitle(title or t("collectives_title", lang, n=n), fontsize=11, x=0.01, ha="left")
        fig.tight_layout()
    return fig


__all__ = ["collectives"]
