"""Data parallel step times on 4 simulated (CPU/gloo) ranks.

(a) ``mpkit.parallel.DataParallel`` (the ``dp`` strategy: bucketed, overlapped) against torch
    ``DistributedDataParallel`` with the same bucket size, on the same model and data; (b) ``dp`` with overlap on against off, on a model
    cut into many buckets. Runs of the compared variants take turns (``benchmarks/_common/turns.py``), so
    machine noise hits both alike; a run's step time is the median of its steps after the first (warm-up, and DDP's
    bucket rebuild), the reported time the median over runs. Memory tracking is off (its
    per-op dispatch would dominate); the trace is on, it is what ``Run.step_times`` reads.

    python benchmarks/dp.py [--runs 5] [--steps 6]
"""
from __future__ import annotations

import argparse
import statistics
from functools import partial

import mpkit
from _common.turns import medians_taking_turns

WORLD = 4
MODEL = dict(model="gpt", hidden=128, layers=4, seq_len=32, batch_size=32)
# (a): bucket sizes for both; 25 MiB (DDP's default) is one bucket for this 3.2 MB model.
VERSUS_DDP = [25.0, 1.0]
OVERLAP_BUCKET_MB = 0.25  # (b): ~13 buckets


def step_time(strategy, steps, **options) -> float:
    run = mpkit.train(strategy, world_size=WORLD, steps=steps, memory=False, **MODEL, **options)
    return statistics.median(run.step_times()[1:])


def compare(variants: dict[str, dict], runs: int, steps: int) -> dict[str, float]:
    """{label: median step time} over ``runs`` runs of each variant, taking turns."""
    return medians_taking_turns({label: partial(step_time, strategy, steps, **options)
                                 for label, (strategy, options) in variants.items()}, runs)


def rows(runs: int = 5, steps: int = 6) -> list[dict]:
    out = []
    for mb in VERSUS_DDP:
        t = compare({"dp": ("dp", {"bucket_mb": mb, "overlap": True}), "ddp": ("ddp", {"bucket_mb": mb})},
                    runs, steps)
        out.append({"benchmark": f"dp(overlap) vs DDP, bucket_mb={mb:g}", "ours_ms": t["dp"] * 1e3,
                    "baseline_ms": t["ddp"] * 1e3, "ratio": t["dp"] / t["ddp"], "target": "<= 1.05"})
    t = compare({"on": ("dp", {"bucket_mb": OVERLAP_BUCKET_MB, "overlap": True}),
                 "off": ("dp", {"bucket_mb": OVERLAP_BUCKET_MB, "overlap": False})}, runs, steps)
    out.append({"benchmark": f"dp overlap on vs off, bucket_mb={OVERLAP_BUCKET_MB:g}", "ours_ms": t["on"] * 1e3,
                "baseline_ms": t["off"] * 1e3, "ratio": t["on"] / t["off"], "target": "< 1 (speedup "
                f"{t['off'] / t['on']:.2f}x)"})
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    from mpkit.models import ModelConfig, describe

    sizes = {k: v for k, v in MODEL.items() if k not in ("model", "batch_size")}
    print(f"{WORLD} ranks, {describe(ModelConfig(kind='gpt', **sizes))}, batch {MODEL['batch_size']}; "
          f"median over {args.runs} runs of the median of steps 2..{args.steps}")
    table = rows(args.runs, args.steps)
    print(f"{'benchmark':<42} {'ours ms':>9} {'baseline ms':>12} {'ratio':>7}  target")
    for r in table:
        print(f"{r['benchmark']:<42} {r['ours_ms']:>9.1f} {r['baseline_ms']:>12.1f} {r['ratio']:>7.3f}  {r['target']}")


if __name__ == "__main__":
    main()
