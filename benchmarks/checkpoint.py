"""What a distributed checkpoint costs here: blocking ``save`` vs ``async_save``, ``load`` into the
same layout and into another one, with the bytes each rank writes, needs and reads.

Each of ``--world-size`` ranks holds a replicated MLP (``--hidden`` x ``--layers``) and AdamW with its
state sharded ZeRO-1 style (``ShardedOptimizer``): the parameters are written once (DCP keeps one
replica), the optimizer state by its owner. Per repetition, every rank times (max over ranks, then
the median over ``--reps``):

- ``save``: the blocking save, from the call to the committed checkpoint;
- ``async_save`` (blocked): how long the training loop is held (DCP's copy of the state), then
  ``async_save`` (total) until ``wait()`` returns, the write running while ``--steps`` training
  steps run, against the same steps after a blocking save;
- ``load``: into the same layout, and into plain AdamW on every rank (each reads all of it).

The whole table is measured twice in one run (rounds A and B): their difference is the noise floor.

    python benchmarks/checkpoint.py [--world-size 4] [--hidden 1024] [--layers 8] [--reps 5] [--steps 3]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common.machine import load, machine_info  # (also puts the checkout on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import mpkit  # noqa: E402
from mpkit.parallel import DataParallel, ShardedOptimizer, checkpoint  # noqa: E402


def build(hidden, layers, sharded):
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(layers)))
    dp = DataParallel(model, overlap=False)
    opt = (ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3) if sharded
           else torch.optim.AdamW(model.parameters(), lr=1e-3))
    return model, dp, opt


def train(dp, opt, hidden, steps, seed=0):
    for k in range(steps):
        x = torch.randn(16, hidden, generator=torch.Generator().manual_seed(seed + k))
        dp(x).square().mean().backward()
        dp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_rank(ctx, folder, hidden, layers, reps, steps):
    folder = Path(folder)
    model, dp, opt = build(hidden, layers, sharded=True)
    train(dp, opt, hidden, 1)  # the optimizer has its state
    rows = []
    for rep in range(reps):
        row = {}
        dist.barrier()
        row["train"], _ = timed(lambda: train(dp, opt, hidden, steps, rep))
        dist.barrier()
        row["save"], saved = timed(lambda: checkpoint.save(folder / f"b{rep}", dp, opt, step=rep))
        row["save+train"] = row["save"] + timed(lambda: train(dp, opt, hidden, steps, rep))[0]
        row["rank_bytes"], row["total_bytes"] = saved.rank_bytes, saved.total_bytes
        dist.barrier()
        start = time.perf_counter()
        pending = checkpoint.async_save(folder / f"a{rep}", dp, opt, step=rep)
        row["async blocked"] = time.perf_counter() - start
        train(dp, opt, hidden, steps, rep)
        pending.wait()
        row["async+train"] = time.perf_counter() - start
        dist.barrier()
        row["load"], loaded = timed(lambda: checkpoint.load(folder / f"b{rep}", dp, opt))
        row["load_needed"], row["load_read"] = loaded.read.needed_bytes, loaded.read.read_bytes
        _, other_dp, other_opt = build(hidden, layers, sharded=False)
        dist.barrier()
        row["load other"], loaded = timed(lambda: checkpoint.load(folder / f"b{rep}", other_dp, other_opt))
        row["other_needed"], row["other_read"] = loaded.read.needed_bytes, loaded.read.read_bytes
        dist.barrier()
        if ctx.rank == 0:
            for name in (f"a{rep}", f"b{rep}"):
                shutil.rmtree(folder / name)
        rows.append(row)
    return rows


def measure(opts):
    with tempfile.TemporaryDirectory() as folder:
        per_rank = mpkit.launch(bench_rank, opts.world_size, args=(folder, opts.hidden, opts.layers, opts.reps,
                                                                     opts.steps), timeout=1800, trace=False,
                                memory=False)
    out = {}
    for key in per_rank[0][0]:
        slowest = [max(rank[rep][key] for rank in per_rank) for rep in range(opts.reps)]
        out[key] = statistics.median(slowest)
    out["rank_bytes_list"] = [rank[0]["rank_bytes"] for rank in per_rank]
    out["other_read_list"] = [rank[0]["other_read"] for rank in per_rank]
    out["load_read_list"] = [rank[0]["load_read"] for rank in per_rank]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    opts = parser.parse_args()
    params = opts.layers * (opts.hidden * opts.hidden + opts.hidden)
    print(machine_info())
    print(f"work: {opts.world_size} ranks, MLP {opts.layers} x {opts.hidden} ({params * 4 / 2**20:.1f} MiB of fp32 "
          f"parameters, AdamW state 2x that, ZeRO-1 over the ranks); medians of {opts.reps} reps of the slowest "
          f"rank, {opts.steps} training steps beside each save\n")
    rounds = [measure(opts), measure(opts)]
    mib = 2**20
    print(f"{'':32}{'round A':>10}{'round B':>10}")
    for key, label in [("train", f"{opts.steps} training steps (s)"), ("save", "save, blocking (s)"),
                       ("async blocked", "async_save: loop blocked (s)"), ("save+train", "save + steps (s)"),
                       ("async+train", "async_save + steps + wait (s)"), ("load", "load, same layout (s)"),
                       ("load other", "load into plain AdamW (s)")]:
        print(f"{label:32}" + "".join(f"{r[key]:>10.3f}" for r in rounds))
    a = rounds[0]
    print(f"\ncheckpoint: {a['total_bytes'] / mib:.1f} MiB in all; written per rank (MiB): "
          + ", ".join(f"{b / mib:.1f}" for b in a["rank_bytes_list"]))
    print(f"load, same layout: each rank needs {a['load_needed'] / mib:.1f} MiB, reads (MiB) "
          + ", ".join(f"{b / mib:.1f}" for b in a["load_read_list"]))
    print(f"load into plain AdamW: each rank needs {a['other_needed'] / mib:.1f} MiB, reads (MiB) "
          + ", ".join(f"{b / mib:.1f}" for b in a["other_read_list"]))
    print(f"\n{load()} (after)")


if __name__ == "__main__":
    main()
