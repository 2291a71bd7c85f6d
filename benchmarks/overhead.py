"""What recording costs: step time of a small data-parallel training step with the trace and the
memory tracker off / on, on simulated devices.

Each rank: forward, backward, all_reduce(avg) of every gradient, Adam(foreach=True) step.
On a shared machine other processes stretch wall time at random by far more than 5%, so the
three configurations alternate inside one world, a block of ``--block`` steps each (order
rotated each round), and are compared pairwise within a round: load drift hits all three alike.
The memory block enters ``ctx.memory.track`` once, as a training loop does for its whole run,
so the tracker's setup is paid once per block and counted in its steps. CPU time per rank is
reported too: it is what the recorders themselves consume.

    python benchmarks/overhead.py [--worlds 2] [--rounds 15] [--block 5]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import load, machine_info  # noqa: E402  (benchmarks/machine.py; also puts the checkout on sys.path)

import torch  # noqa: E402

import mpkit  # noqa: E402

CONFIGS = ("trace off, memory off", "trace on,  memory off", "trace on,  memory on")


def _mlp(width, layers):
    blocks = []
    for _ in range(layers - 1):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, width))


def _train(ctx, width, layers, batch, warmup, rounds, block):
    """{config: [(wall, cpu) seconds per step]} on this rank; warm-up rounds dropped."""
    torch.manual_seed(0)
    model = _mlp(width, layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    x, y = torch.randn(batch, width), torch.randn(batch, width)
    times = {name: [] for name in CONFIGS}
    for r in range(warmup + rounds):
        for name in CONFIGS[r % 3:] + CONFIGS[:r % 3]:
            ctx.trace.enabled = name != CONFIGS[0]
            tracked = ctx.memory.track(model, opt) if name == CONFIGS[2] else contextlib.nullcontext()
            ctx.barrier()  # untraced: every rank starts the block together
            start, cpu = time.perf_counter(), time.process_time()
            with tracked:  # entered once per block, as a training loop enters it once per run
                for _ in range(block):
                    ctx.set_step(r)
                    with ctx.trace.span("forward"):
                        loss = torch.nn.functional.mse_loss(model(x), y)
                    with ctx.trace.span("backward"):
                        loss.backward()
                    for p in model.parameters():
                        ctx.comm.all_reduce(p.grad, op="avg")
                    with ctx.trace.span("optimizer"):
                        opt.step()
                        opt.zero_grad(set_to_none=True)
            if r >= warmup:
                times[name].append(((time.perf_counter() - start) / block, (time.process_time() - cpu) / block))
    return times


def rounds_of_world(opts) -> list[dict[str, tuple[float, float]]]:
    """Per round: {config: (slowest rank's wall s, ranks' mean CPU s)}."""
    per_rank = mpkit.launch(_train, opts.world_size, timeout=600,
                            args=(opts.width, opts.layers, opts.batch, opts.warmup, opts.rounds, opts.block))
    return [{name: (max(r[name][i][0] for r in per_rank), statistics.fmean(r[name][i][1] for r in per_rank))
             for name in CONFIGS} for i in range(opts.rounds)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--worlds", type=int, default=2)
    parser.add_argument("--block", type=int, default=5, help="steps per configuration per round")
    opts = parser.parse_args()
    n_params = sum(p.numel() for p in _mlp(opts.width, opts.layers).parameters())
    print(machine_info())
    print(f"work: {opts.world_size} ranks, MLP {opts.layers} x Linear({opts.width}, {opts.width}) "
          f"({n_params / 1e6:.1f} M params), batch {opts.batch} per rank; forward, backward, all_reduce of "
          f"every gradient, Adam(foreach=True); {opts.worlds} worlds x {opts.rounds} rounds "
          f"(+{opts.warmup} warm-up), each round {opts.block} steps of every configuration\n")
    rounds = [r for _ in range(opts.worlds) for r in rounds_of_world(opts)]
    print("| recording | wall ms/step | vs off (median of paired rounds) | CPU ms/step per rank | vs off |\n"
          "|---|---:|---:|---:|---:|")
    for name in CONFIGS:
        cells = []
        for i in (0, 1):  # wall, cpu
            ms = 1e3 * statistics.median(r[name][i] for r in rounds)
            ratio = statistics.median(r[name][i] / r[CONFIGS[0]][i] for r in rounds)
            cells += [f"{ms:.1f}", "-" if name == CONFIGS[0] else f"{100 * (ratio - 1):+.1f}%"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nafter: {load()}; target: trace + memory <= +5%")


if __name__ == "__main__":
    main()
