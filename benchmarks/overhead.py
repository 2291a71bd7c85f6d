"""What mpkit's own machinery costs on simulated devices: recording, a simulated capacity, starting a world.

(a) ``--what recording`` (the default): step time of a small data-parallel training step with the
    trace and the memory tracker off / on. Each rank: forward, backward, all_reduce(avg) of every
    gradient, Adam(foreach=True) step. On a shared machine other processes stretch wall time at
    random by far more than 5%, so the three configurations alternate inside one world, a block of
    ``--block`` steps each (order rotated each round), and are compared pairwise within a round:
    load drift hits all three alike. The memory block enters ``ctx.memory.track`` once, as a
    training loop does for its whole run, so the tracker's setup is paid once per block and
    counted in its steps. CPU time per rank is reported too: it is what the recorders consume.
(b) ``--what capacity``: with ``device_memory`` set, every tensor a rank allocates counts toward
    it, so the whole rank runs under the memory tracker, not only the strategy's training loop.
    Step time of ``mpkit.train`` without and with a capacity (and with memory tracking off), the
    three alternating run by run; a run's step time is the median of its steps after the first,
    the reported time the median over runs.
(c) ``--what launch``: time to a working world, ``mpkit.launch`` (fork, warm interpreter) against
    ``torch.multiprocessing.spawn``. Both join a gloo group, run one all_reduce and return;
    spawned children import torch from scratch, which is what a notebook pays per cell without fork.

    python benchmarks/overhead.py [--worlds 2] [--rounds 15] [--block 5]     # (a)
    python benchmarks/overhead.py --what capacity [--runs 5] [--steps 6]      # (b)
    python benchmarks/overhead.py --what launch [--world-size 4] [--reps 7]   # (c)
"""
from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common.machine import load, machine_info  # noqa: E402  (also puts the checkout on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing  # noqa: E402

import mpkit  # noqa: E402

CONFIGS = ("trace off, memory off", "trace on,  memory off", "trace on,  memory on")
# (b): the run, and the three ways of running it
CAPACITY_RUN = dict(strategy="dp", world_size=4, model="gpt", hidden=128, layers=4, seq_len=32, batch_size=32)
CAPACITY_VARIANTS = {"memory off": dict(memory=False), "memory tracked (loop)": dict(),
                     "capacity set (whole rank)": dict(device_memory="1GiB")}


# ---- (a) recording ----

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


def recording(opts):
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


# ---- (b) a simulated device capacity ----

def capacity(opts):
    print(machine_info())
    times = {name: [] for name in CAPACITY_VARIANTS}
    for _ in range(opts.runs):
        for name, options in CAPACITY_VARIANTS.items():
            run = mpkit.train(steps=opts.steps, **CAPACITY_RUN, **options)
            times[name].append(statistics.median(run.step_times()[1:]))
    base = statistics.median(times["memory off"])
    print(f"dp on 4 ranks, gpt hidden 128; median over {opts.runs} runs of the median of steps 2..{opts.steps}\n")
    print("| variant | ms/step | vs memory off |\n|---|---:|---:|")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name} | {t * 1e3:.1f} | {(t / base - 1) * 100:+.1f}% |")


# ---- (c) starting a world ----

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


def launch(opts):
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--what", choices=("recording", "capacity", "launch"), default="recording")
    parser.add_argument("--world-size", type=int, default=4, help="(a), (c)")
    parser.add_argument("--width", type=int, default=1024, help="(a)")
    parser.add_argument("--layers", type=int, default=4, help="(a)")
    parser.add_argument("--batch", type=int, default=256, help="(a)")
    parser.add_argument("--warmup", type=int, default=1, help="(a)")
    parser.add_argument("--rounds", type=int, default=15, help="(a)")
    parser.add_argument("--worlds", type=int, default=2, help="(a)")
    parser.add_argument("--block", type=int, default=5, help="(a): steps per configuration per round")
    parser.add_argument("--runs", type=int, default=5, help="(b)")
    parser.add_argument("--steps", type=int, default=6, help="(b)")
    parser.add_argument("--reps", type=int, default=7, help="(c)")
    opts = parser.parse_args(argv)
    {"recording": recording, "capacity": capacity, "launch": launch}[opts.what](opts)


if __name__ == "__main__":
    main()
