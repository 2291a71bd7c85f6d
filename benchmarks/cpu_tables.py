"""CPU seconds per communication operation, and from them a step's CPU time per rank, unrun.

``benchmarks/fairshare.py`` estimates a loaded step as k·C, C the busiest rank's CPU seconds per
step. This predicts C without running the step: the compute instructions' seconds as the cost
model prices them (``strategy.program``) and the step's work outside its phases, both divided by
the share of a core the calibration's lone rank had beside the load (its times are wall times),
plus for every collective and message the CPU of the whole
process (gloo runs the work on its own threads) that one such operation costs. Those costs are
measured here, under the current load: collectives on 2 and 4 ranks, each after a stretch of
compute as training calls them; sends and receives in a 2-rank relay.
"""
from __future__ import annotations

import bisect
import time

import torch
import torch.distributed as dist

from mpkit.runtime.launch import launch
from mpkit.sim.calibration import _COLLECTIVES, _busy, collective_call
from mpkit.sim.engine import Collective, Compute, P2P
from mpkit.sim.pricing import Pricer
from mpkit.strategies import get_strategy, make_config

SIZES = (1 << 12, 1 << 16, 1 << 19, 1 << 21, 1 << 23)
MESSAGE_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
GAP_MATMULS = 40  # compute before each operation: ranks arrive unsynchronised, as in training


def _cpu_around(compute, call, reps):
    """Process CPU seconds per ``call`` beyond the ``compute`` before each one."""
    start, computing = time.process_time(), 0.0
    for _ in range(reps):
        begin = time.process_time()
        compute()
        computing += time.process_time() - begin
        call()
    return (time.process_time() - start - computing) / reps


def _collective_rank(ctx):
    """{kind: [(bytes, CPU seconds per call)]}: ``bytes`` as the cost model counts them (the full tensor)."""
    compute, _ = _busy(GAP_MATMULS)
    tables = {}
    for kind in _COLLECTIVES:
        rows = []
        for size in SIZES:
            call = collective_call(kind, torch.zeros(size // 4), ctx.world_size)  # as the calibration times it
            call()  # warm-up
            dist.barrier()
            rows.append((size, _cpu_around(compute, call, 12 if size < 1 << 21 else 6)))
            dist.barrier()  # the last call's tail on the other ranks is theirs, not the next size's
        tables[kind] = rows
    return tables


def _message_rank(ctx):
    """[(bytes, CPU seconds per message)] of this rank's side of a relay: rank 0 sends, rank 1 receives."""
    compute, _ = _busy(GAP_MATMULS)
    rows = []
    for size in MESSAGE_SIZES:
        buf = torch.zeros(size // 4)
        if ctx.rank == 0:
            call = lambda: dist.isend(buf, 1).wait()  # noqa: E731  (as the pp executor talks)
        else:
            call = lambda: dist.irecv(buf, 0).wait()  # noqa: E731
        dist.barrier()
        rows.append((size, _cpu_around(compute, call, 32)))
        dist.barrier()
    return rows


def measure_tables() -> dict:
    """{2: collective tables, 4: ..., "send": rows, "recv": rows}, measured now."""
    opts = dict(trace=False, memory=False, timeout=120)
    tables = {world: launch(_collective_rank, world_size=world, **opts)[0] for world in (2, 4)}
    tables["send"], tables["recv"] = launch(_message_rank, world_size=2, **opts)
    return tables


def interpolate(rows, nbytes) -> float:
    """Linear between measured sizes, the smallest size's cost below them, proportional beyond."""
    sizes = [size for size, _ in rows]
    if nbytes <= sizes[0]:
        return rows[0][1]
    if nbytes >= sizes[-1]:
        return rows[-1][1] * nbytes / sizes[-1]
    k = bisect.bisect_left(sizes, nbytes)
    (s0, t0), (s1, t1) = rows[k - 1], rows[k]
    return t0 + (nbytes - s0) * (t1 - t0) / (s1 - s0)


def program_cpu(strategy, world, kwargs, hw, tables) -> float:
    """Predicted CPU seconds per step of the busiest rank: its program's compute and step overhead,
    and the measured CPU of each collective (by kind, size and the nearer measured group size)
    and each message (by side and size)."""
    cfg = make_config(strategy, world, **kwargs)
    plan = Pricer(hw, cfg.model, cfg.world_size, cfg.batch_size, cfg.options)
    calibration_stretch = max(1.0, (1 + hw.background) / hw.cores) if hw.cores else 1.0
    per_rank = []
    for program in get_strategy(strategy).program(plan):
        cpu = hw.step_overhead / calibration_stretch
        for ins in program:
            if isinstance(ins, Compute):
                cpu += ins.seconds / calibration_stretch
            elif isinstance(ins, Collective):
                group = tables[min((2, 4), key=lambda n: abs(n - len(ins.group)))]
                cpu += interpolate(group.get(ins.kind, group["all_reduce"]), ins.nbytes)
            elif isinstance(ins, P2P):
                cpu += sum(interpolate(tables[op.side], op.nbytes) for op in ins.ops)
        per_rank.append(cpu)
    return max(per_rank)
