"""``mpkit tour``'s work: train every toured strategy with the settings of ``tour``, print the
table, save the plots."""
from __future__ import annotations

import statistics
import time
from pathlib import Path

from mpkit.cli.tour import (COLUMNS, LAYER_MS, MICRO_BATCHES, STEPS, TOURED, check_out, strategy_options, table,
                            tour_settings)
from mpkit.errors import LaunchError
from mpkit.i18n import t
from mpkit.training import train


def main(args) -> int:
    settings = tour_settings(args.world_size)
    if not args.no_plots:
        check_out(Path(args.out))
    lang = args.lang
    rows, runs, failed, reference = [], {}, 0, None
    for strategy in TOURED:  # single first: every other run is compared with it
        start = time.perf_counter()
        try:
            run = train(strategy, 1 if strategy == "single" else args.world_size, **settings,
                        **strategy_options(strategy, args.world_size))
        except (ValueError, LaunchError, ImportError) as exc:
            failed += 1
            rows.append([strategy, "-", f"{t('tour_error', lang)}: {str(exc).splitlines()[0][:70]}"])
            continue
        seconds = time.perf_counter() - start
        runs[strategy] = run
        reference = reference or run
        peaks = "/".join(f"{m.peak_total / 2**20:.2f}" for m in run.memory)
        rows.append([strategy, str(run.world_size), f"{run.losses[-1]:.4f}",
                     f"{run.compare_to_reference(reference).max:.1e}", peaks,
                     f"{bubble(run):.0%}", f"{run.trace.comm_share():.0%}", f"{seconds:.1f}s"])
    print(t("tour_header", lang, n=args.world_size, model=settings["model"], layers=settings["layers"],
            batch=settings["batch_size"], steps=STEPS, m=MICRO_BATCHES) + "\n")
    print(table([t(key, lang) for key in COLUMNS], rows))
    print("\n" + t("tour_caveat", lang, ms=LAYER_MS, m=MICRO_BATCHES, p=args.world_size))
    if not args.no_plots:
        saved = save_plots(runs, Path(args.out), lang)
        if saved:
            print("\n" + t("tour_plots", lang, n=len(saved), out=args.out))
    return 1 if failed else 0


def bubble(run) -> float:
    """Median over steps 1.. of the idle share from a step's first forward to its last backward."""
    return statistics.median(run.trace.pipeline_bubble(step) for step in range(1, STEPS))


def save_plots(runs, out: Path, lang: str = "en") -> list[str]:
    """A timeline per strategy and one memory chart of all (matplotlib is imported here, on first
    use, so ``mpkit quiz ...`` and ``--no-plots`` never load it)."""
    from mpkit import plot

    saved = []
    for name, run in runs.items():
        fig = plot.timeline(run, lang=lang)
        saved.append(plot.save(fig, out / f"timeline_{name}.png"))
    fig = plot.memory(runs, lang=lang)
    saved.append(plot.save(fig, out / "memory.png"))
    return saved
