"""Pipeline parallel on 4 simulated (CPU/gloo) ranks.

(a) ``mpkit.parallel.pipeline`` (the ``pp`` strategy) 1F1B against ``torch.distributed.pipelining``'s
    ``Schedule1F1B`` on the same model, split and micro-batches; runs take turns (``benchmarks/_common/turns.py``) so machine noise hits both alike; a
    run's step time is the median of its steps after the first, the reported time the median
    over runs. Memory tracking off, trace on (``step_times`` reads it).
(b) the measured bubble against (p-1)/(m+p-1) for m = 1..16 on balanced stages (an mlp of 8
    equal layers, 2 per rank), from the trace: share of rank-time not in forward/backward over
    one step's forward/backward window (``Trace.pipeline_bubble``), median over steps after
    the first. Each layer carries simulated device time (``layer_ms``: 10 ms forward, 20 ms
    backward, slept): four ranks on a 2-core laptop would otherwise share cores exactly when
    the pipeline is full, and the measurement would be the machine's, not the pipeline's.

(c) with ``--schedules``: every schedule on 4 ranks, the measured bubble next to the formula and to
    the schedule's own lists on unit costs, and the step time next to torch's schedule class on
    the same stages. The model: 8 layers whose work is simulated device time, slept: each layer's
    forward F, its input-gradient part B and its weight-gradient part W take ``LAYER_MS`` each
    (F = B = W, the zero-bubble paper's assumption; the whole backward is 2F as above). B sleeps on
    the input's path, W on the weight's path, so a schedule that splits the backward (B now, W
    later) really moves that time, in mpkit's executor as in torch's ``stage_backward_weight``.
    "lists": the bubble ``mpkit.parallel.schedule``'s lists give on the simulator (forward 1,
    backward 2, W 1 of it). "formula": the paper's closed form where there is one: (p-1)/(m+p-1)
    (GPipe, 1F1B), (p-1)/(v·m+p-1) (interleaved, looped BFS), (p-1)/(3m+p-1) (ZB-H1: (p-1)(F+B-W)
    idle per rank); ZB-V's is ~0 for m >= 2p; DualPipeV's has none here (its point, overlapping a
    forward with another micro-batch's backward, needs two streams that CPU ranks do not have).
    Step time: median over steps after the first, of the median over runs taking turns with
    torch's schedule class.

    python benchmarks/pp.py [--runs 5] [--steps 6]                            # (a) and (b)
    python benchmarks/pp.py --schedules [--runs 3] [--steps 4] [--only zbv dualpipev]   # (c)
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
from _common.turns import medians_taking_turns
from mpkit.crosscheck import pipelining as torch_pipelining
from mpkit.models import ModelConfig, describe
from mpkit.parallel import pipeline, schedule, simulate
from mpkit.parallel.pipeline.schedules import chunks_per_rank, placement
from mpkit.strategies import make_config

WORLD = 4
VERSUS_TORCH = dict(model="gpt", hidden=128, layers=4, seq_len=32, batch_size=32, micro_batches=8)
BALANCED = dict(model="mlp", layers=8, hidden=64, d_in=64, classes=8, batch_size=64, layer_ms=10.0)
BUBBLE_MS = (1, 2, 4, 8, 16)
# (c): micro-batches, layers, width, batch and the simulated time of each layer's F, B and W
M, LAYERS, HIDDEN, BATCH, LAYER_MS = 8, 8, 32, 64, 10.0
# (mpkit schedule, virtual stages, torch class)
SCHEDULES = [("gpipe", 1, "ScheduleGPipe"), ("1f1b", 1, "Schedule1F1B"),
             ("interleaved", 2, "ScheduleInterleaved1F1B"), ("looped_bfs", 2, "ScheduleLoopedBFS"),
             ("interleaved_zb", 1, "ScheduleInterleavedZeroBubble"),
             ("interleaved_zb", 2, "ScheduleInterleavedZeroBubble"), ("zbv", 2, "ScheduleZBVZeroBubble"),
             ("dualpipev", 2, "ScheduleDualPipeV")]


def step_times(trace, steps) -> list[float]:
    """Per step: first to last event of that step on any rank (as ``Run.step_times``)."""
    out = []
    for step in range(steps):
        events = [e for e in trace.events if e.step == step]
        out.append(max(e.end for e in events) - min(e.start for e in events))
    return out


def ours(steps, **kwargs) -> float:
    run = mpkit.train("pp", WORLD, steps=steps, schedule="1f1b", memory=False, **kwargs)
    return statistics.median(run.step_times()[1:])


def torch_1f1b(steps, **kwargs) -> float:
    cfg = make_config("pp", WORLD, steps=steps, schedule="1f1b", **kwargs)
    result = mpkit.launch(torch_pipelining.run_rank, WORLD, args=(cfg,), timeout=120, memory=False)
    return statistics.median(step_times(result.trace, steps)[1:])


def versus_torch(runs, steps) -> dict:
    times = medians_taking_turns({"ours": partial(ours, steps, **VERSUS_TORCH),
                                  "torch": partial(torch_1f1b, steps, **VERSUS_TORCH)}, runs)
    a, b = times["ours"], times["torch"]
    return {"benchmark": f"pp 1f1b vs torch Schedule1F1B, m={VERSUS_TORCH['micro_batches']}",
            "ours_ms": a * 1e3, "baseline_ms": b * 1e3, "ratio": a / b, "target": "<= 1.05"}


def bubble_rows(steps, schedule="1f1b") -> list[dict]:
    out = []
    for m in BUBBLE_MS:
        run = mpkit.train("pp", WORLD, steps=steps, schedule=schedule, micro_batches=m, memory=False, **BALANCED)
        measured = statistics.median(run.trace.pipeline_bubble(s) for s in range(1, steps))
        formula = (WORLD - 1) / (m + WORLD - 1)
        out.append({"schedule": schedule, "m": m, "measured": measured, "formula": formula,
                    "diff_points": (measured - formula) * 100,
                    "step_ms": statistics.median(run.step_times()[1:]) * 1e3})
    return out


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


def schedule_rows(runs=3, steps=4, only=None) -> list[dict]:
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


def print_schedules(runs, steps, only):
    print(f"(c) p={WORLD} ranks on {len(os.sched_getaffinity(0))} CPU cores, m={M}, {LAYERS} layers x "
          f"{LAYER_MS:g} ms for each of F, B, W (slept); median over {runs} alternating runs of the median "
          f"of steps 2..{steps}")
    print(f"{'schedule':<18} {'measured':>9} {'lists':>7} {'formula':>8} {'ours ms':>8} {'torch ms':>9} {'ratio':>6}  "
          f"torch class")
    for r in schedule_rows(runs, steps, only):
        f = "-" if r["formula"] is None else f"{r['formula']:.1%}"
        label = r["schedule"] + (f" v={r['v']}" if r["v"] > 1 or r["schedule"] == "interleaved_zb" else "")
        print(f"{label:<18} {r['measured']:>9.1%} {r['lists']:>7.1%} {f:>8} {r['ours_ms']:>8.0f} "
              f"{r['torch_ms']:>9.0f} {r['ours_ms'] / r['torch_ms']:>6.2f}  {r['torch']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="default 5; 3 with --schedules")
    parser.add_argument("--steps", type=int, default=None, help="default 6; 4 with --schedules")
    parser.add_argument("--schedules", action="store_true", help="run (c) only: every schedule against torch's")
    parser.add_argument("--only", nargs="+", choices=sorted({n for n, *_ in SCHEDULES}),
                        help="with --schedules: these schedules only")
    args = parser.parse_args(argv)
    if args.schedules:
        return print_schedules(args.runs or 3, args.steps or 4, args.only)
    args.runs, args.steps = args.runs or 5, args.steps or 6
    cores = len(os.sched_getaffinity(0))
    sizes = {k: v for k, v in VERSUS_TORCH.items() if k not in ("model", "batch_size", "micro_batches")}
    print(f"{WORLD} ranks on {cores} CPU cores; (b) sleeps its simulated device time, so it holds on fewer cores too")
    print(f"(a) {describe(ModelConfig(kind='gpt', **sizes))}, batch {VERSUS_TORCH['batch_size']}; "
          f"median over {args.runs} alternating runs of the median of steps 2..{args.steps}")
    a = versus_torch(args.runs, args.steps)
    print(f"{'benchmark':<42} {'ours ms':>9} {'baseline ms':>12} {'ratio':>7}  target")
    print(f"{a['benchmark']:<42} {a['ours_ms']:>9.1f} {a['baseline_ms']:>12.1f} {a['ratio']:>7.3f}  {a['target']}")
    sizes = {k: v for k, v in BALANCED.items() if k not in ("model", "batch_size")}
    print(f"\n(b) bubble, 1f1b, p={WORLD}, {describe(ModelConfig(kind='mlp', **sizes))} + {BALANCED['layer_ms']:g} ms "
          f"simulated device time per layer forward (2x backward), batch {BALANCED['batch_size']}; "
          f"median over steps 2..{args.steps}; target |diff| <= 5 points")
    print(f"{'m':>3} {'measured':>9} {'(p-1)/(m+p-1)':>14} {'diff (points)':>14} {'step ms':>9}")
    for r in bubble_rows(args.steps):
        print(f"{r['m']:>3} {r['measured']:>9.1%} {r['formula']:>14.1%} {r['diff_points']:>+14.1f} "
              f"{r['step_ms']:>9.1f}")


if __name__ == "__main__":
    main()
