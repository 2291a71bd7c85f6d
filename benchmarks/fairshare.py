"""Where a busy machine's time goes: a fair-share estimate against the cost model's engine.

The cost model's engine (``mpkit.sim.predict``) plays the step's dependencies: compute, then the
messages and collectives that wait for peers. Under load it is too fast (see BENCHMARKS.md, "Cost
model accuracy"). This benchmark tests another explanation: a rank that needs C CPU-seconds per
step, on cores shared among k runnable processes each (k = (ranks + B) / cores, B the busy
processes the calibration counts), gets about 1/k of a core over the step, whatever it waits for
in between, so a step lasts about k·C. It is an estimate, not a bound: a pipeline rank that waits
in a bubble leaves its share to others, and C counts every thread. C here is *measured*, the
difference of a 26-step and a 6-step run: of the whole process (gloo's threads too) and of the
rank's main thread alone (the executor, the loop and compute: one torch thread), so CPU that
gloo's threads spend while a rank waits cannot make the estimate agree by construction.

For each grid configuration of ``benchmarks/costmodel.py`` and each condition (the machine as it
is, then ``--load`` pinned busy loops): the engine's prediction (calibrated under that condition),
the measured step (median step period of the second halves, ``--runs`` run pairs pooled), C of the
busiest rank (process, main thread), Cpred (C predicted without running the step from CPU costs
per operation measured under the same load: ``benchmarks/cpu_tables.py``), k, and the signed
errors of k·C (process), k·C (main thread), the engine, max(engine, k·C), k·Cpred and
max(engine, k·Cpred) against the step, and of Cpred against C; MAPE per condition, for all rows
and the pp rows, at the end.

    python benchmarks/fairshare.py [--runs 2] [--load 2] [--quick]   # about 3-4 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import statistics
import time

from costmodel import both_conditions, grid  # benchmarks/costmodel.py
from cpu_tables import measure_tables, program_cpu  # benchmarks/cpu_tables.py
from machine import load  # benchmarks/machine.py
from mpkit.runtime.launch import launch
from mpkit.sim import predict
from mpkit.sim.calibration import calibrate
from mpkit.strategies import get_strategy, make_config
from mpkit.training import Run

SHORT, LONG = 6, 26  # CPU per step = (CPU of a LONG-step run - that of a SHORT-step run) / (LONG - SHORT)


def _timed_rank(ctx, cfg):
    """The strategy's own rank function, with its CPU seconds beside it: (process, main thread)."""
    process, thread = time.process_time(), time.thread_time()
    out = get_strategy(cfg.strategy).run_rank(ctx, cfg)
    out.extra["cpu_seconds"] = (time.process_time() - process, time.thread_time() - thread)
    return out


def _run(strategy, world, kwargs, steps):
    cfg = make_config(strategy, world, steps=steps, **kwargs)
    result = launch(_timed_rank, world_size=world, args=(cfg,), memory=False)
    return [out.extra["cpu_seconds"] for out in result], Run(cfg, list(result), result).step_periods()


def measure(strategy, world, kwargs, runs):
    """(median steady step period, CPU seconds per step of the busiest rank: (process, main thread))."""
    periods, cpu = [], []
    for _ in range(runs):
        short, _ = _run(strategy, world, kwargs, SHORT)
        long_, steps = _run(strategy, world, kwargs, LONG)
        periods += steps[len(steps) // 2:]
        cpu.append([[(b - a) / (LONG - SHORT) for a, b in zip(before, after)] for before, after in zip(short, long_)])
    per_rank = [[statistics.fmean(run[r][kind] for run in cpu) for r in range(world)] for kind in (0, 1)]
    return statistics.median(periods), (max(per_rank[0]), max(per_rank[1]))


def signed(pred, meas):
    return (pred - meas) / meas * 100


def condition(args) -> dict:
    """{estimate: (MAPE all rows, MAPE pp rows)} under the current load."""
    hw = calibrate(refresh=True, cache_file=None)
    print(f"cpu-sim calibrated: {hw.flops / 1e9:.1f} GFLOP/s, background {hw.background:.1f} busy processes, "
          f"{hw.cores} cores; {load()}")
    tables = measure_tables()
    names = ("k*C", "k*C main", "engine", "max", "k*Cpred", "max pred", "Cpred vs C")
    header = (f"{'config':44s} {'meas ms':>8s} {'C ms':>6s} {'main':>6s} {'Cpred':>6s} {'k':>5s} {'engine':>7s}  "
              + " ".join(f"{n + ' err%':>13s}" for n in names))
    print(header + "\n" + "-" * len(header))
    errors = {n: [] for n in names}
    for strategy, world, model_name, kwargs in grid(args.quick):
        options = " ".join(f"{k}={v}" for k, v in kwargs.items() if k in ("schedule", "micro_batches"))
        engine = predict(strategy, hardware=hw, world_size=world, **kwargs).step_time
        step, (cpu, main_cpu) = measure(strategy, world, kwargs, args.runs)
        cpu_pred = program_cpu(strategy, world, kwargs, hw, tables)
        k = max(1.0, (world + hw.background) / hw.cores)
        row = dict(zip(names, (k * cpu, k * main_cpu, engine, max(engine, k * cpu), k * cpu_pred,
                               max(engine, k * cpu_pred))))
        for name, value in row.items():
            errors[name].append((strategy, signed(value, step)))
        errors["Cpred vs C"].append((strategy, signed(cpu_pred, cpu)))  # the prediction of C itself
        print(f"{f'{strategy} N={world} {model_name} {options}':44s} {step * 1e3:8.2f} {cpu * 1e3:6.2f} "
              f"{main_cpu * 1e3:6.2f} {cpu_pred * 1e3:6.2f} {k:5.2f} {engine * 1e3:7.2f}  "
              + " ".join(f"{errors[n][-1][1]:+13.1f}" for n in names), flush=True)
    summary = {n: (statistics.fmean(abs(e) for _, e in rows), statistics.fmean(abs(e) for s_, e in rows if s_ == "pp"))
               for n, rows in errors.items()}
    below = sum(e < 0 for _, e in errors["k*C"])
    print("MAPE (all rows / pp rows): " + ", ".join(f"{n} {a:.1f}% / {p:.1f}%" for n, (a, p) in summary.items())
          + f"; k*C below the measured step in {below} of {len(errors['k*C'])} rows\n")
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=2, help="run pairs per configuration")
    parser.add_argument("--load", type=int, default=2, help="pinned busy loops in the second condition (0: none)")
    args = parser.parse_args(argv)
    args.load_seconds = 900.0
    started = time.time()
    results = both_conditions(condition, args)
    print("| condition | k·C | k·C main thread | engine | max(engine, k·C) | k·Cpred | max(engine, k·Cpred) "
          "| Cpred vs C |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for condition_name, summary in results.items():
        print(f"| {condition_name} | " + " | ".join(f"{a:.1f}% ({p:.1f}%)" for a, p in summary.values()) + " |")
    print("(MAPE over all rows; pp rows in parentheses)")
    print(f"took {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
