"""Per-rank Gantt chart of one run: where each rank computed, communicated, or sat idle.

Idle is every stretch of the plotted window in which a rank did no compute — exactly what
``Trace.bubble_share`` counts — so the hatched area and the number in the title agree.
Communication sits on a thinner lane under the compute lane: overlap (DDP buckets during
backward) shows as comm spans under compute spans, exposed comm as comm under a bubble.
On a run of several dimensions (data, pipeline, context, tensor, expert parallel) rows carry their
mesh coordinates, lines separate the data-parallel replicas (solid) and pipeline stages (dotted),
and communication is coloured by the group it ran in: TP, PP, DP, CP, dp x cp, EP, EDP.
"""
from __future__ import annotations

from matplotlib.patches import Patch, Rectangle

from mpkit.plot.inputs import as_trace, select_step
from mpkit.i18n import t as text
from mpkit.plot.style import title as run_title
from mpkit.plot.style import GROUP_COLOURS, IDEAL_EDGE, IDLE_COLOUR, IDLE_HATCH, KIND_COLOURS, drawing, new_figure

# Lanes inside the row of rank r (y grows downwards): compute [r-0.40, r+0.10], comm [r+0.14, r+0.40].
COMPUTE_LANE = (-0.40, 0.50)
COMM_LANE = (0.14, 0.26)
_LETTERS = {"forward": "F", "backward": "B", "optimizer": "O", "compute": "C"}
_LABEL_SIZE = 7


def figsize(n_ranks: int) -> tuple[float, float]:
    """Fixed by the number of ranks, so layouts are reproducible."""
    return (12.0, max(2.4, 1.1 + 0.7 * n_ranks))


def compute_gaps(events, start: float, end: float) -> list[tuple[float, float]]:
    """Stretches of [start, end] not covered by any compute event (of one rank)."""
    gaps, cursor = [], start
    for s, e in sorted((ev.start, ev.end) for ev in events if ev.category == "compute"):
        if s > cursor:
            gaps.append((cursor, min(s, end)))
        cursor = max(cursor, e)
    if cursor < end:
        gaps.append((cursor, end))
    return [(s, e) for s, e in gaps if e > s]


def _span_label(event, room_inches: float) -> str:
    """"F3 s1" / "F3" / "" — whatever fits in the span's width."""
    base = _LETTERS[event.kind] + ("" if event.micro_batch is None else str(event.micro_batch))
    options = [base] if event.stage is None else [f"{base} s{event.stage}", base]
    for label in options:
        if (len(label) * 0.62 + 0.6) * _LABEL_SIZE / 72 <= room_inches:
            return label
    return ""


def _aligned_ideal(ideal, step, start):
    """The prediction's events, starting at ``start``: only those of ``step`` when it has that
    step, else all of them (a cost model usually predicts one step, numbered 0)."""
    trace = as_trace(ideal, "ideal")
    if step is not None and any(e.step == step for e in trace.events):
        trace = trace.filter(step=step)
    shift = start - trace.window()[0]
    return [(e, e.start + shift, e.end + shift) for e in trace.events]


def _lane(event):
    return COMPUTE_LANE if event.category == "compute" else COMM_LANE


def _colour(event, by_group):
    if by_group and event.category == "comm" and event.group in GROUP_COLOURS:
        return GROUP_COLOURS[event.group]
    return KIND_COLOURS[event.kind]


def _draw_events(ax, events, inches_per_ms, by_group=False):
    for e in events:
        if e.category == "idle":
            continue  # recorded idle lies inside a compute gap, which is shaded already
        offset, height = _lane(e)
        x, width = e.start * 1e3, e.duration * 1e3
        colour = _colour(e, by_group)
        # A white edge separates neighbouring spans, but would swallow a span narrower than itself.
        edge = "white" if width * inches_per_ms > 0.04 else colour
        ax.add_patch(Rectangle((x, e.rank + offset), width, height, facecolor=colour,
                               edgecolor=edge, linewidth=0.4, gid=e.category))
        if e.category == "compute":
            label = _span_label(e, width * inches_per_ms)
            if label:
                ax.text(x + width / 2, e.rank + offset + height / 2, label, ha="center", va="center",
                        fontsize=_LABEL_SIZE, color="white", clip_on=True)


def _draw_gaps(ax, trace, ranks, start, end):
    for rank in ranks:
        offset, height = COMPUTE_LANE
        for s, e in compute_gaps(trace.of_rank(rank), start, end):
            ax.add_patch(Rectangle((s * 1e3, rank + offset), (e - s) * 1e3, height, facecolor=IDLE_COLOUR,
                                   edgecolor="#9E9E9E", hatch=IDLE_HATCH, linewidth=0.0, gid="idle"))


def _draw_ideal(ax, ideal_events):
    for e, s, end in ideal_events:
        if e.category == "idle":
            continue
        offset, height = _lane(e)
        ax.add_patch(Rectangle((s * 1e3, e.rank + offset), (end - s) * 1e3, height, fill=False,
                               edgecolor=IDEAL_EDGE, linestyle="--", linewidth=0.9, gid="ideal"))


def _draw_step_starts(ax, trace, lang):
    """A dotted line where each optimizer step begins, when the window holds more than one."""
    starts = {}
    for e in trace.events:
        if e.step is not None:
            starts[e.step] = min(starts.get(e.step, e.start), e.start)
    if len(starts) < 2:
        return
    for step, start in sorted(starts.items()):
        ax.axvline(start * 1e3, color="#555555", linestyle=":", linewidth=0.8, zorder=0.5)
        ax.annotate(text("step", lang, step=step), (start * 1e3, 0.0), xycoords=("data", "axes fraction"),
                    xytext=(2, 2), textcoords="offset points", fontsize=7, color="#555555")


def _legend(ax, kinds, lang, with_ideal, groups=()):
    handles = [Patch(facecolor=KIND_COLOURS[k], label=text(k, lang)) for k in KIND_COLOURS
               if k in kinds and not (groups and k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                          "send", "recv"))]
    handles += [Patch(facecolor=GROUP_COLOURS[g], label=text(f"group_{g}", lang)) for g in GROUP_COLOURS if g in groups]
    handles.append(Patch(facecolor=IDLE_COLOUR, edgecolor="#9E9E9E", hatch=IDLE_HATCH, label=text("idle", lang)))
    if with_ideal:
        handles.append(Patch(fill=False, edgecolor=IDEAL_EDGE, linestyle="--", label=text("ideal", lang)))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)


def _title(run_or_trace, trace, step, lang, title):
    if title is None:
        title = run_title("timeline", run_or_trace, lang, step)
    return title + "\n" + text("shares", lang, bubble=trace.bubble_share(), comm=trace.comm_share())


def _mesh(run_or_trace):
    """The run's layout when it has several dimensions of more than one rank, else None."""
    mesh = getattr(run_or_trace, "mesh", None)
    return mesh if mesh is not None and sum(size > 1 for size in mesh.shape) > 1 else None


def _draw_mesh(ax, mesh, ranks):
    """A solid line between data-parallel replicas, a dotted one between pipeline stages."""
    for above, below in zip(ranks, ranks[1:]):
        a, b = mesh.coords(above), mesh.coords(below)
        if a["dp"] != b["dp"]:
            ax.axhline((above + below) / 2, color="#555555", linewidth=1.0, zorder=0.4)
        elif a["pp"] != b["pp"]:
            ax.axhline((above + below) / 2, color="#999999", linestyle=":", linewidth=0.9, zorder=0.4)


def _rank_label(rank, mesh, lang):
    if mesh is None:
        return text("rank", lang, rank=rank)
    sizes = dict(zip(mesh.dims, mesh.shape))  # the dimensions of more than one rank, in the run's order
    coords = " · ".join(f"{d} {i}" for d, i in mesh.coords(rank).items() if sizes[d] > 1)
    return text("rank_coords", lang, rank=rank, coords=coords)


def timeline(run_or_trace, lang="en", step=None, ax=None, ideal=None, title=None):
    """Gantt chart of a Run / Trace / prediction: one row per rank (rank 0 on top), time in ms.

    ``step=`` keeps one optimizer step; ``ideal=`` (a Trace, Run or ``mpkit.sim.predict`` result)
    is drawn as dashed outlines, shifted to start where the measured window starts. Returns the Figure.
    """
    with drawing(lang):
        trace = select_step(as_trace(run_or_trace), step, "run_or_trace")
        if not trace.events:
            raise ValueError("run_or_trace has no events; record a run with trace=True (the default)")
        start, end = trace.window()
        ideal_events = [] if ideal is None else _aligned_ideal(ideal, step, start)
        ranks = sorted({*trace.ranks, *(e.rank for e, _, _ in ideal_events)})
        x_end = max([end, *(s_end for _, _, s_end in ideal_events)])
        mesh = _mesh(run_or_trace)
        if ax is None:
            fig, ax = new_figure(*figsize(len(ranks)))
            if mesh is not None:
                fig.subplots_adjust(left=0.2)  # room for the mesh coordinates of each row
        fig = ax.figure
        ax.set_xlim(start * 1e3, x_end * 1e3)
        ax.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)
        axes_inches = ax.get_position().width * fig.get_figwidth()
        inches_per_ms = axes_inches / max((x_end - start) * 1e3, 1e-9)

        groups = {e.group for e in trace.events if e.category == "comm" and e.group} if mesh else set()
        _draw_gaps(ax, trace, ranks, start, end)
        _draw_events(ax, trace.events, inches_per_ms, by_group=bool(groups))
        _draw_ideal(ax, ideal_events)
        _draw_step_starts(ax, trace, lang)
        if mesh is not None:
            _draw_mesh(ax, mesh, ranks)

        ax.set_yticks(ranks, [_rank_label(r, mesh, lang) for r in ranks])
        ax.set_xlabel(text("time_ms", lang))
        ax.set_title(_title(run_or_trace, trace, step, lang, title), fontsize=11, loc="left")
        ax.grid(axis="x", color="#EEEEEE", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        _legend(ax, {e.kind for e in trace.events}, lang, bool(ideal_events), groups)
    return fig
