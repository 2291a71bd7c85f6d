"""Pipeline parallel on 4 simulated (CPU/gloo) ranks.

(a) ``mpkit.parallel.pipeline`` (the ``pp`` strategy) 1F1B against ``torch.distributed.pipelining``'s
    ``Schedule1F1B`` on the same model, split and micro-batches; runs take turns (``benchmarks/turns.py``) so machine noise hits both alike; a
    run's step time is the median of its steps after the first, the reported time the median
    over runs. Memory tracking off, trace on (``step_times`` reads it).
(b) the measured bubble against (p-1)/(m+p-1) for m = 1..16 on balanced stages (an mlp of 8
    equal layers, 2 per rank), from the trace: share of rank-time not in forward/backward over
    one step's forward/backward window (``Trace.pipeline_bubble``), median over steps after
    the first. Each layer carries simulated device time (``layer_ms``: 10 ms forward, 20 ms
    backward, slept): four ranks on a 2-core laptop would otherwise share cores exactly when
    the pipeline is full, and the measurement would be the machine's, not the pipeline's.

(c) with ``--schedules``: every schedule (LoopedBFS and the zero-bubble ones included), measured
    bubble next to its lists and formula, step time next to torch's (``benchmarks/pp_schedules.py``).

    python benchmarks/pp.py [--runs 5] [--steps 6] [--schedules]
"""
from __future__ import annotations

import argparse
import os
import statistics
from functools import partial

import mpkit
from mpkit.models import ModelConfig, describe
from mpkit.crosscheck import pipelining as torch_pipelining
from mpkit.strategies import make_config
from turns import medians_taking_turns  # benchmarks/turns.py

WORLD = 4
VERSUS_TORCH = dict(model="gpt", hidden=128, layers=4, seq_len=32, batch_size=32, micro_batches=8)
BALANCED = dict(model="mlp", layers=8, hidden=64, d_in=64, classes=8, batch_size=64, layer_ms=10.0)
BUBBLE_MS = (1, 2, 4, 8, 16)


def step_times(trace, steps) -> list[float]:
    """Per step: first to last event of that step on any rank (as ``Run.step_times``)."""
    out = []
    for step in range(steps):
        events = [e for e in trace.events if e.step == step]
        out.append(max(e.end for e in events) - min(e.start for e in events))
    return out


def ours(steps, **kwargs) -> float:
    run = mpkit.train("pp", WORLD, steps=steps, schedule="1f1b", memory=False, **kwargs)
    return statistics.median(run.step_times()[1:])


def torch_1f1b(steps, **kwargs) -> float:
    cfg = make_config("pp", WORLD, steps=steps, schedule="1f1b", **kwargs)
    result = mpkit.launch(torch_pipelining.run_rank, WORLD, args=(cfg,), timeout=120, memory=False)
    return statistics.median(step_times(result.trace, steps)[1:])


def versus_torch(runs, steps) -> dict:
    times = medians_taking_turns({"ours": partial(ours, steps, **VERSUS_TORCH),
                                  "torch": partial(torch_1f1b, steps, **VERSUS_TORCH)}, runs)
    a, b = times["ours"], times["torch"]
    return {"benchmark": f"pp 1f1b vs torch Schedule1F1B, m={VERSUS_TORCH['micro_batches']}",
            "ours_ms": a * 1e3, "baseline_ms": b * 1e3, "ratio": a / b, "target": "<= 1.05"}


def bubble_rows(steps, schedule="1f1b") -> list[dict]:
    out = []
    for m in BUBBLE_MS:
        run = mpkit.train("pp", WORLD, steps=steps, schedule=schedule, micro_batches=m, memory=False, **BALANCED)
        measured = statistics.median(run.trace.pipeline_bubble(s) for s in range(1, steps))
        formula = (WORLD - 1) / (m + WORLD - 1)
        out.append({"schedule": schedule, "m": m, "measured": measured, "formula": formula,
                    "diff_points": (measured - formula) * 100,
                    "step_ms": statistics.median(run.step_times()[1:]) * 1e3})
    return out


def rows(runs: int = 5, steps: int = 6) -> list[dict]:
    return [versus_torch(runs, steps)] + bubble_rows(steps)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--schedules", action="store_true", help="run (c) only: every schedule against torch's")
    args = parser.parse_args(argv)
    if args.schedules:
        import pp_schedules  # benchmarks/pp_schedules.py
        return pp_schedules.main(["--runs", str(args.runs), "--steps", str(args.steps)])
    cores = len(os.sched_getaffinity(0))
    sizes = {k: v for k, v in VERSUS_TORCH.items() if k not in ("model", "batch_size", "micro_batches")}
    print(f"{WORLD} ranks on {cores} CPU cores; (b) sleeps its simulated device time, so it holds on fewer cores too")
    print(f"(a) {describe(ModelConfig(kind='gpt', **sizes))}, batch {VERSUS_TORCH['batch_size']}; "
          f"median over {args.runs} alternating runs of the median of steps 2..{args.steps}")
    a = versus_torch(args.runs, args.steps)
    print(f"{'benchmark':<42} {'ours ms':>9} {'baseline ms':>12} {'ratio':>7}  target")
    print(f"{a['benchmark']:<42} {a['ours_ms']:>9.1f} {a['baseline_ms']:>12.1f} {a['ratio']:>7.3f}  {a['target']}")
    sizes = {k: v for k, v in BALANCED.items() if k not in ("model", "batch_size")}
    print(f"\n(b) bubble, 1f1b, p={WORLD}, {describe(ModelConfig(kind='mlp', **sizes))} + {BALANCED['layer_ms']:g} ms "
          f"simulated device time per layer forward (2x backward), batch {BALANCED['batch_size']}; "
          f"median over steps 2..{args.steps}; target |diff| <= 5 points")
    print(f"{'m':>3} {'measured':>9} {'(p-1)/(m+p-1)':>14} {'diff (points)':>14} {'step ms':>9}")
    for r in bubble_rows(args.steps):
        print(f"{r['m']:>3} {r['measured']:>9.1%} {r['formula']:>14.1%} {r['diff_points']:>+14.1f} "
              f"{r['step_ms']:>9.1f}")


if __name__ == "__main__":
    main()
