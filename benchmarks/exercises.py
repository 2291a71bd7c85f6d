"""How long a learner waits for ``mpkit.exercises.check``: every exercise with its reference
solution (all cases run), and the two ways a check ends without finishing, a deadlock and an
endless loop (one case at the timeout, the rest skipped). Medians over ``--reps`` runs; the whole
table twice (``--rounds``) so the run-to-run spread, the noise floor, stands next to the figures.

    python benchmarks/exercises.py [--reps 3] [--rounds 2] [--only NAME,NAME]
"""
from __future__ import annotations

import argparse
import statistics
import time

from machine import load, machine_info  # benchmarks/machine.py (also puts the checkout on sys.path)

import torch.distributed as dist  # noqa: E402

from mpkit.exercises import EXERCISES, check, solutions  # noqa: E402


def _deadlock(ctx, tensor):
    dist.send(tensor, (ctx.rank + 1) % ctx.world_size)
    dist.recv(tensor, (ctx.rank - 1) % ctx.world_size)
    return tensor


def _loop(rank, dp, pp, tp):
    while True:
        pass


def _target(name):
    objs = solutions.definitions(EXERCISES[name])
    return objs[0] if len(objs) == 1 else tuple(objs)


def cases():
    yield from ((name, name, _target(name)) for name in EXERCISES)
    yield "ring_all_reduce: deadlock", "ring_all_reduce", _deadlock
    yield "rank_coordinates: endless loop", "rank_coordinates", _loop


def seconds(name, fn, reps):
    times = []
    for _ in range(reps):
        started = time.monotonic()
        check(name, fn, lang="en", record=False)
        times.append(time.monotonic() - started)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated exercise names (default: every exercise)")
    args = parser.parse_args()
    only = {name for name in args.only.split(",") if name}
    unknown = only - set(EXERCISES)
    if unknown:
        parser.error(f"--only: unknown exercise(s) {', '.join(sorted(unknown))}; use names from `mpkit exercise list`")
    chosen = [(label, name, fn) for label, name, fn in cases() if not only or name in only]
    print(machine_info(), f"load before: {load()}")
    rows = {label: [seconds(name, fn, args.reps) for _ in range(args.rounds)] for label, name, fn in chosen}
    print(f"| check | cases | median s ({args.reps} runs), round 1 .. {args.rounds} | spread between rounds |")
    print("|---|---|---|---|")
    for (label, name, _), values in zip(chosen, rows.values()):
        spread = max(values) - min(values)
        print(f"| {label} | {len(EXERCISES[name].cases)} | {' / '.join(f'{v:.2f}' for v in values)} | {spread:.2f} |")
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
