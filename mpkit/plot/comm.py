"""Bytes each rank put on the wire, per communication kind — measured where we can, by formula
where the backend hides the wire.

A collective's event records the payload S it was called with, not the bytes gloo/NCCL actually
sent, so for collectives the bar is S times the ring-algorithm factor: all-reduce 2(N-1)/N,
reduce-scatter / all-gather / all-to-all (N-1)/N, broadcast / reduce (N-1)/N (a chain: N-1 sends
of S, averaged per rank). Point-to-point sends and rpc record what left the rank, so their bars
are measurements. A ring all-reduce written by hand from send/recv (lab 05) therefore shows a
*measured* 2(N-1)/N·S, which ``all_reduce_payload=S`` draws as a reference line to compare with.
"""
from __future__ import annotations

import math

from matplotlib.patches import Patch

from mpkit.plot.inputs import as_trace, select_step
from mpkit.simulator.formulas import MEASURED_KINDS, wire_bytes, wire_factor
from mpkit.i18n import t as text
from mpkit.plot.style import title
from mpkit.plot.style import KIND_COLOURS, drawing, new_figure
from mpkit.whole import is_number

_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
FORMULA_HATCH = "xx"


def unit_for(n_bytes: float) -> tuple[str, int]:
    """The largest binary unit in which ``n_bytes`` is at least 1."""
    return next(((name, size) for name, size in _UNITS if n_bytes >= size), _UNITS[-1])


def _world_size(run, trace) -> int:
    n = getattr(run, "world_size", None) or len(trace.ranks)
    if n < 1:
        raise ValueError("run has no ranks; pass a Run or Trace with events")
    return n


def comm(run, lang="en", step=None, all_reduce_payload=None):
    """Grouped bars: per rank, the wire bytes of each communication kind (ring formula for
    collectives, measured for send/rpc; see the module docstring), summed over the run or one
    ``step``. ``all_reduce_payload=S`` (bytes) adds the line 2(N-1)/N·S. N is the run's world
    size (``run.world_size``, else the number of ranks in the trace)."""
    with drawing(lang):
        full = as_trace(run, "run")
        n = _world_size(run, full)
        trace = select_step(full, step, "run")
        if all_reduce_payload is not None and not (is_number(all_reduce_payload) and 0 < all_reduce_payload < math.inf):
            raise ValueError(f"all_reduce_payload={all_reduce_payload!r}: pass the payload size S in bytes (> 0)")
        per_rank = wire_bytes(trace, n)
        ranks = full.ranks
        kinds = [k for k in KIND_COLOURS if any(k in v for v in per_rank.values())]
        reference = None if all_reduce_payload is None else wire_factor("all_reduce", n) * all_reduce_payload
        largest = max([b for v in per_rank.values() for b in v.values()] + [reference or 0, 1])
        unit, size = unit_for(largest)
        width = 0.8 / max(len(kinds), 1)
        fig, ax = new_figure(max(6.5, 3.0 + len(ranks) * (0.5 + 0.4 * len(kinds))), 4.8)
        for i, kind in enumerate(kinds):
            xs = [r + (i - (len(kinds) - 1) / 2) * width for r in ranks]
            heights = [per_rank.get(r, {}).get(kind, 0.0) / size for r in ranks]
            bars = ax.bar(xs, heights, width * 0.92, color=KIND_COLOURS[kind], gid=kind, edgecolor="white",
                          hatch=None if kind in MEASURED_KINDS else FORMULA_HATCH, linewidth=0.5)
            ax.bar_label(bars, [f"{h:.3g}" if h else "" for h in heights], fontsize=7, padding=2)
        if reference is not None:
            ax.axhline(reference / size, color="black", linestyle="--", linewidth=1.0, gid="reference")
        if not kinds:
            ax.text(0.5, 0.5, text("no_comm", lang), transform=ax.transAxes, ha="center", va="center", fontsize=11)
        ax.set_xticks(ranks, [text("rank", lang, rank=r) for r in ranks])
        ax.set_ylabel(text("bytes", lang, unit=unit))
        ax.set_title(title("comm", run, lang, step) + ("" if step is not None else f" · {text('whole_run', lang)}"),
                     fontsize=11, loc="left")
        ax.margins(y=0.15)
        ax.grid(axis="y", color="#EEEEEE", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.annotate(text("comm_note", lang, n=n), (0, 0), xycoords="axes fraction", xytext=(0, -34),
                    textcoords="offset points", va="top", fontsize=8, color="#444444", gid="note")
        handles = [Patch(facecolor=KIND_COLOURS[k], label=text(k, lang)) for k in kinds]
        if any(k not in MEASURED_KINDS for k in kinds):
            handles.append(Patch(facecolor="white", edgecolor="#555555", hatch=FORMULA_HATCH,
                                 label=text("formula", lang)))
        if any(k in MEASURED_KINDS for k in kinds):
            handles.append(Patch(facecolor="#555555", label=text("measured", lang)))
        if reference is not None:
            handles.append(Patch(fill=False, edgecolor="black", linestyle="--",
                                 label=text("ring_reference", lang, size=_format(all_reduce_payload))))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return fig


def _format(n_bytes: float) -> str:
    name, size = unit_for(n_bytes)
    return f"{n_bytes / size:.3g} {name}"
