"""How long a pipeline's messages take once both ends have posted them, in real 2-rank runs.

The cost model plays a pipeline's hand-offs at the prices the calibration measures (a relay's
hop, the wake-ups of ``benchmarks/probes/message_wait.py``). This looks at the hand-offs of the real
runs instead: for every receive of steps 5 on, the time from the later of its own post and its
send's post to its completion (messages between the two ranks match in posting order, as gloo
matches them), as a histogram in 0.5 ms bins, beside the step's median and quartiles and the
prediction. On this VM as is most hand-offs take ~0.1 ms, but a share of them stalls for
milliseconds, piling up just under 4 ms (8 ms beside busy loops), the kernel's timer tick
(HZ=250), while the cores are free; the steps come out bimodal, and the calibration's two-rank
measurements see next to none of these stalls (BENCHMARKS.md, "Cost model accuracy").

    python benchmarks/probes/handoffs.py [--load 2] [--runs 4] [--steps 30]   # about 3 minutes on 2 cores
"""
from __future__ import annotations

import collections
import gzip
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: costmodel.py, _common/
from costmodel import MODELS, both_conditions, calibrate_now, condition_parser  # noqa: E402 (benchmarks/costmodel.py)
from _common.machine import load  # noqa: E402
import mpkit
from mpkit.sim import predict

SCHEDULES = (dict(schedule="gpipe", micro_batches=4), dict(schedule="1f1b", micro_batches=8))
FIRST_STEP = 5  # step times settle within ~5 steps
BIN = 0.5e-3


def kernel_tick() -> str:
    """The kernel's timer frequency, where its configuration can be read (``/proc/config.gz``)."""
    try:
        with gzip.open("/proc/config.gz", "rt") as fh:
            return next((line.strip() for line in fh if line.startswith("CONFIG_HZ=")), "CONFIG_HZ unknown")
    except OSError:
        return "CONFIG_HZ unknown"


def hand_offs(events) -> list[float]:
    """Seconds from the later post to the completion of each receive between ranks 0 and 1: the
    k-th receive of a step on one rank is the k-th send of that step on the other."""
    posted = collections.defaultdict(list)
    for e in sorted(events, key=lambda e: e.start):
        if e.kind in ("send", "recv") and e.step is not None and e.step >= FIRST_STEP:
            posted[(e.step, e.rank, e.kind)].append(e)
    out = []
    for (step, rank, kind), receives in posted.items():
        if kind == "recv":
            sends = posted.get((step, 1 - rank, "send"), [])
            out += [r.end - max(r.start, s.start) for r, s in zip(receives, sends)]
    return out


def histogram(seconds) -> str:
    counts = collections.Counter(int(s / BIN) for s in seconds)
    return " ".join(f"{b * BIN * 1e3:g}:{counts[b]}" for b in range(max(counts) + 1) if counts[b])


def condition(args):
    hw = calibrate_now()
    print(f"{kernel_tick()}; {load()}\n| pipeline (2 ranks) | step ms: median (quartiles) | predicted ms | hand-offs |"
          " median ms | > 1 ms | in 2.5-3.5 ms | in 3.5-4.5 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for model_name, sizes in MODELS.items():
        for options in SCHEDULES:
            kwargs = {**sizes, **options}
            periods, waits = [], []
            for _ in range(args.runs):
                run = mpkit.train("pp", world_size=2, steps=args.steps, memory=False, **kwargs)
                periods += run.step_periods()[FIRST_STEP:]
                waits += hand_offs(run.trace.events)
            q1, med, q3 = statistics.quantiles(periods, n=4)
            predicted = predict("pp", hardware=hw, world_size=2, **kwargs).step_time
            name = f"{model_name} {options['schedule']} m={options['micro_batches']}"
            print(f"| {name} | {med * 1e3:.2f} ({q1 * 1e3:.2f}-{q3 * 1e3:.2f}) | {predicted * 1e3:.2f} | {len(waits)} | "
                  f"{statistics.median(waits) * 1e3:.2f} | {sum(w > 1e-3 for w in waits) / len(waits):.0%} | "
                  f"{sum(2.5e-3 <= w < 3.5e-3 for w in waits)} | {sum(3.5e-3 <= w < 4.5e-3 for w in waits)} |")
            rows[name] = waits
    print("\nhand-offs per 0.5 ms bin (bin start ms: count), all four pipelines:")
    print(histogram([w for waits in rows.values() for w in waits]) + "\n")
    return rows


def main(argv=None):
    parser = condition_parser(__doc__, load_seconds=300.0)
    parser.add_argument("--runs", type=int, default=4, help="runs per pipeline")
    parser.add_argument("--steps", type=int, default=30, help="steps per run")
    both_conditions(condition, parser.parse_args(argv))


if __name__ == "__main__":
    main()
