"""Time to a working 4-rank world: ``mpkit.launch`` (fork, warm interpreter) vs ``torch.multiprocessing.spawn``.

Both do the same work: join a gloo group, one all_reduce, return. Spawned children import torch
from scratch, which is what a notebook pays per cell without fork.

    python benchmarks/launch.py [--world-size 4] [--reps 7]
"""
from __future__ import annotations

import argparse
import socket
import statistics
import time

from machine import load, machine_info  # benchmarks/machine.py (also puts the checkout on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing  # noqa: E402

import mpkit  # noqa: E402


def _reduce_once(ctx):
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def _spawned_rank(rank, world_size, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == world_size
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _timed(run, reps) -> list[float]:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--reps", type=int, default=7)
    opts = parser.parse_args()
    n = opts.world_size
    print(machine_info())
    print(f"work: {n} ranks join a gloo group, all_reduce 1 float, return; median of {opts.reps}+ runs\n")

    def fork_launch():
        assert mpkit.launch(_reduce_once, n, timeout=60) == [float(n)] * n

    fork_launch()  # warm: the interpreter has imported torch and mpkit, as in a notebook
    forked = _timed(fork_launch, 3 * opts.reps)
    spawned = _timed(lambda: torch.multiprocessing.spawn(_spawned_rank, args=(n, _port()), nprocs=n), opts.reps)

    rows = [("mpkit.launch (fork, warm)", forked), ("torch.multiprocessing.spawn", spawned)]
    print("| launcher | median s | min s | max s | runs |\n|---|---:|---:|---:|---:|")
    for name, times in rows:
        print(f"| {name} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} | {len(times)} |")
    print(f"\nafter: {load()}")
    ratio = statistics.median(spawned) / statistics.median(forked)
    print(f"spawn / mpkit.launch: {ratio:.0f}x  (targets: mpkit <= 0.3 s: "
          f"{'met' if statistics.median(forked) <= 0.3 else 'MISSED'}; >= 20x: {'met' if ratio >= 20 else 'MISSED'})")


if __name__ == "__main__":
    main()
