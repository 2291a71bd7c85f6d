"""A rank's CPU seconds per step (C), which the fair share of shared cores turns into a step.

On ``cpu-sim`` ranks share a few cores with each other and with whatever else the machine runs.
The engine plays a step's dependencies and stretches compute by how many ranks compute at once;
under load that is too fast (BENCHMARKS.md, "Cost model accuracy"): a rank needs C CPU-seconds a
step, its compute *and* what gloo's threads and the executor spend on every message and
collective, and with k runnable processes per core it gets about 1/k of a core while busy, so its
busy part of the step lasts about k·C (``mpkit.costmodel.prediction.fair_share_play`` lengthens each
rank's instructions to that and plays the step again).

C is a linear model of the step's program, fitted by ``mpkit.sim.calibrate`` to the CPU time
real multi-rank training steps used (the process's, gloo's threads included) under the load of
the moment: ``compute`` seconds per second of priced compute, ``micro_batch_compute`` per second
of a pipeline's compute, which runs one micro-batch at a time between messages, each burst after
the rank slept (under load it cost 1.3-1.8 times the CPU per priced second of a whole step's
compute in four calibrations), ``collective_step`` seconds per
ring step of a collective (2(n-1) for an all-reduce of n ranks and for gloo's reduce-scatter, which
all-reduces the whole tensor; n-1 for the others) and
``collective_byte`` per byte a rank sends in them, ``message`` seconds per send or receive and
``message_byte`` per byte of it. The CPU of one operation measured alone misses much of a rank's
CPU in a step (measured 26-38% low), which is why the coefficients are fitted to whole steps.
``predict`` reads C from the programs priced without simulated device time (``layer_ms``): a
sleeping layer needs no CPU.
"""
from __future__ import annotations

import numpy as np

from mpkit.simulator.engine import Collective, Compute, P2P

TERMS = ("compute", "micro_batch_compute", "collective_step", "collective_byte", "message", "message_byte")


def ring_steps(kind: str, group_size: int) -> int:
    """Messages a rank sends in a collective as gloo runs it: a ring all-reduce is a reduce-scatter
    then an all-gather, 2(n-1); gloo's reduce-scatter is an all-reduce of the whole tensor (a clone,
    ``allreduce``, then the rank's chunk copied out: ``ProcessGroupGloo::reduce_scatter_tensor_coalesced``;
    measured here 0.8-1.6x the CPU of an all-reduce of the same tensor), so it costs the same;
    an all-gather n-1."""
    return (2 if kind in ("all_reduce", "reduce_scatter") else 1) * (group_size - 1)


def program_terms(program) -> np.ndarray:
    """The amounts the CPU model's coefficients multiply, for one rank's program (``TERMS`` order);
    compute is counted as priced, before any stretch for shared cores."""
    terms = np.zeros(len(TERMS))
    for ins in program:
        if isinstance(ins, Compute):
            terms[0 if ins.micro_batch is None else 1] += ins.seconds
        elif isinstance(ins, Collective):
            n = len(ins.group)
            if n > 1:
                steps = ring_steps(ins.kind, n)
                terms[2] += steps
                terms[3] += steps * ins.nbytes / n
        elif isinstance(ins, P2P):
            for op in ins.ops:
                terms[4] += 1
                terms[5] += op.nbytes
    return terms


def rank_cpu(coefficients: dict, program) -> float:
    """Predicted CPU seconds of one rank's program (0 without coefficients)."""
    if not coefficients:
        return 0.0
    return float(program_terms(program) @ np.array([coefficients.get(t, 0.0) for t in TERMS]))


def fit(samples, names=TERMS) -> dict:
    """Least squares, on relative error, of CPU seconds = terms · coefficients over [(terms,
    measured CPU seconds)], terms in the order of ``names``, kept non-negative greedily: the terms
    whose coefficients come out negative (noise; nothing costs less than nothing) are set to 0 and
    the rest refitted, until none is negative."""
    design = np.array([np.asarray(terms, dtype=float) / seconds for terms, seconds in samples])
    active = [j for j in range(len(names)) if design[:, j].any()]
    while True:
        coef = np.linalg.lstsq(design[:, active], np.ones(len(samples)), rcond=None)[0]
        if (coef >= 0).all() or len(active) == 1:
            break
        active = [j for j, c in zip(active, coef) if c >= 0] or active[:1]
    out = dict.fromkeys(names, 0.0)
    out.update({names[j]: max(float(c), 0.0) for j, c in zip(active, coef)})
    return out
