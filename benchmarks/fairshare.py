"""Where a busy machine's time goes: the processor-sharing bound against the cost model's engine.

The cost model's engine (``mpkit.sim.predict``) plays the step's dependencies: compute, then the
messages and collectives that wait for peers. Under load it is too fast (see BENCHMARKS.md, "Cost
model accuracy"). This benchmark tests another explanation: a rank that needs C CPU-seconds per
step, on cores it shares with k-1 other runnable processes each (k = (ranks + busy loops) / cores),
gets at most 1/k of a core over the step, whatever it waits for in between, so a step lasts at
least k·C. C here is *measured*: the rank's process CPU time (every thread) over 20 steps, the
difference of a 26-step and a 6-step run. If k·C (the bound with the real CPU time) tracks the
measured step where the engine does not, the model's gap is the CPU a rank spends outside the
compute it prices (the executor, gloo, the loop) stretched by the scheduler's fair share, not the
wake-up latency of single messages.

For each grid configuration of ``benchmarks/costmodel.py`` and each condition (the machine as it
is, then ``--load`` pinned busy loops): the engine's prediction (calibrated under that condition),
the measured step (median step period of the second halves, ``--runs`` runs pooled), the CPU per
rank per step (max over ranks, mean over runs), k, the bound k·C, and both errors; MAPE per
condition at the end.

    python benchmarks/fairshare.py [--runs 2] [--load 2] [--quick]   # about 3-4 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import statistics
import time

from costmodel import both_conditions, grid, pct  # benchmarks/costmodel.py
from machine import load  # benchmarks/machine.py
from mpkit.runtime.launch import launch
from mpkit.sim import predict
from mpkit.sim.calibration import calibrate
from mpkit.strategies import get_strategy, make_config
from mpkit.training import Run

SHORT, LONG = 6, 26  # CPU per step = (CPU of a LONG-step run - that of a SHORT-step run) / (LONG - SHORT)


def _timed_rank(ctx, cfg):
    """The strategy's own rank function, with the process's CPU seconds (all threads) beside it."""
    start = time.process_time()
    out = get_strategy(cfg.strategy).run_rank(ctx, cfg)
    out.extra["cpu_seconds"] = time.process_time() - start
    return out


def _run(strategy, world, kwargs, steps):
    cfg = make_config(strategy, world, steps=steps, **kwargs)
    result = launch(_timed_rank, world_size=world, args=(cfg,), memory=False)
    return [out.extra["cpu_seconds"] for out in result], Run(cfg, list(result), result).step_periods()


def measure(strategy, world, kwargs, runs):
    """(median steady step period, max over ranks of the mean CPU seconds per step)."""
    periods, cpu = [], []
    for _ in range(runs):
        short, _ = _run(strategy, world, kwargs, SHORT)
        long_, steps = _run(strategy, world, kwargs, LONG)
        periods += steps[len(steps) // 2:]
        cpu.append([(b - a) / (LONG - SHORT) for a, b in zip(short, long_)])
    per_rank = [statistics.fmean(run[r] for run in cpu) for r in range(world)]
    return statistics.median(periods), max(per_rank)


def condition(args) -> tuple[float, float]:
    hw = calibrate(refresh=True, cache_file=None)
    print(f"cpu-sim calibrated: {hw.flops / 1e9:.1f} GFLOP/s, background {hw.background:.1f} busy processes, "
          f"{hw.cores} cores; {load()}")
    header = (f"{'config':40s} {'meas ms':>8s} {'CPU ms':>7s} {'k':>5s} {'k*CPU':>7s} {'err%':>6s} "
              f"{'engine':>7s} {'err%':>6s}")
    print(header + "\n" + "-" * len(header))
    bound_errors, engine_errors = [], []
    for strategy, world, model_name, kwargs in grid(args.quick):
        options = " ".join(f"{k}={v}" for k, v in kwargs.items() if k in ("schedule", "micro_batches"))
        engine = predict(strategy, hardware=hw, world_size=world, **kwargs).step_time
        step, cpu = measure(strategy, world, kwargs, args.runs)
        k = max(1.0, (world + hw.background) / hw.cores)
        bound_errors.append(pct(k * cpu, step))
        engine_errors.append(pct(engine, step))
        print(f"{f'{strategy} N={world} {model_name} {options}':40s} {step * 1e3:8.2f} {cpu * 1e3:7.2f} {k:5.2f} "
              f"{k * cpu * 1e3:7.2f} {bound_errors[-1]:6.1f} {engine * 1e3:7.2f} {engine_errors[-1]:6.1f}", flush=True)
    mean_bound, mean_engine = statistics.fmean(bound_errors), statistics.fmean(engine_errors)
    print(f"MAPE: k*CPU {mean_bound:.1f}%, engine {mean_engine:.1f}% over {len(bound_errors)} configurations\n")
    return mean_bound, mean_engine


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=2, help="run pairs per configuration")
    parser.add_argument("--load", type=int, default=2, help="pinned busy loops in the second condition (0: none)")
    args = parser.parse_args(argv)
    args.load_seconds = 900.0
    started = time.time()
    results = both_conditions(condition, args)
    print("| condition | MAPE k*CPU (measured CPU) | MAPE engine |\n|---|---:|---:|")
    for name, (bound, engine) in results.items():
        print(f"| {name} | {bound:.1f}% | {engine:.1f}% |")
    print(f"took {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
