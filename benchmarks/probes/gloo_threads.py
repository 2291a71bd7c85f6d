"""Which threads of a rank spend its CPU, and how gloo's share changes with the time between messages.

The cost model's CPU model (``mpkit.costmodel.cpu``) charges a fixed CPU cost per message; this shows
why such a constant misses: gloo's tcp loop thread (``gloo_tcp_loop``), which moves every message,
spends far more CPU per message when messages follow each other closely than when they are
sparse. Each rank reads its threads' CPU time from ``/proc/self/task`` (Linux) around the
strategy's own rank function. The model's layers sleep ``layer_ms`` per micro-batch in place of
device work (as ``mpkit tour`` does): the messages stay the same, only the time between them grows.

    python benchmarks/probes/gloo_threads.py [--runs 3]   # about 20 s on 2 cores
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: costmodel.py, _common/
from _common.machine import load  # noqa: E402
from mpkit.runtime.launch import launch
from mpkit.strategies import get_strategy, make_config
from mpkit.training import Run

STEPS = 40
CONFIG = dict(model="mlp", hidden=256, layers=4, batch_size=64, schedule="gpipe", micro_batches=4)


def thread_cpu() -> dict:
    """{thread name: CPU seconds} of this process's threads (threads of one name summed; the main
    thread as "main")."""
    ticks, out = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        name = "main" if int(tid) == os.getpid() else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return out


def _rank(ctx, cfg):
    before = thread_cpu()
    out = get_strategy(cfg.strategy).run_rank(ctx, cfg)
    after = thread_cpu()
    out.extra["threads"] = {name: after[name] - before.get(name, 0.0) for name in after}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"pp, 2 ranks, {CONFIG}; {STEPS} steps; ms of CPU per step, per message (8 per rank and step), "
          f"median over {args.runs} runs and both ranks; {load()}")
    print("| layer_ms | step ms | main thread | gloo_tcp_loop | gloo_tcp_loop per message |\n|---:|---:|---:|---:|---:|")
    for layer_ms in (0, 1, 4):
        cfg = make_config("pp", 2, steps=STEPS, layer_ms=layer_ms, **CONFIG)
        steps, main_cpu, loop_cpu = [], [], []
        for _ in range(args.runs):
            result = launch(_rank, world_size=2, args=(cfg,), memory=False)
            periods = Run(cfg, list(result), result).step_periods()
            steps.append(statistics.median(periods[len(periods) // 2:]))
            for out in result:
                main_cpu.append(out.extra["threads"]["main"] / STEPS)
                loop_cpu.append(out.extra["threads"].get("gloo_tcp_loop", 0.0) / STEPS)
        loop = statistics.median(loop_cpu)
        print(f"| {layer_ms} | {statistics.median(steps) * 1e3:.2f} | {statistics.median(main_cpu) * 1e3:.2f} | "
              f"{loop * 1e3:.2f} | {loop / 8 * 1e3:.3f} |", flush=True)


if __name__ == "__main__":
    main()
