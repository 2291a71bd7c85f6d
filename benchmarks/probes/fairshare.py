"""Where a busy machine's time goes: the fair-share estimate, with measured and with modelled CPU.

``mpkit.sim.predict`` plays the step's dependencies (the engine), then takes the fair share of the
cores (``mpkit.costmodel.prediction.fair_share_play``): a rank that needs C CPU-seconds per step gets,
while busy, 1/k of a core (k runnable processes per core: the ranks busy at once and the B busy
processes the calibration counts), so its busy part of the step lasts at least k·C; each rank's
instructions are lengthened to that and the step played again, so the ranks that wait for it
wait longer; C comes from the CPU model the calibration fitted. This
benchmark takes the parts apart. C is *measured* here, steps 6-15 of a 16-step run
(``mpkit.costmodel.calibration.cpu_per_step``): of the whole process (gloo's threads too) and of the
rank's main thread alone (the executor, the loop and compute: one torch thread), and compared with
the model's C, so it shows whether a miss is the fair-share idea's or the CPU model's.

For each grid configuration of ``benchmarks/costmodel.py`` and each condition (the machine as it
is, then ``--load`` pinned busy loops): the engine's step and predict's (calibrated under that
condition), the measured step (median step period of the second halves, ``--runs`` runs
pooled), C of the busiest rank (process, main thread) and the model's C, k, and the signed errors
of k·C of the busiest rank (process; main thread), the engine, max(engine, k·C) (the form predict
used before the replay, k from all ranks), the step replayed with each rank's measured C, predict,
predict without the calibration's wake-up waits (``Hardware.wake_wait``), and of the model's C
against C; MAPE per condition, for all rows and the pp rows, at the end.

    python benchmarks/probes/fairshare.py [--runs 2] [--load 2] [--quick]   # about 3 minutes on 2 cores
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: costmodel.py, _common/
from costmodel import both_conditions, calibrate_now, condition_args, grid  # noqa: E402 (benchmarks/costmodel.py)
from mpkit.sim import predict
from mpkit.costmodel.calibration import cpu_per_step
from mpkit.costmodel.prediction import fair_share_play


def measure(strategy, world, kwargs, runs):
    """(median steady step period, CPU seconds per step of each rank: (process, main thread), each
    the mean over ``runs`` runs)."""
    periods, process, thread = [], [], []
    for _ in range(runs):
        whole, main, run = cpu_per_step(strategy, world, kwargs)
        steps = run.step_periods()
        periods += steps[len(steps) // 2:]
        process.append(whole)
        thread.append(main)
    per_rank = [[statistics.fmean(run[r] for run in kind) for r in range(world)] for kind in (process, thread)]
    return statistics.median(periods), tuple(per_rank)


def shared_step(pred, cpu, hw) -> float:
    """The step ``predict`` would give with ``cpu`` (CPU seconds per rank) in place of its model's."""
    start, end = fair_share_play(pred.programs, cpu, hw)[0].window()
    return end - start


def signed(pred, meas):
    return (pred - meas) / meas * 100


def condition(args) -> dict:
    """{estimate: (MAPE all rows, MAPE pp rows)} under the current load."""
    hw = calibrate_now()
    names = ("k*C", "k*C main", "engine", "max(engine,k*C)", "replayed", "predict", "no wake-ups", "model C vs C")
    header = (f"{'config':44s} {'meas ms':>8s} {'C ms':>6s} {'main':>6s} {'model':>6s} {'k':>5s} {'engine':>7s} "
              f"{'predict':>7s}  " + " ".join(f"{n + ' err%':>15s}" for n in names))
    print(header + "\n" + "-" * len(header))
    errors = {n: [] for n in names}
    for strategy, world, model_name, kwargs in grid(args.quick):
        options = " ".join(f"{k}={v}" for k, v in kwargs.items() if k in ("schedule", "micro_batches"))
        pred = predict(strategy, hardware=hw, world_size=world, **kwargs)
        step, (ranks_cpu, ranks_main) = measure(strategy, world, kwargs, args.runs)
        cpu, main_cpu, model_cpu = max(ranks_cpu), max(ranks_main), max(pred.cpu_seconds)
        k = hw.sharing(world)
        unwoken = predict(strategy, hardware=replace(hw, wake_max=0.0), world_size=world, **kwargs)
        row = dict(zip(names, (k * cpu, k * main_cpu, pred.played_time, max(pred.played_time, k * cpu),
                               shared_step(pred, ranks_cpu, hw), pred.step_time, unwoken.step_time)))
        for name, value in row.items():
            errors[name].append((strategy, signed(value, step)))
        errors["model C vs C"].append((strategy, signed(model_cpu, cpu)))
        print(f"{f'{strategy} N={world} {model_name} {options}':44s} {step * 1e3:8.2f} {cpu * 1e3:6.2f} "
              f"{main_cpu * 1e3:6.2f} {model_cpu * 1e3:6.2f} {k:5.2f} {pred.played_time * 1e3:7.2f} "
              f"{pred.step_time * 1e3:7.2f}  " + " ".join(f"{errors[n][-1][1]:+15.1f}" for n in names), flush=True)
    summary = {n: (statistics.fmean(abs(e) for _, e in rows), statistics.fmean(abs(e) for s_, e in rows if s_ == "pp"))
               for n, rows in errors.items()}
    below = sum(e < 0 for _, e in errors["k*C"])
    print("MAPE (all rows / pp rows): " + ", ".join(f"{n} {a:.1f}% / {p:.1f}%" for n, (a, p) in summary.items())
          + f"; k*C below the measured step in {below} of {len(errors['k*C'])} rows\n")
    return summary


def main(argv=None):
    args = condition_args(__doc__, argv, quick=True)
    started = time.time()
    results = both_conditions(condition, args)
    print("| condition | k·C | k·C main thread | engine | max(engine, k·C) | step replayed with measured C "
          "| predict (the same with model C) | predict without wake-ups | model C vs C |"
          "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for condition_name, summary in results.items():
        print(f"| {condition_name} | " + " | ".join(f"{a:.1f}% ({p:.1f}%)" for a, p in summary.values()) + " |")
    print("(MAPE over all rows; pp rows in parentheses)")
    print(f"took {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
