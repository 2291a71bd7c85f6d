"""GPU check: the NCCL path of mpkit on a real GPU machine, in one short run (under 3 minutes).

1. world 1 on NCCL: a rank gets ``cuda:0``, a collective runs, the result comes back;
2. every strategy that fits the GPUs here (world 1 on one GPU; also world 2 or 4 with as many GPUs),
   each compared with the ``single`` run: max |difference| of losses and parameters;
3. bandwidth: the device's own copy bandwidth (device to device, and host <-> device pinned), and
   what an all-reduce achieves through ``torch.distributed`` and through ``ctx.comm`` (the path the
   strategies take), side by side; plus the time ``ctx.comm``'s trace event recorded for it (NCCL
   returns before the GPU has finished, so a trace that reads the host clock can under-count).

Without a CUDA GPU it says so and exits with status 1. ``--cpu-rehearsal`` runs the same steps
with gloo on CPU processes (small sizes), so the script itself is tested where there is no GPU.

The parent process never initialises CUDA (ranks are forked and must initialise it themselves):
every measurement runs inside ``mpkit.launch``.

    python benchmarks/gpu_check.py [--cpu-rehearsal] [--budget 170]
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, not installed
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common/turns.py, also when loaded by path

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import mpkit  # noqa: E402
from mpkit.runtime.devices import cuda_count  # noqa: E402
from _common.machine import load  # noqa: E402
from _common.turns import medians_taking_turns  # noqa: E402
from mpkit.cli.tour import strategy_options  # noqa: E402  (the tour's grid for 3d, pp's micro-batches)
from mpkit.strategies import SEQUENCE_STRATEGIES, STRATEGIES, make_config  # noqa: E402

TOLERANCE = 1e-4  # loss/parameter difference from single; float32 reduction order gives ~1e-7
NO_GPU = ("gpu_check: no CUDA GPU is visible here (torch {torch}, CUDA build: {built}), so the NCCL path "
          "cannot be checked on this machine. Run it on a machine with a GPU; --cpu-rehearsal runs the "
          "same steps on CPU processes with gloo.")


class Plan:
    """What to run where: the real check on GPUs, or the small CPU rehearsal."""

    def __init__(self, rehearsal: bool, gpus: int):
        self.rehearsal = rehearsal
        self.backend = "gloo" if rehearsal else "nccl"
        self.worlds = [1] + ([4] if gpus >= 4 else [2] if gpus >= 2 else [])
        if rehearsal:
            self.worlds = [1, 2]
        self.sizes = [2**20, 2**23] if rehearsal else [2**20, 2**26, 2**30]
        self.reps = 3 if rehearsal else 20
        self.rounds = 5  # raw and ctx.comm all-reduce take turns this many times (see benchmarks/_common/turns.py)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(fn, device, reps) -> float:
    """Mean seconds per call, device work included; all ranks start together."""
    fn()
    fn()
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / reps


def _identity(ctx):
    t = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(t)
    return {"device": str(ctx.device), "backend": ctx.backend, "sum": t[0].item(),
            "name": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "CPU"}


def _bandwidth(ctx, sizes, reps, rounds):
    """Per size: copy, raw all_reduce, ctx.comm all_reduce (measured side by side) and its trace event."""
    rows = []
    for size in sizes:
        src = torch.zeros(size // 4, device=ctx.device)  # zeros: repeated sums stay finite
        dst = torch.empty_like(src)
        copy = _seconds(lambda: dst.copy_(src), ctx.device, reps)
        before = len(ctx.trace.events)
        times = medians_taking_turns({"raw": lambda: _seconds(lambda: dist.all_reduce(src), ctx.device, reps),
                                      "comm": lambda: _seconds(lambda: ctx.comm.all_reduce(src), ctx.device, reps)},
                                     rounds)
        events = [e for e in ctx.trace.events[before:] if e.kind == "all_reduce"][2:]  # after the first warm-ups
        rows.append({"bytes": size, "copy": copy, "raw": times["raw"], "comm": times["comm"],
                     "trace": statistics.mean(e.end - e.start for e in events)})
        del src, dst
    host = {}
    if ctx.device.type == "cuda":
        size = sizes[-1]
        pinned = torch.zeros(size // 4, pin_memory=True)
        on_device = torch.empty(size // 4, device=ctx.device)
        host["h2d"] = size / _seconds(lambda: on_device.copy_(pinned, non_blocking=True), ctx.device, reps)
        host["d2h"] = size / _seconds(lambda: pinned.copy_(on_device, non_blocking=True), ctx.device, reps)
    return {"rows": rows, "host": host}


def gbps(n_bytes, seconds) -> float:
    return n_bytes / seconds / 1e9 if seconds > 0 else float("inf")


class Check:
    def __init__(self, budget):
        self.deadline = time.monotonic() + budget
        self.failures = []

    def over_budget(self, what) -> bool:
        if time.monotonic() > self.deadline:
            print(f"  {what}: not run, over the time budget")
            self.failures.append(f"{what}: over budget")
            return True
        return False

    def fail(self, what, why):
        self.failures.append(f"{what}: {why}")


def check_world_one(plan, check):
    print("\n## world 1")
    out = mpkit.launch(_identity, 1, backend=plan.backend, timeout=120)[0]
    ok = out["sum"] == 1.0 and out["backend"] == plan.backend and (plan.backend == "gloo") == (out["device"] == "cpu")
    print(f"  rank 0 on {out['device']} ({out['name']}), backend {out['backend']}, all_reduce -> {out['sum']:g}: "
          f"{'ok' if ok else 'WRONG'}")
    if not ok:
        check.fail("world 1", str(out))


def check_strategies(plan, check):
    print(f"\n## strategies vs single (tolerance {TOLERANCE:g})\n")
    print("| strategy | ranks | result | max abs diff loss | params | peak MiB (rank 0) | seconds |\n"
          "|---|---:|---|---:|---:|---:|---:|")
    reference = mpkit.train("single", world_size=1, backend=plan.backend, timeout=120)
    for world in plan.worlds:
        for strategy in STRATEGIES:
            if strategy == "single" and world > 1:
                continue
            what = f"{strategy} x{world}"
            if check.over_budget(what):
                continue
            try:
                options = strategy_options(strategy, world)
                if strategy in SEQUENCE_STRATEGIES:  # the gpt by default; SGD, since Adam's lr·m/sqrt(v) turns
                    options["optimizer"] = "sgd"     # float32 noise on a near-zero gradient into a lr-sized step
                make_config(strategy, world, **options)
            except ValueError as exc:
                print(f"| {strategy} | {world} | does not apply: {exc} | | | | |")
                continue
            start = time.perf_counter()
            try:
                run = mpkit.train(strategy, world_size=world, backend=plan.backend, timeout=120, **options)
                # the shared single run when the model is the same; else one with this run's settings
                diff = run.compare_to_reference(reference if strategy not in SEQUENCE_STRATEGIES else None)
            except Exception as exc:  # noqa: BLE001 - one failing strategy must not hide the others
                print(f"| {strategy} | {world} | FAILED: {' '.join(str(exc).split())[:160]} | | | | |")
                check.fail(what, str(exc).splitlines()[0])
                continue
            ok = diff.max <= TOLERANCE
            memory = run.memory[0]
            peak = memory.cuda_max_allocated if memory.cuda_max_allocated is not None else memory.peak_total
            print(f"| {strategy} | {world} | {'ok' if ok else 'DIFFERS'} | {diff.loss:.1e} | {diff.params:.1e} | "
                  f"{peak / 2**20:.2f} | {time.perf_counter() - start:.1f} |")
            if not ok:
                check.fail(what, str(diff))


def check_bandwidth(plan, check):
    world = plan.worlds[-1]
    print(f"\n## bandwidth, {world} rank(s), mean of {plan.reps} after 2 warm-ups; all_reduce raw and via ctx.comm: "
          f"median of {plan.rounds} such means, taking turns (GB/s = 1e9 bytes/s)\n")
    if check.over_budget("bandwidth"):
        return
    out = mpkit.launch(_bandwidth, world, args=(plan.sizes, plan.reps, plan.rounds), backend=plan.backend, timeout=150)[0]
    factor = 2 * (world - 1) / world  # nccl-tests bus bandwidth for all-reduce
    print("| size MiB | device copy GB/s (read+write) | all_reduce algbw GB/s | busbw | via ctx.comm algbw | "
          "ctx.comm / raw | trace event / measured |\n|---:|---:|---:|---:|---:|---:|---:|")
    for row in out["rows"]:
        size = row["bytes"]
        print(f"| {size / 2**20:g} | {gbps(2 * size, row['copy']):.1f} | {gbps(size, row['raw']):.1f} | "
              f"{gbps(size, row['raw']) * factor:.1f} | {gbps(size, row['comm']):.1f} | "
              f"{row['comm'] / row['raw']:.2f} | {row['trace'] / row['comm']:.2f} |")
    if out["host"]:
        print(f"\nhost <-> device, pinned, {plan.sizes[-1] / 2**20:g} MiB: host to device "
              f"{out['host']['h2d'] / 1e9:.1f} GB/s, device to host {out['host']['d2h'] / 1e9:.1f} GB/s")
    largest = out["rows"][-1]
    if largest["trace"] < 0.5 * largest["comm"]:
        print(f"\nnote: ctx.comm's trace event covers {largest['trace'] / largest['comm']:.0%} of the measured "
              f"all-reduce: it times the host call, and {plan.backend} returns before the device has finished, "
              f"so timelines and comm share under-count communication on this backend.")
    if largest["comm"] > 1.5 * largest["raw"]:
        why = f"ctx.comm all_reduce is {largest['comm'] / largest['raw']:.1f}x slower than raw"
        if plan.rehearsal:  # gloo on a shared CPU: ratios of a few ms scatter past 1.5x (seen 0.9-1.5x at 8 MiB)
            print(f"\nnote: {why}; on CPU processes that is noise, not a failure (the GPU run checks it)")
        else:
            check.fail("bandwidth", why)
    if world == 1:
        print("\n(one rank: NCCL's all-reduce has no peer, so it moves nothing over a link; busbw is 0 by "
              "definition. The copy column is the ceiling any on-device collective step can reach.)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-rehearsal", action="store_true",
                        help="run the same steps with gloo on CPU processes (no GPU needed)")
    parser.add_argument("--budget", type=float, default=170.0, help="seconds before remaining steps are skipped")
    opts = parser.parse_args(argv)
    gpus = cuda_count()
    if not gpus and not opts.cpu_rehearsal:
        print(NO_GPU.format(torch=torch.__version__, built="yes" if torch.backends.cuda.is_built() else "no"),
              file=sys.stderr)
        return 1
    plan = Plan(opts.cpu_rehearsal, gpus)
    start = time.monotonic()
    print(f"# mpkit gpu_check{' (CPU rehearsal, gloo)' if opts.cpu_rehearsal else ''}\n{mpkit.devices()}; "
          f"torch {torch.__version__} (CUDA {torch.version.cuda}), Python {platform.python_version()}, "
          f"{os.cpu_count()} CPU cores; {datetime.datetime.now():%Y-%m-%d %H:%M}; "
          f"{load()}")
    check = Check(opts.budget)
    for step in (check_world_one, check_strategies, check_bandwidth):
        try:
            step(plan, check)
        except Exception as exc:  # noqa: BLE001 - report, go on with the next step
            print(f"  {step.__name__} FAILED: {' '.join(str(exc).split())[:300]}")
            check.fail(step.__name__, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    verdict = "all checks passed" if not check.failures else f"{len(check.failures)} FAILED: " + "; ".join(check.failures)
    print(f"\n{verdict} ({time.monotonic() - start:.0f} s)")
    return 0 if not check.failures else 1


if __name__ == "__main__":
    sys.exit(main())
