"""What recording costs: step time of a small data-parallel training step with the trace and the
memory tracker off / on, on simulated devices.

Each rank: forward, backward, all_reduce(avg) of every gradient, Adam(foreach=True) step.
Configurations alternate run by run so drift in machine load hits them alike, and besides wall
time each rank reports its CPU time per step: on a shared machine other processes stretch wall
time at random, while the recorders' cost is CPU time this rank spends itself.

    python benchmarks/overhead.py [--runs 5] [--steps 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch import load, machine_info  # noqa: E402  (also puts the checkout on sys.path)

import torch  # noqa: E402

import mpkit  # noqa: E402

CONFIGS = (("trace off, memory off", False, False), ("trace on,  memory off", True, False),
           ("trace on,  memory on", True, True))


def _mlp(width, layers):
    blocks = []
    for _ in range(layers - 1):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, width))


def _train(ctx, width, layers, batch, warmup, steps):
    """(wall, cpu) seconds of each step on this rank, warm-up steps dropped."""
    torch.manual_seed(0)
    model = _mlp(width, layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    x, y = torch.randn(batch, width), torch.randn(batch, width)
    times = []
    with ctx.memory.track(model, opt):
        for step in range(warmup + steps):
            ctx.set_step(step)
            ctx.barrier()  # untraced: every rank starts the step together
            start, cpu = time.perf_counter(), time.process_time()
            with ctx.trace.span("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with ctx.trace.span("backward"):
                loss.backward()
            for p in model.parameters():
                ctx.comm.all_reduce(p.grad, op="avg")
            with ctx.trace.span("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times[warmup:]


def step_time(trace, memory, opts) -> tuple[float, float]:
    """Median over steps of (slowest rank's wall time, ranks' mean CPU time), in seconds."""
    per_rank = mpkit.launch(_train, opts.world_size, timeout=600, trace=trace, memory=memory,
                            args=(opts.width, opts.layers, opts.batch, opts.warmup, opts.steps))
    steps = list(zip(*per_rank))
    return (statistics.median(max(wall for wall, _ in step) for step in steps),
            statistics.median(statistics.fmean(cpu for _, cpu in step) for step in steps))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    opts = parser.parse_args()
    n_params = sum(p.numel() for p in _mlp(opts.width, opts.layers).parameters())
    print(machine_info())
    print(f"work: {opts.world_size} ranks, MLP {opts.layers} x Linear({opts.width}, {opts.width}) "
          f"({n_params / 1e6:.1f} M params), batch {opts.batch} per rank; forward, backward, all_reduce "
          f"of every gradient, Adam(foreach=True); {opts.warmup} warm-up + {opts.steps} timed steps per run, "
          f"{opts.runs} runs per configuration, interleaved\n")
    runs = {name: [] for name, _, _ in CONFIGS}
    for _ in range(opts.runs):
        for name, trace, memory in CONFIGS:
            runs[name].append(step_time(trace, memory, opts))
    print("| recording | wall ms/step | vs off | CPU ms/step per rank | vs off |\n|---|---:|---:|---:|---:|")
    base = None
    for name, _, _ in CONFIGS:
        wall = statistics.median(w for w, _ in runs[name])
        cpu = statistics.median(c for _, c in runs[name])
        base = base or (wall, cpu)
        rel = [f"{100 * (v / b - 1):+.1f}%" if name != CONFIGS[0][0] else "-" for v, b in zip((wall, cpu), base)]
        print(f"| {name} | {1e3 * wall:.1f} | {rel[0]} | {1e3 * cpu:.1f} | {rel[1]} |")
    spread = {name: f"{1e3 * min(w for w, _ in r):.0f}-{1e3 * max(w for w, _ in r):.0f}" for name, r in runs.items()}
    print(f"\nwall ms/step range over runs: {spread}")
    print(f"after: {load()}; target: trace + memory <= +5%")


if __name__ == "__main__":
    main()
