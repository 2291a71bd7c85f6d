"""``calibrate()``: measure the ``cpu-sim`` preset on this machine, in about 30 s, the way ranks really run.

Everything is timed inside forked ranks (``mpkit.launch``, one torch thread each, like training):
- compute: real training steps (``mpkit.train("single")``) of five calibration models, from
  op-bound to FLOP-bound; each phase's mean time is fitted to ops, FLOPs and bytes counted by
  ``mpkit.pricing.profile`` (the counter ``predict`` uses): a seconds-per-op cost for each phase,
  the matmul rate and the memory bandwidth that training really reaches (raw matmul and stream
  benchmarks ran ~1.6x and ~4x faster than the same work inside a step); then the pipeline
  executor's own seconds per micro-batch forward/backward, from 2-stage GPipe runs of two of
  those models;
- gloo: a ping-pong sweep between 2 ranks fits alpha/beta for send/recv, and a pipeline relay
  on 2 and 4 ranks measures a hop per world size (less the barriers it is timed between);
  all-reduce, reduce-scatter and all-gather sweeps on 2 and 4 ranks, each after a short and
  after a long stretch of compute, are kept as tables (``Hardware.measured``, what ``predict``
  uses for those sizes); the all-reduce rows fit the ring model 2(N-1)·(alpha + S/N·beta) for
  other group sizes;
- the machine's other work: as many ranks as cores spin at once and each one's share of a core
  says how many other busy processes the cores are shared with (``Hardware.background``), and
  one rank spinning alone says what share of a core the compute below was timed at
  (``Hardware.lone_share``), so ``predict`` stretches compute by processor sharing among ranks
  *and* that load, relative to what the calibration's one rank got; and two wake-ups of messages
  between 2 ranks after 0.1-20 ms of compute: a receiver asleep before its message
  (``Hardware.wake_wait``) and a receive posted after its send, whose sender must wake to send it
  (``Hardware.late_wait``);
- CPU per step (``Hardware.cpu``, ``mpkit.costmodel.cpu``): the process CPU time (gloo's threads too)
  that real dp, zero1, tp and pp steps of three calibration models on 2 and 4 ranks use, fitted to
  their programs' compute, collectives and messages, so ``predict`` knows the fair share of the
  cores a step needs.
Results are kept per process and in ``~/.cache/mpkit/cpu-sim.json`` (keyed by host, CPU count,
torch version and calibration method) so a notebook pays the measurement once.
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from mpkit.runtime.launch import launch
from mpkit.costmodel import cpu
from mpkit.simulator import machines
from mpkit.costmodel.cpu import program_terms
from mpkit.simulator.machines import DEFAULT_CACHE
from mpkit.simulator.hardware import PHASES, Hardware, Link
from mpkit.costmodel.prediction import predict, programs_for
from mpkit.pricing.profile import profile_piece
from mpkit.strategies import get_strategy, make_config
from mpkit.training import Run, train

# Calibration models: other sizes than the labs' and benchmarks/costmodel.py's, spanning
# op-bound steps (mlp-64), FLOP-bound ones (mlp-512, gpt-128) and attention's many small ops (gpt).
_CALIBRATION_MODELS = (
    dict(model="mlp", hidden=64, layers=4, batch_size=32),
    dict(model="mlp", hidden=128, layers=2, batch_size=256),
    dict(model="mlp", hidden=512, layers=4, batch_size=128),
    dict(model="gpt", hidden=32, layers=2, heads=2, seq_len=8, batch_size=16),
    dict(model="gpt", hidden=128, layers=2, heads=4, seq_len=32, batch_size=16),
)
_PIPELINE_MODELS = (_CALIBRATION_MODELS[0], _CALIBRATION_MODELS[3])  # mlp-64, gpt-32
_CAL_STEPS, _CAL_WARMUP = 24, 8  # step times settle within ~5 steps (allocator, caches)
_P2P_SIZES = (4, 1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
_COLLECTIVE_SIZES = (1 << 12, 1 << 16, 1 << 19, 1 << 21, 1 << 23)
_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
_HOP_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
_HOP_MESSAGES = 4  # micro-batches per relay
# Compute before each timed operation, in 96x96 matmuls (collective, pipeline hop): a rank that
# has just computed for milliseconds finds the others asleep and pays their wake-up (here up to
# a few ms on 4 ranks), one that computed for ~0.1 ms mostly does not. Both are measured and
# ``Hardware.measured_time`` interpolates by the compute an operation follows.
_GAPS = {"warm": (8, 4), "cold": (160, 80)}
_SPIN_SECONDS = 0.6  # long next to the scheduler's time slices, short next to the calibration
# How long a receiver that slept waits to run again, after the sender computed for each gap (the
# wait grows with the sleep up to ~3 ms beside busy loops, BENCHMARKS.md), 40 messages each
_WAKE_GAPS, _WAKE_MESSAGES = (1e-4, 1e-3, 5e-3, 2e-2), 40
# How long a message takes beyond its transfer when its send waited for the receive (the sender's
# event loop must wake: 1.4-2.8 ms after 1 ms beside busy loops, 0.05-0.9 ms after 5-20 ms), 40 each
_LATE_GAPS = (1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 2e-2)
_MESSAGE_BYTES = 8192  # the wake-up measurements' messages
# Real multi-rank steps whose CPU time the CPU model is fitted to: every kind of communication a
# strategy issues (all-reduce, reduce-scatter/all-gather, per-layer all-reduces, pipeline messages
# with both schedules) on 2 and 4 ranks, with messages of 1-64 KiB and gradients of 43 KiB-2 MiB
# (the per-byte costs need both ends), on MLPs and a small GPT of sizes neither the labs nor
# benchmarks/costmodel.py use.
_MLP_SMALL, _MLP_LARGE = _CALIBRATION_MODELS[0], _CALIBRATION_MODELS[2]  # mlp-64, mlp-512
_GPT_CPU = dict(model="gpt", hidden=32, layers=4, heads=4, seq_len=8, batch_size=16)
_GPIPE, _1F1B = dict(schedule="gpipe", micro_batches=4), dict(schedule="1f1b", micro_batches=8)
_CPU_RUNS = tuple((model, strategy, world, options) for model, runs in (
    (_MLP_SMALL, (("dp", 2, {}), ("zero1", 4, {}), ("tp", 4, {}), ("pp", 2, _GPIPE), ("pp", 4, _GPIPE), ("pp", 2, _1F1B))),
    (_MLP_LARGE, (("dp", 4, {}), ("zero1", 2, {}), ("tp", 2, {}), ("pp", 4, _GPIPE), ("pp", 2, _1F1B))),
    (_GPT_CPU, (("dp", 4, {}), ("tp", 2, {}), ("pp", 2, _GPIPE), ("pp", 4, _1F1B))),
) for strategy, world, options in runs)
CPU_STEPS, CPU_WARMUP = 16, 6  # CPU per step: steps 6-15 of one run (step times settle within ~5 steps)


def _steady_seconds(events, kind) -> float:
    """Mean seconds of the ``kind`` events of a calibration run's steps after its warm-up (the
    mean: ``phase_times`` says why)."""
    return statistics.fmean(e.duration for e in events
                            if e.kind == kind and e.step is not None and e.step >= _CAL_WARMUP)


def _phase_samples(kwargs):
    """[(phase, mean seconds, Cost)] of a real single-rank training loop (``mpkit.train``:
    one torch thread, trace spans on, as every strategy runs) on one calibration model, and the
    mean seconds per step outside the phases (``phase_times``)."""
    run = train("single", world_size=1, steps=_CAL_STEPS, memory=False, **kwargs)
    cfg = run.config.model
    prof = profile_piece(cfg, 0, cfg.num_layers, run.config.batch_size)
    costs = {"forward": prof.cost("forward"), "backward": prof.cost("backward"), "optimizer": prof.optimizer}
    times, outside = phase_times(run)
    return [(phase, times[phase], costs[phase]) for phase in PHASES], outside


def phase_times(run: Run) -> tuple[dict, float]:
    """({phase: mean seconds}, mean seconds per step outside the phases) over a run's steps after
    its warm-up. The mean, not the median: a step pays the slow tail too. Beside a busy loop a
    phase shorter than the scheduler's time slice either runs at once or waits a slice, so the
    median phase ran at a whole core while ``Hardware.lone_share`` says the rank got half of one
    (under two pinned loops the grid's steps were predicted 8-13% too fast on average with medians,
    4-7% with means, BENCHMARKS.md)."""
    times = {phase: _steady_seconds(run.trace.events, phase) for phase in PHASES}
    # what a step spends outside its phases (the batch, loss.item(), the loop's bookkeeping): per
    # step, its period less its own phase spans, which lie inside it one after another, so every
    # sample is positive
    periods = run.step_periods()  # [k]: start of step k to start of step k+1
    outside = [periods[k] - sum(e.duration for e in run.trace.events if e.step == k and e.kind in PHASES)
               for k in range(_CAL_WARMUP, len(periods))]
    return times, statistics.fmean(outside)


def _fit_compute(samples):
    """Least squares, on relative error, of t = ops·overhead[phase] + flops/rate + bytes/bandwidth
    over every (phase, seconds, Cost) sample: one FLOP rate and one bandwidth for the machine,
    a fixed cost per op for each phase (Python + dispatch differ between them)."""
    design = []
    for phase, seconds, cost in samples:
        per_op = [cost.ops if p == phase else 0.0 for p in PHASES]
        design.append([x / seconds for x in (*per_op, cost.flops, cost.bytes)])
    coef = np.linalg.lstsq(np.array(design), np.ones(len(samples)), rcond=None)[0]
    coef = np.maximum(coef, 1e-15)  # a noisy sweep must not yield a negative cost
    overhead = {p: float(c) for p, c in zip(PHASES, coef)}
    return 1.0 / float(coef[3]), 1.0 / float(coef[4]), overhead


def _sweep(sizes, big, reps_small, reps_big, exchange):
    """[(bytes, median seconds)] per size: ``exchange(buf)`` after a barrier, two warm-ups dropped.
    Messages of ``big`` bytes or more get ``reps_big`` repetitions instead of ``reps_small``."""
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
    peer = 1 - ctx.rank

    def pingpong(buf):  # isend/irecv + wait, as the pipeline executor talks
        first, second = (dist.isend, dist.irecv) if ctx.rank == 0 else (dist.irecv, dist.isend)
        first(buf, peer).wait()
        second(buf, peer).wait()

    return [(n, t / 2) for n, t in _sweep(_P2P_SIZES, 1 << 20, 30, 8, pingpong)]  # one way = half a round trip


def measure_p2p_link(opts) -> Link:
    """``Hardware.p2p``: alpha/beta fitted to a ping-pong sweep between 2 ranks."""
    return _fit([(1, n, t) for n, t in launch(_pingpong_rank, world_size=2, **opts)[0]])


def _busy(matmuls: int):
    """A stand-in for a layer's work: ``matmuls`` products of 96x96 matrices, and its seconds."""
    work = torch.randn(96, 96)

    def compute():
        for _ in range(matmuls):
            work @ work

    start = time.perf_counter()
    for _ in range(20):
        compute()
    return compute, (time.perf_counter() - start) / 20


def _collective_call(kind: str, full: torch.Tensor, world: int):
    """A call of collective ``kind`` on ``full`` (all_reduce's tensor, reduce_scatter's input,
    all_gather's output) among ``world`` ranks, as the strategies make it; the timed unit."""
    part = full[: full.numel() // world]
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full)
    if kind == "all_gather":
        shard = part.clone()
        return lambda: dist.all_gather_into_tensor(full, shard)
    raise ValueError(f"no calibration call for collective {kind!r}")


def _collective_rank(ctx, matmuls):
    """{kind: {"gap": s, "rows": [(bytes, mean seconds)]}} for every collective the strategies
    call, timed the way training calls them: after ``gap`` seconds of compute, so ranks arrive
    unsynchronised and those that waited must be woken. ``bytes``: the full tensor (all_reduce's,
    reduce_scatter's input, all_gather's output)."""
    compute, gap = _busy(matmuls)
    out = {}
    for kind in _COLLECTIVES:
        rows = []
        for size in _COLLECTIVE_SIZES:
            call = _collective_call(kind, torch.zeros(size // 4), ctx.world_size)
            times = []
            dist.barrier()
            for rep in range((24 if size < 1 << 21 else 10) + 2):
                compute()
                start = time.perf_counter()
                call()
                if rep >= 2:
                    times.append(time.perf_counter() - start)
            rows.append((size, statistics.fmean(times)))  # the mean: a step pays the slow tail too
        out[kind] = {"gap": gap, "rows": rows}
    return out


def _pipeline_rank(ctx, matmuls):
    """{"gap": s, "barrier": s, "rows": [(bytes, seconds per hop)]}: micro-batch messages relayed
    down all ranks the way the pp executor talks (irecv + wait, ``gap`` seconds of compute, isend
    waited at the end). In a world of more ranks than cores a hop costs far more than a ping-pong
    between two awake ranks (the receiver must be scheduled again), so the table is kept per world
    size. Each relay is timed between two barriers; what they take around one slot of compute
    alone (``barrier``: 2 ms on 4 ranks after 0.1 ms of compute here, 4 ms beside busy loops) is
    no pipeline's and is taken out."""
    n, r, m = ctx.world_size, ctx.rank, _HOP_MESSAGES
    compute, slot = _busy(matmuls)
    barrier = max(0.0, statistics.fmean(_between_barriers(compute)) - slot)
    rows = []
    for size in _HOP_SIZES:
        bufs = [torch.zeros(size // 4) for _ in range(m)]

        def relay():
            sends = []
            for buf in bufs:
                if r > 0:
                    dist.irecv(buf, r - 1).wait()
                compute()
                if r < n - 1:
                    sends.append(dist.isend(buf, r + 1))
            for work_ in sends:
                work_.wait()

        # m + n - 1 slots of compute then hop along the critical path
        rows.append((size, max((statistics.fmean(_between_barriers(relay)) - barrier) / (m + n - 1) - slot, 1e-6)))
    return {"gap": slot, "barrier": barrier, "rows": rows}


def _between_barriers(work, reps=10, warm_up=2):
    """Seconds of ``work`` from one barrier to the next (the last rank's end is everyone's end),
    ``reps`` times after ``warm_up`` untimed rounds."""
    times = []
    for rep in range(warm_up + reps):
        dist.barrier()
        start = time.perf_counter()
        work()
        dist.barrier()
        if rep >= warm_up:
            times.append(time.perf_counter() - start)
    return times


def monotone(rows):
    """[[bytes, seconds]] made non-decreasing in bytes by pooling adjacent violators (isotonic
    least squares): a bigger message never costs less, so a dip is a noisy mean (the means of
    heavy-tailed wake-up waits scatter by tens of percent), pooled with its neighbours."""
    blocks = []  # [sum of times, count]
    for _, t in rows:
        blocks.append([t, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    times = [total / count for total, count in blocks for _ in range(count)]
    return [[size, t] for (size, _), t in zip(rows, times)]


def _fit(rows) -> Link:
    """Least squares of t = alpha·x_a + beta·x_b on relative error (small messages count too)."""
    design = np.array([[xa / t, xb / t] for xa, xb, t in rows])
    alpha, beta = np.linalg.lstsq(design, np.ones(len(rows)), rcond=None)[0]
    return Link(max(float(alpha), 1e-7), max(float(beta), 1e-13))


def measure(max_world: int = 4) -> Hardware:
    """Run the measurement now (about 30 s on 2 cores) and return the calibrated ``cpu-sim`` Hardware."""
    opts = dict(timeout=60, trace=False, memory=False)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    background = background_load(cores, opts)  # before the rest: what every measurement below shares the cores with
    lone_share = launch(_spin_share, world_size=1, args=(_SPIN_SECONDS,), **opts)[0]
    wake_max, wake_tau = fit_wake_wait(wake_waits(opts))
    samples = [_phase_samples(kwargs) for kwargs in _CALIBRATION_MODELS]
    flops, mem_bw, overhead = _fit_compute([s for phases, _ in samples for s in phases])
    step_overhead = statistics.median(outside for _, outside in samples)
    p2p = measure_p2p_link(opts)
    late = late_waits(opts, p2p)
    rows, measured = [], {}
    for world in sorted({2, max(2, min(max_world, 4))}):
        for when, (collective_work, hop_work) in _GAPS.items():
            tables = launch(_collective_rank, world_size=world, args=(collective_work,), **opts)[0]
            tables["p2p"] = launch(_pipeline_rank, world_size=world, args=(hop_work,), **opts)[0]
            for kind, table in tables.items():
                matmuls = hop_work if kind == "p2p" else collective_work
                # gap, rows (and a relay's barrier, taken out of its hops) as measured
                measured.setdefault(f"{kind}/{world}", {})[when] = {**table, "matmuls": matmuls,
                                                                    "rows": monotone(table["rows"])}
            if when == "warm":
                rows += [(2 * (world - 1), 2 * (world - 1) / world * size, t) for size, t in tables["all_reduce"]["rows"]]
    collective = _fit(rows)  # ring all-reduce alpha/beta: for group sizes without a table
    hw = Hardware(
        name="cpu-sim", flops=flops, mfu=1.0, mem_bw=mem_bw, op_overhead=overhead, p2p=p2p,
        collective=collective, devices_per_node=1 << 20, cores=cores, background=background, lone_share=lone_share,
        wake_max=wake_max, wake_tau=wake_tau, late_waits=late,
        precision="fp32", allreduce="ring",
        measured=measured, step_overhead=step_overhead,
        source=f"measured on {socket.gethostname()} ({cores} cores, torch {torch.__version__}) "
               f"by mpkit.sim.calibrate at {time.strftime('%Y-%m-%d %H:%M')}")
    hw = replace(hw, stage_overhead=_stage_overhead(hw))
    return replace(hw, cpu=_fit_cpu(hw, opts))


def waiting_receiver(ctx, gap, messages):
    """(wall seconds per message, process CPU seconds per message) of this rank, the second of two
    rounds: rank 1 computes (spins) ``gap`` seconds and sends 8 KiB, ``messages`` times; rank 0
    only receives, asleep while rank 1 computes."""
    buf = torch.zeros(_MESSAGE_BYTES // 4)
    for _ in range(2):  # the first round warms gloo's buffers
        ctx.comm.barrier()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(messages):
            if ctx.rank == 1:
                _spin(gap)
                dist.send(buf, 0)
            else:
                dist.recv(buf, 1)
        result = ((time.perf_counter() - wall) / messages, (time.process_time() - cpu) / messages)
    return result


def _spin(seconds):
    """Compute (a busy loop) for ``seconds`` of wall time."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def late_receiver(ctx, gap, messages):
    """Rank 1's mean seconds from posting a receive to its completion when the send waited ``gap``
    seconds for it (the second of two rounds): rank 0 sends 8 KiB and sleeps in a receive of rank
    1's acknowledgement; rank 1 computes (spins) ``gap`` seconds, then receives (``messages`` times)."""
    buf, ack = torch.zeros(_MESSAGE_BYTES // 4), torch.zeros(1)
    for _ in range(2):  # the first round warms gloo's buffers
        ctx.comm.barrier()
        took = []
        for _ in range(messages):
            if ctx.rank == 0:
                work = dist.isend(buf, 1)
                dist.recv(ack, 1)
                work.wait()
            else:
                _spin(gap)
                start = time.perf_counter()
                dist.recv(buf, 0)
                took.append(time.perf_counter() - start)
                dist.send(ack, 0)
        result = statistics.fmean(took) if took else 0.0
    return result


def late_waits(opts, link: Link, gaps=_LATE_GAPS, messages=_WAKE_MESSAGES):
    """``Hardware.late_waits``: ((seconds a send waited, seconds its message took beyond the
    ``link``'s transfer), ...) per gap."""
    out = []
    for gap in gaps:
        took = launch(late_receiver, world_size=2, args=(gap, messages), **opts)[1]
        out.append((gap, max(0.0, took - link.time(_MESSAGE_BYTES))))
    return tuple(out)


def wake_waits(opts, gaps=_WAKE_GAPS, messages=_WAKE_MESSAGES):
    """[(seconds the receiver slept, seconds it waited beyond that, its CPU seconds) per message]."""
    out = []
    for gap in gaps:
        (wall, cpu_seconds), _ = launch(waiting_receiver, world_size=2, args=(gap, messages), **opts)
        out.append((gap, max(0.0, wall - gap), cpu_seconds))
    return out


def fit_wake_wait(points) -> tuple[float, float]:
    """(wake_max, wake_tau) of wait = wake_max·(1 - exp(-slept / wake_tau)) over ``wake_waits``'
    points, least squares over wake_tau on a log grid (0.1 ms to 0.2 s), wake_max in closed form."""
    slept, waited = [p[0] for p in points], [p[1] for p in points]
    best = None
    for tau in (1e-4 * 1.5 ** i for i in range(20)):
        xs = [1.0 - math.exp(-s / tau) for s in slept]
        wmax = sum(x * w for x, w in zip(xs, waited)) / sum(x * x for x in xs)
        err = sum((wmax * x - w) ** 2 for x, w in zip(xs, waited))
        if best is None or err < best[0]:
            best = (err, max(wmax, 0.0), tau)
    return best[1], best[2]


def _spin_share(ctx, seconds):
    """Share of one core this rank got while spinning for ``seconds`` (CPU time / wall time)."""
    ctx.comm.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    _spin(seconds)
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def background_load(cores: int, opts) -> float:
    """How many other busy processes share this machine's cores now: ``cores`` ranks spin at once,
    each gets min(1, cores/(cores + B)) of a core, so B = cores/share - cores (0 on an idle machine)."""
    shares = launch(_spin_share, world_size=cores, args=(_SPIN_SECONDS,), **opts)
    share = statistics.median(shares)
    return max(0.0, cores / share - cores) if share > 0 else 0.0


def _timed_rank(ctx, cfg):
    """The strategy's own rank function, with the CPU seconds at the start of each step (and at the
    loop's end) in ``extra["cpu_marks"]``: (the whole process: gloo runs collectives and messages on
    its own threads; the main thread). The loop announces each step through ``ctx.set_step``."""
    marks, set_step = [], ctx.set_step

    def marking(step):
        marks.append((time.process_time(), time.thread_time()))
        set_step(step)

    ctx.set_step = marking
    out = get_strategy(cfg.strategy).run_rank(ctx, cfg)
    out.extra["cpu_marks"] = marks
    return out


def cpu_per_step(strategy, world, kwargs, opts=None):
    """(process CPU seconds per step of each rank, main-thread CPU seconds per step of each rank,
    the run's ``Run``) of ``strategy`` on ``world`` ranks: one real run of ``CPU_STEPS`` steps,
    its CPU from the start of step ``CPU_WARMUP`` to the loop's end (no start-up, no warm-up)."""
    opts = dict(memory=False) if opts is None else opts
    cfg = make_config(strategy, world, steps=CPU_STEPS, **kwargs)
    result = launch(_timed_rank, world_size=world, args=(cfg,), **opts)
    marks = [out.extra["cpu_marks"] for out in result]
    if any(len(m) != CPU_STEPS + 1 for m in marks):  # the one loop announces each step, then None
        raise ValueError(f"strategy={strategy!r} does not step through the one training loop "
                         f"(mpkit.strategies.loop.run_steps); its CPU per step cannot be read")
    steps = CPU_STEPS - CPU_WARMUP
    process, thread = ([(m[-1][kind] - m[CPU_WARMUP][kind]) / steps for m in marks] for kind in (0, 1))
    return process, thread, Run(cfg, list(result), result)


def _fit_cpu(hw: Hardware, opts) -> dict:
    """``Hardware.cpu``: the CPU model fitted to every rank of the ``_CPU_RUNS``."""
    samples = []
    for model, strategy, world, options in _CPU_RUNS:
        kwargs = {**model, **options}
        measured, _, _ = cpu_per_step(strategy, world, kwargs, opts)
        samples += [(program_terms(program), seconds)
                    for program, seconds in zip(programs_for(hw, strategy, world, kwargs), measured)]
    return cpu.fit(samples)


def _stage_overhead(hw: Hardware) -> dict:
    """Seconds the pipeline executor adds to each micro-batch's forward and backward beyond the
    single-rank fit (taking the stage input, autograd.backward on a stage's outputs, its
    bookkeeping): measured (the mean, as ``phase_times``) minus predicted instruction time, median
    over both ranks of a 2-stage GPipe run of two calibration models."""
    extra = {"forward": [], "backward": []}
    for kwargs in _PIPELINE_MODELS:
        kwargs = dict(kwargs, schedule="gpipe", micro_batches=4)
        run = train("pp", world_size=2, steps=_CAL_STEPS, memory=False, **kwargs)
        pred = predict("pp", hardware=hw, world_size=2, **kwargs)
        for phase, values in extra.items():
            for rank in (0, 1):
                predicted = [e.duration for e in pred.trace.of_rank(rank) if e.kind == phase]
                values.append(_steady_seconds(run.trace.of_rank(rank), phase) - statistics.median(predicted))
    return {phase: max(statistics.median(values), 0.0) for phase, values in extra.items()}


def calibrate(refresh: bool = False, cache_file: Path | str | None = DEFAULT_CACHE) -> Hardware:
    """Measure this machine as the ``cpu-sim`` preset (about 30 s of forked training runs), keep it
    for this process and in ``cache_file`` (None: no file). Without ``refresh`` an earlier
    measurement of this machine (same host, cores, torch and method) is reused."""
    hw = None if refresh else machines.known(cache_file)
    if hw is None:
        hw = measure()
        machines.keep(hw, cache_file)
    return hw
