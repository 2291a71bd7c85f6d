"""``mpkit tour``: every strategy on simulated devices, one small model, one table (all but the
sequence strategies sp, cp and ep, which need the gpt: lab 11 runs them).

All strategies train the same model on the same data for the same steps, so the table reads
across: final loss and the max difference from ``single`` (parity), peak memory per rank, the
bubble (idle share of a step from its first forward to its last backward, the median of steps
1..3, as lab 04 measures it), the share of time with communication in flight, and wall time.
Every layer carries ``LAYER_MS`` of simulated device time (``layer_ms``, slept, as in lab 04), so
the ranks behave like dedicated devices even on a 2-core laptop and the bubble column shows what
lab 04 shows: the pipeline (``pp``, ``MICRO_BATCHES`` micro-batches) far below the layer-wise
split (``mp``). The table ends with the caveat that this is simulated device time, not a speed
measurement. With ``mpkit.plot`` available it also saves a timeline per strategy and one memory
chart of all.

This module is the command's arguments and settings; the work is ``tour_command.main``, imported
only when the tour runs.
"""
from __future__ import annotations

import math
import unicodedata
from pathlib import Path

from mpkit.cli.later import later
from mpkit.i18n import LANGS
from mpkit.registry import SEQUENCE_STRATEGIES, STRATEGIES

STEPS = 4           # step 0 pays first-call costs; the bubble is the median of the others
LAYER_MS = 20.0     # simulated device time per layer and micro-batch, forward (backward: twice):
                    # large next to the few ms a message and a wake-up cost on a busy CPU
MICRO_BATCHES = 8   # pp on 4 ranks: bubble (p-1)/(m+p-1) = 3/11, against mp's (p-1)/p = 3/4
TOURED = [s for s in STRATEGIES if s not in SEQUENCE_STRATEGIES]  # sp, cp, ep need a sequence model: lab 11
COLUMNS = ("tour_strategy", "tour_ranks", "tour_loss", "tour_diff", "tour_peak", "tour_bubble", "tour_comm",
           "tour_time")


def register(subparsers):
    p = subparsers.add_parser("tour", help="run every strategy on simulated devices: summary table + plots",
                              description="Train every strategy on the same small model and compare them.")
    p.add_argument("--world-size", type=int, default=4, help="ranks for every strategy but single (default 4)")
    p.add_argument("--out", default="mpkit-tour", metavar="DIR", help="where the PNGs go (default ./mpkit-tour)")
    p.add_argument("--no-plots", action="store_true", help="only the table")
    p.add_argument("--lang", choices=LANGS, default="en", help="language of the table and plots (default en)")
    p.set_defaults(handler=later("mpkit.cli.tour_command:main"))
    return p


def tour_settings(world_size: int) -> dict:
    """One setting every strategy accepts: the batch divides among ranks (dp family), workers
    (ps: world_size-1) and micro-batches (pp); one layer per rank at least (mp, pp)."""
    if world_size < 2:
        raise ValueError(f"--world-size {world_size}: the tour compares parallel strategies; use 2 or more")
    unit = math.lcm(world_size, world_size - 1, MICRO_BATCHES)
    return {"model": "mlp", "layers": max(4, world_size), "steps": STEPS, "batch_size": unit * math.ceil(16 / unit),
            "layer_ms": LAYER_MS}


def strategy_options(strategy: str, world_size: int) -> dict:
    """pp's micro-batches; for 3d a grid of the world: two pipeline stages and two data-parallel
    replicas where the world allows, tensor parallel on the rest (4 ranks: dp=2, pp=2; 8: 2x2x2)."""
    if strategy == "pp":
        return {"micro_batches": MICRO_BATCHES}
    if strategy == "3d":
        pp = 2 if world_size % 2 == 0 else 1
        dp = 2 if (world_size // pp) % 2 == 0 else 1
        return {"dp": dp, "pp": pp, "tp": world_size // (pp * dp), "micro_batches": 4}
    return {}


def check_out(out: Path) -> None:
    """Refuse, before anything trains, a plot folder that cannot be one: an existing file, or a
    path below a file."""
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                where = "is a file" if path == out else f"is below {path}, which is a file"
                raise ValueError(f"--out {out} {where}; pass a folder for the PNGs (it is created if missing)")
            return


def _width(text: str) -> int:
    """Columns ``text`` takes in a terminal: Hangul and other wide characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def table(header, rows) -> str:
    widths = [max(_width(r[i]) for r in [header, *rows] if i < len(r)) for i in range(len(header))]
    lines = ["  ".join(cell + " " * (w - _width(cell)) for cell, w in zip(row, widths)).rstrip()
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
