"""What a simulated device capacity costs: with ``device_memory`` set, every tensor a rank allocates
counts toward it, so the whole rank runs under the memory tracker, not only the strategy's
training loop. Step time of ``mpkit.train`` without and with a capacity (and with memory tracking
off), the three alternating run by run so load drift hits them alike; a run's step time is the
median of its steps after the first, the reported time the median over runs.

    python benchmarks/capacity.py [--runs 5] [--steps 6]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402  (benchmarks/machine.py; also puts the checkout on sys.path)

import mpkit  # noqa: E402

RUN = dict(strategy="dp", world_size=4, model="gpt", hidden=128, layers=4, seq_len=32, batch_size=32)
VARIANTS = {"memory off": dict(memory=False), "memory tracked (loop)": dict(),
            "capacity set (whole rank)": dict(device_memory="1GiB")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    print(machine_info())
    times = {name: [] for name in VARIANTS}
    for _ in range(args.runs):
        for name, options in VARIANTS.items():
            run = mpkit.train(steps=args.steps, **RUN, **options)
            times[name].append(statistics.median(run.step_times()[1:]))
    base = statistics.median(times["memory off"])
    print(f"dp on 4 ranks, gpt hidden 128; median over {args.runs} runs of the median of steps 2..{args.steps}\n")
    print("| variant | ms/step | vs memory off |\n|---|---:|---:|")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name} | {t * 1e3:.1f} | {(t / base - 1) * 100:+.1f}% |")


if __name__ == "__main__":
    main()
