"""Mixed precision and recomputation, measured on one simulated device (issue 33).

Bytes per parameter: the model states of a ``single`` run (parameters and optimizer state between
steps, gradients at their largest; Adam's 4-byte step counters left out) for each precision,
next to ``formulas.PRECISION_RECIPES``, and the largest activations. Recomputation: the largest
activations and the step time of none / selective / full on an 8-block TinyGPT, each the median
over ``--runs`` runs taking turns (``benchmarks/_common/turns.py``) of the median step after the first;
"none again" is the same benchmark twice, the noise floor. Memory tracking is on in every run (it
measures the activations), so the step times include its cost alike.

    python benchmarks/precision.py [--runs 5] [--steps 6]   # about 1 min on 2 cores
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import mpkit
from mpkit.models import ModelConfig, build_model
from mpkit.sim import formulas
from _common.turns import medians_taking_turns

RECIPE = {"fp32": "fp32", "bf16": "autocast", "fp16": "autocast"}


def bytes_per_parameter():
    params = list(build_model(ModelConfig(kind="gpt")).parameters())
    psi, tensors = sum(p.numel() for p in params), len(params)
    print(f"TinyGPT 4 blocks, hidden 64: {psi:,} parameters; batch 32, Adam")
    print(f"{'run':>5} {'param':>6} {'grad':>5} {'optim':>6} {'sum':>5} {'formula':>18} {'activations B':>14}")
    for precision, recipe in RECIPE.items():
        run = mpkit.train("single", model="gpt", steps=3, precision=precision)
        final, peak = run.memory[0].final_by_category, run.memory[0].max_by_category
        p, g, o = final["parameters"] / psi, peak["gradients"] / psi, (final["optimizer"] - 4 * tensors) / psi
        f = formulas.PRECISION_RECIPES[recipe]
        print(f"{precision:>5} {p:>6.2f} {g:>5.2f} {o:>6.2f} {p + g + o:>5.1f} "
              f"{recipe + ' ' + '+'.join(map(str, f)):>18} {peak['activations']:>14,}")


def recompute(runs: int, steps: int):
    kw = dict(model="gpt", layers=8, steps=steps)
    acts = {}

    def measure(label, mode):
        def once():
            run = mpkit.train("single", recompute=mode, **kw)
            acts[label] = run.memory[0].max_by_category["activations"]
            return statistics.median(run.step_times()[1:])
        return once

    modes = {"none": None, "selective": "selective", "full": "full", "none again": None}
    times = medians_taking_turns({label: measure(label, mode) for label, mode in modes.items()}, runs)
    print(f"\nrecompute, TinyGPT 8 blocks, hidden 64, seq 16, batch 32: median of {runs} runs x steps 2..{steps}")
    print(f"{'recompute':>11} {'activations B':>14} {'vs none':>8} {'step ms':>8} {'vs none':>8}")
    for label in modes:
        print(f"{label:>11} {acts[label]:>14,} {acts[label] / acts['none']:>8.2f} {times[label] * 1e3:>8.1f} "
              f"{times[label] / times['none']:>8.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load average", os.getloadavg())
    bytes_per_parameter()
    recompute(args.runs, args.steps)
    print("load average", os.getloadavg())


if __name__ == "__main__":
    main()
