"""``mpkit tour``: every strategy on simulated devices, one small model, one table.

All strategies train the same model on the same data for the same steps, so the table reads
across: final loss and the max difference from ``single`` (parity), peak memory per rank, how
much of the time was bubble or communication, and wall time. With ``mpkit.plot`` available it
also saves a timeline per strategy and one memory chart of all of them.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from mpkit.errors import LaunchError
from mpkit.strategies import STRATEGIES
from mpkit.train import train

STEPS = 3
MICRO_BATCHES = 4  # pp's default


def register(subparsers):
    p = subparsers.add_parser("tour", help="run every strategy on simulated devices: summary table + plots",
                              description="Train every strategy on the same small model and compare them.")
    p.add_argument("--world-size", type=int, default=4, help="ranks for every strategy but single (default 4)")
    p.add_argument("--out", default="mpkit-tour", metavar="DIR", help="where the PNGs go (default ./mpkit-tour)")
    p.add_argument("--no-plots", action="store_true", help="only the table")
    p.set_defaults(handler=main)
    return p


def tour_settings(world_size: int) -> dict:
    """One setting every strategy accepts: the batch divides among ranks (dp family), workers
    (ps: world_size-1) and micro-batches (pp); one layer per rank at least (mp, pp)."""
    if world_size < 2:
        raise ValueError(f"--world-size {world_size}: the tour compares parallel strategies; use 2 or more")
    unit = math.lcm(world_size, world_size - 1, MICRO_BATCHES)
    return {"model": "mlp", "layers": max(4, world_size), "steps": STEPS, "batch_size": unit * math.ceil(16 / unit)}


def main(args) -> int:
    settings = tour_settings(args.world_size)
    rows, runs, failed, reference = [], {}, 0, None
    for strategy in STRATEGIES:  # single first: every other run is compared with it
        start = time.perf_counter()
        try:
            run = train(strategy, 1 if strategy == "single" else args.world_size, **settings)
        except (ValueError, LaunchError, ImportError) as exc:
            failed += 1
            rows.append([strategy, "-", f"error: {str(exc).splitlines()[0][:70]}"])
            continue
        seconds = time.perf_counter() - start
        runs[strategy] = run
        reference = reference or run
        peaks = "/".join(f"{m.peak_total / 2**20:.2f}" for m in run.memory)
        rows.append([strategy, str(run.world_size), f"{run.losses[-1]:.4f}",
                     f"{run.compare_to_reference(reference).max:.1e}", peaks,
                     f"{run.trace.bubble_share():.0%}", f"{run.trace.comm_share():.0%}", f"{seconds:.1f}s"])
    print(f"mpkit tour: {args.world_size} simulated devices, {settings['model']} with {settings['layers']} layers, "
          f"batch {settings['batch_size']}, {STEPS} steps\n")
    print(table(["strategy", "ranks", "final loss", "max diff vs single", "peak MiB per rank", "bubble", "comm",
                 "time"], rows))
    if not args.no_plots:
        saved = save_plots(runs, Path(args.out))
        if saved:
            print(f"\nplots: {len(saved)} PNGs in {args.out}/")
    return 1 if failed else 0


def table(header, rows) -> str:
    widths = [max(len(r[i]) for r in [header, *rows] if i < len(r)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def save_plots(runs, out: Path) -> list[str]:
    """A timeline per strategy and one memory chart of all; nothing if mpkit.plot is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no window
        import matplotlib.pyplot as plt

        from mpkit import plot
    except ImportError:
        return []
    saved = []
    for name, run in runs.items():
        fig = plot.timeline(run)
        saved.append(plot.save(fig, out / f"timeline_{name}.png"))
        plt.close(fig)
    fig = plot.memory(runs)
    saved.append(plot.save(fig, out / "memory.png"))
    plt.close(fig)
    return saved
