"""Every pipeline schedule on 4 simulated (CPU/gloo) ranks: the measured bubble next to the
formula and to the schedule's own lists on unit costs, and the step time next to torch's.

The model: 8 layers whose work is simulated device time, slept (a rank on a shared 2-core laptop
would otherwise measure the machine): each layer's forward F, its input-gradient part B and its
weight-gradient part W take ``LAYER_MS`` each (F = B = W, the zero-bubble paper's assumption; the
whole backward is 2F as in the other benchmarks). B sleeps on the input's path, W on the weight's
path, so a schedule that splits the backward (B now, W later) really moves that time, in mpkit's
executor as in torch's ``stage_backward_weight``.

Measured bubble: share of rank-time not in forward/backward over one step's window
(``Trace.pipeline_bubble``), median over steps after the first. "lists": the same number played by
``mpkit.parallel.schedule``'s lists on the simulator (forward 1, backward 2, W 1 of it). "formula":
the paper's closed form where there is one: (p-1)/(m+p-1) (GPipe, 1F1B), (p-1)/(v·m+p-1)
(interleaved, looped BFS), (p-1)/(3m+p-1) (ZB-H1: (p-1)(F+B-W) idle per rank); ZB-V's is ~0 for
m >= 2p; DualPipeV's has none here (its point, overlapping a forward with another micro-batch's
backward, needs two streams that CPU ranks do not have). Step time: median over steps after the
first, of the median over runs taking turns with torch's schedule class on the same stages
(``benchmarks/turns.py``).

    python benchmarks/pp_schedules.py [--runs 3] [--steps 4] [--only zbv dualpipev]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

import torch
import torch.distributed.pipelining as torch_pp
from torch import nn

import mpkit
from mpkit.parallel import pipeline, schedule, simulate
from mpkit.parallel.pipeline.schedules import chunks_per_rank, placement
from pp import step_times  # benchmarks/pp.py
from turns import medians_taking_turns  # benchmarks/turns.py

WORLD, M, LAYERS, HIDDEN, BATCH, LAYER_MS = 4, 8, 8, 32, 64, 10.0
# (mpkit schedule, virtual stages, torch class)
SCHEDULES = [("gpipe", 1, "ScheduleGPipe"), ("1f1b", 1, "Schedule1F1B"),
             ("interleaved", 2, "ScheduleInterleaved1F1B"), ("looped_bfs", 2, "ScheduleLoopedBFS"),
             ("interleaved_zb", 1, "ScheduleInterleavedZeroBubble"),
             ("interleaved_zb", 2, "ScheduleInterleavedZeroBubble"), ("zbv", 2, "ScheduleZBVZeroBubble"),
             ("dualpipev", 2, "ScheduleDualPipeV")]


class _Sleep(torch.autograd.Function):
    """Identity; its backward sleeps ``seconds`` (simulated device time of a gradient part)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class SleepyLinear(nn.Linear):
    """A Linear whose forward, input gradient and weight gradient each take ``LAYER_MS``."""

    def forward(self, x):
        s = LAYER_MS / 1e3
        time.sleep(s)
        return torch.relu(nn.functional.linear(_Sleep.apply(x, s), _Sleep.apply(self.weight, s), self.bias))


def model():
    torch.manual_seed(0)
    return nn.Sequential(*[SleepyLinear(HIDDEN, HIDDEN) for _ in range(LAYERS)])


def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, HIDDEN, generator=g), torch.randn(BATCH, HIDDEN, generator=g)


def formula(name, p, m, v):
    if name in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if name in ("interleaved", "looped_bfs"):
        return (p - 1) / (v * m + p - 1)
    if name == "interleaved_zb" and v == 1:
        return (p - 1) / (3 * m + p - 1)
    return None


def _stages(p, name, v):
    count = p * chunks_per_rank(name, v)
    per = LAYERS // count
    full = model()
    return [full[i * per:(i + 1) * per] for i in range(count)]


def _ours(ctx, name, v, steps):
    p = ctx.world_size
    stages = _stages(p, name, v)
    where = placement(name, p, v)
    pipe = pipeline({s: stages[s] for s in range(len(stages)) if where[s] == ctx.rank}, num_stages=len(stages),
                    schedule=name, micro_batches=M, loss_fn=nn.functional.mse_loss, virtual_stages=v)
    x, y = batch()
    for k in range(steps):
        ctx.set_step(k)
        pipe.step(x, y)
        for q in pipe.parameters():
            q.grad = None
    ctx.set_step(None)


def _torch(ctx, name, v, torch_name, steps):
    p = ctx.world_size
    stages = _stages(p, name, v)
    where = placement(name, p, v)
    mine = [torch_pp.PipelineStage(stages[s], s, len(stages), ctx.device) for s in range(len(stages))
            if where[s] == ctx.rank]
    cls = getattr(torch_pp, torch_name)
    sched = cls(mine[0] if torch_name in ("ScheduleGPipe", "Schedule1F1B") else mine, M,
                loss_fn=nn.functional.mse_loss)
    x, y = batch()
    first, last = 0 in [s.stage_index for s in mine], len(stages) - 1 in [s.stage_index for s in mine]
    for k in range(steps):
        ctx.set_step(k)
        with ctx.trace.span("compute", name=f"torch {torch_name}"):
            sched.step(*([x] if first else []), **({"target": y} if last else {}))
        for s in mine:
            s.submod.zero_grad(set_to_none=True)
    ctx.set_step(None)


def measure(fn, args, steps, bubble=False):
    result = mpkit.launch(fn, WORLD, args=(*args, steps), timeout=300, memory=False)
    time_ = statistics.median(step_times(result.trace, steps)[1:])
    if bubble:
        return time_, statistics.median(result.trace.pipeline_bubble(s) for s in range(1, steps))
    return time_


def rows(runs=3, steps=4, only=None) -> list[dict]:
    out = []
    for name, v, torch_name in SCHEDULES:
        if only and name not in only:
            continue
        bubbles = []

        def ours_time(name=name, v=v, bubbles=bubbles):
            t, b = measure(_ours, (name, v), steps, bubble=True)
            bubbles.append(b)
            return t
        times = medians_taking_turns({"ours": ours_time,
                                      "torch": partial(measure, _torch, (name, v, torch_name), steps)}, runs)
        lists = float(simulate(schedule(name, WORLD, M, v), forward=1, backward=2, weight=1).bubble)
        out.append({"schedule": name, "v": v, "torch": torch_name, "measured": statistics.median(bubbles),
                    "lists": lists, "formula": formula(name, WORLD, M, v),
                    "ours_ms": times["ours"] * 1e3, "torch_ms": times["torch"] * 1e3})
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--only", nargs="+", choices=sorted({n for n, *_ in SCHEDULES}), help="these schedules only")
    args = parser.parse_args(argv)
    print(f"p={WORLD} ranks on {len(os.sched_getaffinity(0))} CPU cores, m={M}, {LAYERS} layers x "
          f"{LAYER_MS:g} ms for each of F, B, W (slept); median over {args.runs} alternating runs of the median "
          f"of steps 2..{args.steps}")
    print(f"{'schedule':<18} {'measured':>9} {'lists':>7} {'formula':>8} {'ours ms':>8} {'torch ms':>9} {'ratio':>6}  "
          f"torch class")
    for r in rows(args.runs, args.steps, args.only):
        f = "-" if r["formula"] is None else f"{r['formula']:.1%}"
        label = r["schedule"] + (f" v={r['v']}" if r["v"] > 1 or r["schedule"] == "interleaved_zb" else "")
        print(f"{label:<18} {r['measured']:>9.1%} {r['lists']:>7.1%} {f:>8} {r['ours_ms']:>8.0f} "
              f"{r['torch_ms']:>9.0f} {r['ours_ms'] / r['torch_ms']:>6.2f}  {r['torch']}")


if __name__ == "__main__":
    main()
