"""Predicted step time split into compute, exposed communication and bubble, one bar per
prediction — the what-if picture of lab 05 (same strategies on NVLink, PCIe, InfiniBand).

``Prediction.breakdown`` already counts communication only where it is not hidden behind
compute, so the three parts add up to the step time.
"""
from __future__ import annotations

from matplotlib.patches import Patch

from mpkit.i18n import t as text
from mpkit.plot.style import IDLE_COLOUR, IDLE_HATCH, KIND_COLOURS, drawing, new_figure

PARTS = ("compute", "comm", "bubble")
_COLOURS = {"compute": KIND_COLOURS["forward"], "comm": KIND_COLOURS["all_reduce"], "bubble": IDLE_COLOUR}



def _items(predictions):
    if isinstance(predictions, dict):
        items = [(str(k), v) for k, v in predictions.items()]
    elif isinstance(predictions, (list, tuple)):
        items = [(f"{p.strategy} · {p.hardware.name}" if hasattr(p, "hardware") else str(i), p)
                 for i, p in enumerate(predictions)]
    else:
        items = [(getattr(predictions, "strategy", ""), predictions)]
    if not items:
        raise ValueError("predictions: pass a Prediction, a list of them or a dict {label: Prediction}")
    for label, p in items:
        if not isinstance(getattr(p, "breakdown", None), dict) or set(PARTS) - set(p.breakdown):
            raise ValueError(f"predictions[{label!r}]: expected an mpkit.sim.predict result with .breakdown "
                             f"({', '.join(PARTS)}), got {type(p).__name__}")
    return items


def breakdown(predictions, lang="en", title=None):
    """Horizontal stacked bars (ms): compute | communication not hidden | bubble, one per
    prediction (top to bottom in the given order), the step time written at the end of each.
    ``predictions``: a Prediction, a list of them, or a dict {label: Prediction}."""
    with drawing(lang):
        items = _items(predictions)
        fig, ax = new_figure(9.5, 1.4 + 0.38 * len(items))
        ys = list(range(len(items)))[::-1]
        largest = max(sum(p.breakdown[part] for part in PARTS) for _, p in items) * 1e3
        for y, (_, p) in zip(ys, items):
            left = 0.0
            for part in PARTS:
                width = p.breakdown[part] * 1e3
                ax.barh(y, width, left=left, height=0.7, color=_COLOURS[part], edgecolor="white", linewidth=0.5,
                        hatch=IDLE_HATCH if part == "bubble" else None, gid=part)
                left += width
            ax.annotate(f"{left:.3g}", (left, y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7.5, gid="total")
        ax.set_yticks(ys, [label for label, _ in items], fontsize=8)
        ax.set_xlim(0, largest * 1.12 if largest > 0 else 1.0)
        ax.set_xlabel(text("breakdown_xlabel", lang))
        ax.set_title(title or text("breakdown_title", lang), fontsize=11, loc="left")
        ax.grid(axis="x", color="#EEEEEE", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        handles = [Patch(facecolor=_COLOURS[p], hatch=IDLE_HATCH if p == "bubble" else None,
                         edgecolor="#9E9E9E" if p == "bubble" else "white", label=text(f"breakdown_{p}", lang)) for p in PARTS]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return fig


__all__ = ["breakdown", "PARTS"]
