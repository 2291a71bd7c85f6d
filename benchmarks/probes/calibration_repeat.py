"""How far do cpu-sim predictions move between calibrations taken one after another? No run measured.

``mpkit.sim.calibrate`` measures this machine in about 30 s; ``benchmarks/costmodel.py`` then
predicts its grid from that one calibration and measures the grid. A prediction cannot be more
reproducible than the calibration it comes from, so this benchmark calibrates ``--repeats`` times
back to back (nothing else between them but the predictions) and, for each grid configuration of
``costmodel.py``, prints the step ``predict`` gives from each calibration, and for the whole grid
the mean difference between two consecutive calibrations' predictions (per row, relative to their
mean) and the mean range (max - min over the median). Both conditions, as ``costmodel.py``: the
machine as it is, then with ``--load`` pinned busy loops.

    python benchmarks/probes/calibration_repeat.py [--repeats 3] [--load 2]   # about 3 minutes on 2 cores
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: costmodel.py, _common/
from costmodel import both_conditions, calibrate_now, condition_parser, grid  # noqa: E402 (benchmarks/costmodel.py)
from mpkit.sim import predict

_SECONDS_PER_CALIBRATION = 60  # about 35 s under two busy loops, with the predictions


def relative_difference(a: float, b: float) -> float:
    return abs(a - b) / ((a + b) / 2) * 100


def condition(args) -> tuple[float, float]:
    """(mean difference of consecutive calibrations' predictions, mean range), in %."""
    rows = list(grid(False))
    predictions = []
    for repeat in range(args.repeats):
        print(f"calibration {repeat + 1}:")
        hw = calibrate_now()
        predictions.append([predict(s, hardware=hw, world_size=w, **kw).step_time for s, w, _, kw in rows])
    differences, ranges = [], []
    print(f"{'config':46s} " + " ".join(f"{f'cal {i + 1} ms':>9s}" for i in range(args.repeats)) + f" {'range':>6s}")
    for k, (strategy, world, model_name, kwargs) in enumerate(rows):
        options = " ".join(f"{o}={kwargs[o]}" for o in ("schedule", "micro_batches") if o in kwargs)
        steps = [p[k] for p in predictions]
        ranges.append((max(steps) - min(steps)) / statistics.median(steps) * 100)
        differences += [relative_difference(a, b) for a, b in zip(steps, steps[1:])]
        print(f"{f'{strategy} N={world} {model_name} {options}':46s} "
              + " ".join(f"{s * 1e3:9.2f}" for s in steps) + f" {ranges[-1]:5.0f}%")
    result = statistics.fmean(differences), statistics.fmean(ranges)
    print(f"consecutive calibrations' predictions differ by {result[0]:.1f}% per row on average; "
          f"range over {args.repeats} calibrations {result[1]:.1f}%\n")
    return result


def main(argv=None):
    parser = condition_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="calibrations back to back per condition (2 or more)")
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error(f"--repeats={args.repeats}: two calibrations at least, to compare them")
    if args.load and args.load_seconds < _SECONDS_PER_CALIBRATION * args.repeats:
        parser.error(f"--load-seconds={args.load_seconds:g} would stop the busy loops before {args.repeats} "
                     f"calibrations end (about {_SECONDS_PER_CALIBRATION} s each under load): raise it")
    started = time.time()
    results = both_conditions(condition, args)
    print("| condition | consecutive calibrations differ by | range over the calibrations |\n|---|---:|---:|")
    for name, (difference, spread) in results.items():
        print(f"| {name} | {difference:.1f}% | {spread:.1f}% |")
    print(f"took {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
