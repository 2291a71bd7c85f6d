"""Checkpoints against failures: the waste of a checkpoint interval, and a run's restarts.

``checkpoint_interval(checkpoint, mtbf, restart)`` draws the share of wall time lost against the
work between checkpoints τ: Daly's expected waste (``sim.formulas.waste_fraction``) with Young's
two first-order parts beside it (saving cost δ/τ falling, work lost to failures τ/(2M) rising),
and Young's and Daly's optima marked. ``restarts(history)`` draws the events a checkpointed run
logged (``history.jsonl`` of its ``checkpoint_dir``): one row per attempt, each step a bar, saves
as ticks, the failure where an attempt stopped without ending, and the steps a later attempt ran
again (replayed) hatched.
"""
from __future__ import annotations

import numpy as np

from mpkit.i18n import t
from mpkit.plot.style import KIND_COLOURS, drawing, new_figure
from mpkit.simulator.formulas import daly_interval, waste_fraction, young_interval

FAILURE_COLOUR, SAVE_COLOUR, REPLAY_COLOUR = "#C44E52", "#2A9D8F", "#E8A33D"


def duration(seconds: float) -> str:
    """Seconds as the lab reads them: 45 s, 12.5 min, 3.1 h."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def checkpoint_interval(checkpoint: float, mtbf: float, restart: float = 0.0, interval: float | None = None,
                        lang="en"):
    """Waste against the checkpoint interval (all arguments in seconds; ``interval``: a chosen τ to mark)."""
    young, daly = young_interval(checkpoint, mtbf), daly_interval(checkpoint, mtbf)
    taus = np.geomspace(young / 30, min(young * 30, 50 * mtbf), 300)
    with drawing(lang):
        fig, ax = new_figure(8.0, 4.2)
        ax.plot(taus / 60, [waste_fraction(x, checkpoint, mtbf, restart) for x in taus], color="#222222", lw=2,
                label=t("ckpt_total", lang))
        ax.plot(taus / 60, checkpoint / taus, color=SAVE_COLOUR, ls="--", label=t("ckpt_saving_part", lang))
        ax.plot(taus / 60, taus / (2 * mtbf), color=FAILURE_COLOUR, ls="--", label=t("ckpt_lost_part", lang))
        marks = [(young, "ckpt_young", ":"), (daly, "ckpt_daly", "-.")]
        if interval is not None:
            marks.append((interval, "ckpt_chosen", "-"))
        for tau, key, style in marks:
            ax.axvline(tau / 60, color="#4C72B0" if key != "ckpt_chosen" else "#8172B3", ls=style, lw=1.2,
                       label=t(key, lang, value=duration(tau)))
        ax.set_xscale("log")
        ax.set_ylim(0, min(1.0, 3 * waste_fraction(daly, checkpoint, mtbf, restart) + 0.05))
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
        ax.set_xlabel(t("ckpt_interval_x", lang))
        ax.set_ylabel(t("ckpt_interval_y", lang))
        ax.set_title(t("ckpt_interval_title", lang, checkpoint=duration(checkpoint), mtbf=duration(mtbf),
                       restart=duration(restart)), fontsize=10)
        ax.legend(fontsize=8, loc="upper center")
        fig.tight_layout()
    return fig


def attempts(history: list[dict]) -> list[list[dict]]:
    """The events split at each "start": one list per attempt, in order."""
    out = []
    for event in history:
        if event["event"] == "start" or not out:
            out.append([])
        out[-1].append(event)
    return out


def restarts(history: list[dict], lang="en"):
    """The attempts of a checkpointed run (``checkpointing.read_history(checkpoint_dir)``)."""
    if not history:
        raise ValueError("restarts() needs the events of a run with checkpoint_dir= (read_history(checkpoint_dir)); "
                         "this history is empty")
    runs = attempts(history)
    t0 = history[0]["time"]
    with drawing(lang):
        fig, ax = new_figure(9.0, 1.0 + 0.8 * len(runs))
        done = set()  # steps an earlier attempt started: running them again is a replay
        for row, events in enumerate(runs):
            y = len(runs) - 1 - row
            steps = [e for e in events if e["event"] == "step"]
            for i, e in enumerate(steps):
                following = next((f for f in events if f["time"] > e["time"]), None)
                end = (following or e)["time"]
                replay = e["step"] in done
                ax.barh(y, max(end - e["time"], 1e-3), left=e["time"] - t0, height=0.5,
                        color=REPLAY_COLOUR if replay else KIND_COLOURS["forward"], hatch="//" if replay else None,
                        edgecolor="white", label=t("restarts_replayed" if replay else "restarts_step", lang))
                ax.text(e["time"] - t0 + (end - e["time"]) / 2, y, str(e["step"]), ha="center", va="center",
                        fontsize=7, color="white")
            for e in events:
                if e["event"] == "save":
                    ax.plot([e["time"] - t0] * 2, [y - 0.35, y + 0.35], color=SAVE_COLOUR, lw=2,
                            label=t("restarts_save", lang))
            if events[-1]["event"] != "end":
                ax.plot(events[-1]["time"] - t0, y, marker="X", color=FAILURE_COLOUR, markersize=12, ls="none",
                        label=t("restarts_failure", lang))
            done |= {e["step"] for e in steps}
        ax.set_yticks(range(len(runs)))
        ax.set_yticklabels([t("restarts_attempt", lang, n=len(runs) - i, step=runs[len(runs) - 1 - i][0]["step"])
                            for i in range(len(runs))], fontsize=8)
        ax.set_xlabel(t("restarts_x", lang))
        ax.set_title(t("restarts_title", lang), fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
    return fig
