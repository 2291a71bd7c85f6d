"""Fixed colours and the figure/drawing context shared by every plot, so plots are reproducible.

In a notebook (matplotlib's inline backend) pyplot manages every figure a plot function makes, as
it does ``plt.subplots()``'s: the notebook shows it when the cell ends even when it is not the
cell's value, and ``plt.show()`` shows it. A figure that is the cell's value, or passed to
``display()``, is taken from pyplot as it is shown, so it is shown once. Elsewhere (scripts, the
command line, tests) figures are plain ``matplotlib.figure.Figure`` objects: nothing accumulates
open pyplot figures.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from mpkit.plot import fonts
from mpkit.i18n import check_lang, t

# One colour per event kind: compute in blues/greens/purple, communication in warm colours.
KIND_COLOURS = {
    "forward": "#4C72B0", "backward": "#55A868", "optimizer": "#8172B3", "compute": "#64B5CD",
    "all_reduce": "#C44E52", "send": "#DD8452", "recv": "#E8C547", "all_gather": "#2A9D8F",
    "reduce_scatter": "#937860", "broadcast": "#DA8BC3", "reduce": "#B07AA1", "barrier": "#8C8C8C",
    "all_to_all": "#9C755F", "rpc": "#6B8E23", "wait": "#BAB0AC",
}
# Memory categories avoid the compute colours: memory_over_time draws both in one figure.
CATEGORY_COLOURS = {
    "parameters": "#34495E", "gradients": "#E9C46A", "optimizer": "#E76F51",
    "activations": "#2A9D8F", "other": "#BAB0AC",
}
# On a mesh, communication is coloured by the group it ran in (its name: mpkit.layout.GROUPS).
GROUP_COLOURS = {"tp": "#C44E52", "pp": "#E8A33D", "dp": "#2A9D8F", "cp": "#8172B3", "dp_cp": "#55A868",
                 "ep": "#64B5CD", "edp": "#937860"}
IDLE_COLOUR = "#D9D9D9"
IDLE_HATCH = "////"
IDEAL_EDGE = "#222222"


@contextmanager
def drawing(lang):
    """Check ``lang`` and make the artists inside with the Hangul font (per figure, not globally)."""
    check_lang(lang)
    with matplotlib.rc_context(fonts.rc()):
        yield


class NotebookFigure(Figure):
    """A figure pyplot manages under the inline backend (``new_figure``), shown once: showing it
    as a cell's value or with ``display()`` takes it from pyplot first, so the inline backend,
    which shows every pyplot figure when the cell ends, does not show it again."""

    def _repr_mimebundle_(self, include=None, exclude=None):
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(self)
        return None  # IPython's own figure formatter draws it


def _notebook_pyplot():
    """pyplot when it is loaded with the inline backend (a Jupyter notebook), else None."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    backend = matplotlib.get_backend(auto_select=False) or ""
    return pyplot if pyplot is not None and "inline" in backend else None


def new_figure(width: float, height: float, **subplots):
    """(figure, axes) of a fixed size; ``subplots`` go to ``Figure.subplots``. In a notebook
    pyplot manages the figure (see the module's docstring), elsewhere it is a plain Figure."""
    pyplot = _notebook_pyplot()
    fig = (pyplot.figure(figsize=(width, height), FigureClass=NotebookFigure) if pyplot is not None
           else Figure(figsize=(width, height)))
    return fig, fig.subplots(**subplots)


def save(fig, path) -> str:
    """Write ``fig`` as PNG (dpi 110, tight bounding box), creating the folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")
    return str(path)


def title(key: str, run, lang: str, step=None) -> str:
    """``"Timeline — pp · step 1"``: the plot's name, the run's strategy if it has one, the step."""
    out = t(key, lang)
    strategy = getattr(run, "strategy", None)
    if strategy:
        out += f" — {strategy}"
    if step is not None:
        out += " · " + t("step", lang, step=step)
    return out
