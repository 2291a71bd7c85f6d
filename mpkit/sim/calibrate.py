"""Measure the ``cpu-sim`` preset on this machine, in a few seconds, the way ranks really run.

Everything is timed inside forked ranks (``mpkit.launch``, one torch thread each, like training):
- compute: lab-sized matmuls (FLOP rate), adds of 256 KiB-16 MiB (memory bandwidth), one training step
  of a tiny MLP whose ops cost almost nothing but their fixed overhead (seconds per op, by phase;
  the op counts come from ``mpkit.sim.profile``, the same counter ``predict`` uses);
- gloo: a ping-pong sweep between 2 ranks fits alpha/beta for send/recv, an all-reduce sweep on
  2 and 4 ranks fits the ring model 2(N-1)·(alpha + S/N·beta) for collectives.
Results are kept per process and in ``~/.cache/mpkit/cpu-sim.json`` (keyed by host, CPU count
and torch version) so a notebook pays the measurement once.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from mpkit.sim.hardware import PHASES, Hardware, Link

DEFAULT_CACHE = Path.home() / ".cache" / "mpkit" / "cpu-sim.json"
_TINY = dict(kind="mlp", layers=4, hidden=16, d_in=16, classes=4)
_TINY_BATCH = 4
# Lab-sized shapes, not one best case: a 256-wide layer on a 64-sample batch runs well below
# the 512^3 rate, and tensors of a few hundred KiB stream from cache, not DRAM.
_GEMMS = ((64, 256, 256), (256, 256, 256), (512, 512, 512))
_STREAMS = (1 << 16, 1 << 18, 1 << 22)
_P2P_SIZES = (4, 1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
_AR_SIZES = (4, 1 << 12, 1 << 16, 1 << 19, 1 << 22)
_memory: dict[str, Hardware] = {}


def _timeit(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _compute_rank(ctx):
    """Runs in a rank: raw rates and the per-phase time of one tiny training step."""
    from mpkit.models import ModelConfig, build_model, loss_fn, make_batch

    rates = []
    for m, k, n in _GEMMS:
        a, b = torch.randn(m, k), torch.randn(k, n)
        rates.append(2 * m * k * n / _timeit(lambda: a @ b, 20))
    flops = statistics.median(rates)
    bws = []
    for numel in _STREAMS:
        x = torch.randn(numel)
        bws.append(3 * numel * 4 / _timeit(lambda: x + x, 20))
    mem_bw = statistics.median(bws)
    cfg = ModelConfig(**_TINY)
    model = build_model(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
    inp, target = make_batch(cfg, _TINY_BATCH, 0)
    phases = {p: [] for p in PHASES}
    for rep in range(60):
        t0 = time.perf_counter()
        loss = loss_fn(cfg, model(inp), target)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if rep >= 10:
            for phase, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2)):
                phases[phase].append(dt)
    return flops, mem_bw, {p: statistics.median(v) for p, v in phases.items()}


def _sweep(sizes, big, reps_small, reps_big, exchange):
    """[(bytes, median seconds)] per size: ``exchange(buf)`` after a barrier, two warm-ups dropped.
    Messages of ``big`` bytes or more get ``reps_big`` repetitions instead of ``reps_small``."""
    import torch.distributed as dist

    out = []
    for size in sizes:
        buf = torch.zeros(max(size // 4, 1))
        reps = reps_small if size < big else reps_big
        times = []
        for rep in range(reps + 2):
            dist.barrier()
            start = time.perf_counter()
            exchange(buf)
            if rep >= 2:
                times.append(time.perf_counter() - start)
        out.append((buf.numel() * 4, statistics.median(times)))
    return out


def _pingpong_rank(ctx):
    import torch.distributed as dist

    peer = 1 - ctx.rank

    def pingpong(buf):  # isend/irecv + wait, as the pipeline executor talks
        first, second = (dist.isend, dist.irecv) if ctx.rank == 0 else (dist.irecv, dist.isend)
        first(buf, peer).wait()
        second(buf, peer).wait()

    return [(n, t / 2) for n, t in _sweep(_P2P_SIZES, 1 << 20, 30, 8, pingpong)]  # one way = half a round trip


def _allreduce_rank(ctx):
    import torch.distributed as dist

    return _sweep(_AR_SIZES, 1 << 19, 20, 6, dist.all_reduce)


def _fit(rows) -> Link:
    """Least squares of t = alpha·x_a + beta·x_b on relative error (small messages count too)."""
    design = np.array([[xa / t, xb / t] for xa, xb, t in rows])
    alpha, beta = np.linalg.lstsq(design, np.ones(len(rows)), rcond=None)[0]
    return Link(max(float(alpha), 1e-7), max(float(beta), 1e-13))


def measure(max_world: int = 4) -> Hardware:
    """Run the measurement now (about 5-10 s) and return the calibrated ``cpu-sim`` Hardware."""
    from mpkit.models import ModelConfig
    from mpkit.runtime.launch import launch
    from mpkit.sim.profile import profile_piece

    opts = dict(timeout=60, trace=False, memory=False)
    flops, mem_bw, phase_time = launch(_compute_rank, world_size=1, **opts)[0]
    cfg = ModelConfig(**_TINY)
    prof = profile_piece(cfg, 0, cfg.num_layers, _TINY_BATCH)
    costs = {"forward": prof.cost("forward"), "backward": prof.cost("backward"), "optimizer": prof.optimizer}
    overhead = {p: max(phase_time[p] - c.flops / flops - c.bytes / mem_bw, 0.0) / c.ops for p, c in costs.items()}
    p2p = _fit([(1, n, t) for n, t in launch(_pingpong_rank, world_size=2, **opts)[0]])
    rows = []
    for world in sorted({2, max(2, min(max_world, 4))}):
        for size, t in launch(_allreduce_rank, world_size=world, **opts)[0]:
            rows.append((2 * (world - 1), 2 * (world - 1) / world * size, t))
    collective = _fit(rows)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Hardware(
        name="cpu-sim", flops=flops, mfu=1.0, mem_bw=mem_bw, op_overhead=overhead, p2p=p2p,
        collective=collective, devices_per_node=1 << 20, cores=cores, precision="fp32", allreduce="ring",
        source=f"measured on {socket.gethostname()} ({cores} cores, torch {torch.__version__}) "
               f"by mpkit.sim.calibrate at {time.strftime('%Y-%m-%d %H:%M')}")


def _cache_key() -> str:
    return f"{socket.gethostname()}|{os.cpu_count()}|{torch.__version__}"


def _load(path: Path) -> Hardware | None:
    try:
        data = json.loads(path.read_text())[_cache_key()]
    except (OSError, ValueError, KeyError):
        return None
    data["p2p"], data["collective"] = Link(**data["p2p"]), Link(**data["collective"])
    return Hardware(**data)


def _save(path: Path, hw: Hardware) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data[_cache_key()] = asdict(hw)
        path.write_text(json.dumps(data, indent=1))
    except OSError:
        pass  # a read-only home (some Binder/CI images) only costs a re-measure next process


def cpu_sim(refresh: bool = False, cache_file: Path | str | None = DEFAULT_CACHE) -> Hardware:
    """The calibrated ``cpu-sim`` preset: from this process's memory, else ``cache_file`` (None:
    no file), else measured now. ``refresh=True`` measures again and overwrites both."""
    key = str(cache_file)
    if not refresh and key in _memory:
        return _memory[key]
    path = Path(cache_file) if cache_file is not None else None
    hw = None if refresh or path is None else _load(path)
    if hw is None:
        hw = measure()
        if path is not None:
            _save(path, hw)
    _memory[key] = hw
    return hw
