"""How long a learner waits: each lab top to bottom in a fresh kernel, and each exercise's check.

(a) the labs (the budget: 60 s, TF lab 120 s): every ``labs/*.ipynb`` executed with nbclient in a
    temporary copy (so nothing is written next to the committed notebooks), one row per notebook.
(b) ``--exercises``: ``mpkit.exercises.check`` on every exercise with its reference solution (all
    cases run), and the two ways a check ends without finishing, a deadlock and an endless loop (one
    case at the timeout, the rest skipped). Medians over ``--reps`` runs; the whole table twice
    (``--rounds``) so the run-to-run spread, the noise floor, stands next to the figures.

    python benchmarks/labs.py [NOTEBOOK ...]                      # (a)
    python benchmarks/labs.py --exercises [--reps 3] [--rounds 2] [--only NAME,NAME]  # (b)
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common.machine import load, machine_info  # also puts the checkout on sys.path

import nbformat  # noqa: E402
import torch.distributed as dist  # noqa: E402
from nbclient import NotebookClient  # noqa: E402

from mpkit.exercises import EXERCISES, check, solutions  # noqa: E402

LABS = Path(__file__).resolve().parents[1] / "labs"
BUDGET_S = {"08_tensorflow_api": 120.0}


# ---- (a) the labs ----

def run_time(path: Path, workdir: Path) -> float:
    notebook = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    return time.perf_counter() - start


def labs(notebooks):
    paths = [Path(p) for p in notebooks] or sorted(LABS.glob("[0-9][0-9]_*.ipynb"))
    print(f"{'notebook':<28} {'seconds':>8} {'budget':>7}")
    for path in paths:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(LABS, Path(tmp) / "labs")
            seconds = run_time(Path(tmp) / "labs" / path.name, Path(tmp) / "labs")
        budget = BUDGET_S.get(path.stem, 60.0)
        print(f"{path.stem:<28} {seconds:>8.1f} {budget:>7.0f}{'  OVER' if seconds > budget else ''}")


# ---- (b) the exercises' checks ----

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


def exercises(reps, rounds, only=()):
    """(b); ``only``: these exercises' checks (with their deadlock or loop row, if any) instead of all."""
    chosen = [(label, name, fn) for label, name, fn in cases() if not only or name in only]
    print(machine_info(), f"load before: {load()}")
    rows = {label: [seconds(name, fn, reps) for _ in range(rounds)] for label, name, fn in chosen}
    print(f"| check | cases | median s ({reps} runs), round 1 .. {rounds} | spread between rounds |")
    print("|---|---|---|---|")
    for (label, name, _), values in zip(chosen, rows.values()):
        spread = max(values) - min(values)
        print(f"| {label} | {len(EXERCISES[name].cases)} | {' / '.join(f'{v:.2f}' for v in values)} | {spread:.2f} |")
    print(f"load after: {load()}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="(a): default every labs/*.ipynb")
    parser.add_argument("--exercises", action="store_true", help="(b): the exercises' checks instead of the labs")
    parser.add_argument("--reps", type=int, default=3, help="(b)")
    parser.add_argument("--rounds", type=int, default=2, help="(b)")
    parser.add_argument("--only", default="", help="(b): comma-separated exercise names (default: every exercise)")
    args = parser.parse_args(argv)
    only = {name for name in args.only.split(",") if name}
    if only - set(EXERCISES):
        parser.error(f"--only: unknown exercise(s) {', '.join(sorted(only - set(EXERCISES)))}; use names from "
                     f"`mpkit exercise list`")
    if args.exercises:
        exercises(args.reps, args.rounds, only)
    else:
        labs(args.notebooks)


if __name__ == "__main__":
    main()
