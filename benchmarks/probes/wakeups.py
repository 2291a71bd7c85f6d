"""Why cpu-sim predictions fail under load: where a busy machine's time goes in a pipeline step.

Runs one pp configuration (2 ranks, mlp-256, GPipe, 4 micro-batches) quiet, then with ``--load``
busy loops started by this script: once right after they start, once after they have run for
``--age`` seconds. Prints the median step period and, per event kind, the median duration and
the time per step, so one sees whether load stretches compute (what processor sharing assumes)
or the waits in send/recv (what a rank pays when it wakes behind a busy loop).

    python benchmarks/probes/wakeups.py [--load 2] [--age 60] [--runs 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: costmodel.py, _common/
from costmodel import background_load  # noqa: E402
from _common.machine import load  # noqa: E402

import mpkit  # noqa: E402

CONFIG = dict(model="mlp", hidden=256, layers=4, batch_size=64, schedule="gpipe", micro_batches=4)
KINDS = ("forward", "backward", "send", "recv")
WORLD = 2
STEPS = 14


def probe(runs: int) -> dict:
    """Median step period and {kind: (median ms, ms per step)} over the steady second half of runs."""
    periods, durations = [], {k: [] for k in KINDS}
    for _ in range(runs):
        run = mpkit.train("pp", world_size=WORLD, steps=STEPS, memory=False, **CONFIG)
        periods += run.step_periods()[STEPS // 2:]
        for e in run.trace.events:
            if e.kind in durations and e.step is not None and e.step >= STEPS // 2:
                durations[e.kind].append(e.duration)
    rank_steps = runs * (STEPS - STEPS // 2) * WORLD  # events are summed over ranks: per rank and step
    return {"step": statistics.median(periods) * 1e3,
            **{k: (statistics.median(v) * 1e3, sum(v) / rank_steps * 1e3) for k, v in durations.items()}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=2, help="busy background processes")
    parser.add_argument("--age", type=float, default=60.0, help="seconds the busy loops run before the last probe")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    results = {"quiet": probe(args.runs)}
    with background_load(args.load, args.age + 300):
        time.sleep(0.5)
        results[f"+{args.load} busy, fresh"] = probe(args.runs)
        time.sleep(args.age)
        results[f"+{args.load} busy, after {args.age:.0f} s"] = probe(args.runs)
    print(f"pp {WORLD} ranks {CONFIG}; {load()}")
    print("| condition | step ms | " + " | ".join(f"{k} median / per step ms" for k in KINDS) + " |")
    print("|---|---:|" + "---:|" * len(KINDS))
    for name, r in results.items():
        print(f"| {name} | {r['step']:.2f} | " + " | ".join(f"{r[k][0]:.3f} / {r[k][1]:.2f}" for k in KINDS) + " |")


if __name__ == "__main__":
    main()
