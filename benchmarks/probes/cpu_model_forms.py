"""Which form of the CPU model predicts a rank's CPU per step best? Several, on the same data.

``mpkit.costmodel.cpu`` predicts the CPU seconds a rank spends per step from its program; the
calibration fits the coefficients to real multi-rank runs. Here each candidate form is fitted to
the *same* calibration runs (``mpkit.costmodel.calibration._CPU_RUNS``, measured once) and judged on the
*same* measurements of the ``benchmarks/costmodel.py`` grid, so forms are compared side by side
rather than across runs of a noisy machine:

- ``one compute``: one coefficient for all priced compute;
- ``micro-batch apart`` (what ``mpkit.costmodel.cpu`` uses): a pipeline's compute, one micro-batch at a
  time between messages, has its own coefficient;
- ``by kind``: as ``micro-batch apart``, with ring steps and bytes of all-reduce, reduce-scatter
  and all-gather apart;
- ``reduce-scatter as a half``: as ``micro-batch apart``, counting a reduce-scatter as half an
  all-reduce (n-1 ring steps), as NCCL runs it; gloo all-reduces the whole tensor instead, which
  ``mpkit.costmodel.cpu.ring_steps`` counts (the form up to calibration method version 10).

For each: the model's C of the busiest rank against the measured one, and the step ``predict``
would return with it (``fair_share_play``: each rank's instructions lengthened so its CPU at its
fair share fills its busy part, the step played again) against the measured step; beside them the same step from the
measured C of every rank, the best any CPU model could do with the fair share. Both conditions (as is, ``--load`` pinned busy loops).

    python benchmarks/probes/cpu_model_forms.py [--runs 2] [--load 2]   # about 4 minutes on 2 cores
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: costmodel.py, _common/
from costmodel import both_conditions, calibrate_now, condition_args, grid, pct  # noqa: E402 (benchmarks/costmodel.py)
from fairshare import measure, shared_step  # noqa: E402 (benchmarks/probes/fairshare.py)
from mpkit.costmodel import calibration
from mpkit.costmodel.cpu import TERMS, fit, program_terms, ring_steps
from mpkit.simulator.engine import Collective
from mpkit.costmodel.prediction import predict, programs_for

KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def one_compute(program):
    terms = program_terms(program)
    return np.concatenate(([terms[0] + terms[1]], terms[2:]))


def by_kind(program):
    terms, kinds = program_terms(program), np.zeros(2 * len(KINDS))
    for ins in program:
        if isinstance(ins, Collective) and len(ins.group) > 1:
            j, steps = KINDS.index(ins.kind), ring_steps(ins.kind, len(ins.group))
            kinds[2 * j:2 * j + 2] += (steps, steps * ins.nbytes / len(ins.group))
    return np.concatenate((terms[:2], kinds, terms[4:]))


def reduce_scatter_as_half(program):
    terms = program_terms(program)
    for ins in program:
        if isinstance(ins, Collective) and ins.kind == "reduce_scatter" and len(ins.group) > 1:
            n = len(ins.group)
            terms[2:4] -= (n - 1, (n - 1) * ins.nbytes / n)
    return terms


FORMS = {  # name: (terms of a program, their names)
    "one compute": (one_compute, ("compute",) + TERMS[2:]),
    "micro-batch apart": (program_terms, TERMS),
    "by kind": (by_kind, TERMS[:2] + tuple(f"{k}_{t}" for k in KINDS for t in ("step", "byte")) + TERMS[4:]),
    "reduce-scatter as a half": (reduce_scatter_as_half, TERMS),
}


def condition(args) -> dict:
    hw = calibrate_now()
    samples = {name: [] for name in FORMS}
    for model, strategy, world, options in calibration._CPU_RUNS:
        kwargs = {**model, **options}
        measured, _, _ = calibration.cpu_per_step(strategy, world, kwargs)
        for name, (terms_of, _) in FORMS.items():
            samples[name] += [(terms_of(p), c) for p, c in zip(programs_for(hw, strategy, world, kwargs), measured)]
    coefficients = {name: fit(samples[name], names) for name, (_, names) in FORMS.items()}
    for name, coef in coefficients.items():
        print(f"  {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in coef.items()))
    errors = {key: [] for key in ["ceiling", *(f"{n} {m}" for n in FORMS for m in ("C", "step"))]}
    for strategy, world, model_name, kwargs in grid(False):
        pred = predict(strategy, hardware=hw, world_size=world, **kwargs)
        step, (ranks_cpu, _) = measure(strategy, world, kwargs, args.runs)
        errors["ceiling"].append((strategy, pct(shared_step(pred, ranks_cpu, hw), step)))
        line = (f"{strategy} N={world} {model_name} {kwargs.get('schedule', '')}: step {step * 1e3:.2f} ms, "
                f"C {max(ranks_cpu) * 1e3:.2f}")
        programs = programs_for(hw, strategy, world, kwargs)
        for name, (terms_of, names) in FORMS.items():
            weights = np.array([coefficients[name][t] for t in names])
            model_cpu = [float(terms_of(p) @ weights) for p in programs]
            errors[f"{name} C"].append((strategy, pct(max(model_cpu), max(ranks_cpu))))
            errors[f"{name} step"].append((strategy, pct(shared_step(pred, model_cpu, hw), step)))
            line += f" | {name}: C {max(model_cpu) * 1e3:.2f}, step {errors[f'{name} step'][-1][1]:.0f}%"
        print(line, flush=True)
    summary = {key: (statistics.fmean(e for _, e in rows), statistics.fmean(e for s, e in rows if s == "pp"))
               for key, rows in errors.items()}
    print("MAPE (all rows / pp rows): " + ", ".join(f"{k} {a:.1f}% / {p:.1f}%" for k, (a, p) in summary.items()) + "\n")
    return summary


def main(argv=None):
    args = condition_args(__doc__, argv)
    started = time.time()
    results = both_conditions(condition, args)
    forms = list(FORMS)
    print("| condition | from measured C | " + " | ".join(f"{n}: step (model C)" for n in forms)
          + " |\n|---|---:|" + "---:|" * len(forms))
    for name, summary in results.items():
        print(f"| {name} | {summary['ceiling'][0]:.1f}% | " + " | ".join(
            f"{summary[f'{n} step'][0]:.1f}% (pp {summary[f'{n} step'][1]:.1f}%) ({summary[f'{n} C'][0]:.1f}%)"
            for n in forms) + " |")
    print(f"took {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
