"""Predicted memory per rank and category: model states from the ZeRO formulas on each rank's
real parameter count, activations from the profiled piece times the micro-batches in flight.

A run's ``precision`` sets the model states' bytes per parameter (``recipe``); its activations are
priced as fp32 (autocast's 2-byte saved inputs make the measured ones smaller: an upper bound).
Its ``recompute`` is in the profile (``Pricer.piece``): a checkpointed piece keeps what it keeps.

Conventions follow the measured ``MemoryReport``: ``parameters``/``gradients``/``activations``/
``other`` are the largest value during a step; ``optimizer`` is the steady state (Adam's two
moments, plus the 4-byte step counter torch keeps per tensor in fp32 runs), not the short-lived
temporaries of the foreach step itself.
"""
from __future__ import annotations

import math

import torch

from mpkit.observe.memory import CATEGORIES
from mpkit.simulator import formulas
from mpkit.layout import Layout
from mpkit.parallel.expert_parallel import expert_parallel
from mpkit.parallel.pipeline.schedules import chunks_per_rank, placement, schedule
from mpkit.parallel.pipeline.simulation import simulate
from mpkit.parallel.pipeline.split import partition
from mpkit.parallel.sharded_optimizer import shard_numel
from mpkit.pricing.pricing import Pricer
from mpkit.strategies.fsdp import unsharded_bytes
from mpkit.strategies.tp import shard as tp_shard
from mpkit.vocabulary import CLOSED_FORM_SCHEDULES


class PredictedMemory(dict):
    """{category: bytes} of one rank, with the attributes ``mpkit.plot.memory`` reads from a
    ``MemoryReport`` (so a prediction plots like a run)."""

    def __init__(self, rank, values, capacity=None):
        super().__init__({c: int(values.get(c, 0)) for c in CATEGORIES})
        self.rank = rank
        self.capacity = capacity

    @property
    def max_by_category(self):
        return dict(self)

    peak_breakdown = final_by_category = max_by_category

    @property
    def peak_total(self) -> int:
        return sum(self.values())

    def __repr__(self):
        return f"PredictedMemory(rank={self.rank}, " + ", ".join(f"{k}={v}" for k, v in self.items()) + ")"


def recipe(plan: Pricer) -> str:
    """The precision recipe of ``formulas.PRECISION_RECIPES``: a bf16 machine preset prices the
    textbook mixed precision; a run's autocast keeps fp32 master weights, gradients and moments."""
    if plan.hw.precision == "bf16":
        return "mixed"
    return "fp32" if plan.precision == "fp32" else "autocast"


def _states(plan: Pricer, numel: float, stage: int, tensors: int, n: int) -> dict:
    """Parameters, gradients and Adam state of ``numel`` parameters in ``tensors`` tensors."""
    name = recipe(plan)
    param_bytes, grad_bytes, optim_bytes = formulas.PRECISION_RECIPES[name]
    out = formulas.zero_memory(numel, n, stage, param_bytes=param_bytes, grad_bytes=grad_bytes, optim_bytes=optim_bytes)
    if name == "mixed":
        return out
    out["optimizer"] += 4 * tensors  # torch.optim.Adam: one float32 step counter per tensor
    return out


def _scale(plan: Pricer, nbytes: float) -> float:
    return nbytes * plan.hw.bytes_per_element / 4


def _input_bytes(plan: Pricer, batch: int) -> int:
    """Bytes of ``batch`` inputs as ``models.make_batch`` makes them (float features or token ids)."""
    return batch * (plan.cfg.d_in * 4 if plan.cfg.kind == "mlp" else plan.cfg.seq_len * 8)


def _target_bytes(plan: Pricer, batch: int) -> int:
    return batch * (8 if plan.cfg.kind == "mlp" else plan.cfg.seq_len * 8)


def _batch_bytes(plan: Pricer, batch: int) -> int:
    return _input_bytes(plan, batch) + _target_bytes(plan, batch)


def _largest_tensor(plan: Pricer, profs) -> float:
    """Accumulating into an existing .grad (dp's bucket views, zero1's flat buffer, pp's
    micro-batches) briefly holds one fresh gradient next to it: the largest tensor's bytes."""
    biggest = max(math.prod(s) for p in profs for shapes in p.layer_shapes.values() for s in shapes)
    return _scale(plan, 4 * biggest) if plan.hw.precision == "fp32" else 0


def predict_memory(strategy: str, plan: Pricer) -> list[PredictedMemory]:
    n, cap = plan.world, plan.hw.memory_bytes
    full = plan.piece(batch=1)
    psi = full.total_param_bytes // 4
    tensors = sum(len(s) for s in full.layer_shapes.values())

    def replicated(local_batch, stage=0, numel=psi, ntensors=tensors, shards=n):
        prof = plan.piece(batch=local_batch)
        values = _states(plan, numel, stage, ntensors, shards)
        extra = _batch_bytes(plan, plan.batch) - _batch_bytes(plan, local_batch)  # the global batch is made whole
        values["activations"] = _scale(plan, prof.memory["activations"] + extra)
        values["other"] = _scale(plan, prof.memory["other"])
        return values

    if strategy in ("single", "ddp"):
        return [PredictedMemory(r, replicated(plan.batch // n), cap) for r in range(n)]
    if strategy == "dp":
        values = replicated(plan.batch // n)
        values["gradients"] += _largest_tensor(plan, [full])
        return [PredictedMemory(r, values, cap) for r in range(n)]
    if strategy == "zero1":
        flat = shard_numel(psi, n) * n
        out = []
        for r in range(n):
            values = replicated(plan.batch // n, stage=1, numel=flat, ntensors=1)
            values["gradients"] += _largest_tensor(plan, [full])
            values["gradients"] += _scale(plan, 4 * flat / n) if plan.hw.precision == "fp32" else 0  # reduced slice
            out.append(PredictedMemory(r, values, cap))
        return out
    if strategy == "fsdp":
        padded = sum(math.ceil(s[0] / n) * n * math.prod(s[1:]) for sh in full.layer_shapes.values() for s in sh)
        values = replicated(plan.batch // n, stage=3, numel=padded)
        largest = max(unsharded_bytes(full.layer_shapes[i], n) for i in full.layers)
        values["other"] += _scale(plan, largest)  # one unit's gathered parameters at a time
        return [PredictedMemory(r, values, cap) for r in range(n)]
    if strategy == "tp":
        prof = plan.piece(tp=n, shard=tp_shard)
        numel = prof.total_param_bytes // 4
        values = _states(plan, numel, 0, sum(len(s) for s in prof.layer_shapes.values()), 1)
        values["activations"] = _scale(plan, prof.memory["activations"])
        values["other"] = _scale(plan, prof.memory["other"])
        return [PredictedMemory(r, values, cap) for r in range(n)]
    if strategy == "sp":  # tp's slices; every stored activation split t ways (Korthikanti: 34/t per layer)
        prof = plan.piece(tp=n, shard=tp_shard)
        values = _states(plan, prof.total_param_bytes // 4, 0, sum(len(s) for s in prof.layer_shapes.values()), 1)
        values["activations"] = _scale(plan, plan.piece(batch=plan.batch).memory["activations"] / n)
        values["other"] = _scale(plan, prof.memory["other"])
        return [PredictedMemory(r, values, cap) for r in range(n)]
    if strategy == "cp":  # the whole model, 1/cp of every sequence's tokens: activations as 1/cp of the batch
        return [PredictedMemory(r, replicated(max(1, plan.batch // n)), cap) for r in range(n)]
    if strategy == "ep":  # this rank's experts and everything else whole, its slice of the batch
        local = _expert_parallel_shapes(plan, n)
        numel = sum(math.prod(s) for s in local)
        return [PredictedMemory(r, replicated(plan.batch // n, numel=numel, ntensors=len(local)), cap)
                for r in range(n)]
    if strategy == "ps":  # the server keeps parameters, gradient buffers and Adam; workers no optimizer
        server = _states(plan, psi, 0, tensors, 1)
        worker = replicated(plan.batch // (n - 1), shards=1)
        worker["optimizer"] = 0
        worker["activations"] += _scale(plan, _batch_bytes(plan, plan.batch // (n - 1))
                                        - _batch_bytes(plan, plan.batch // n))  # replicated() assumed N shards
        return [PredictedMemory(0, server, cap), *(PredictedMemory(r, worker, cap) for r in range(1, n))]
    if strategy == "mp":
        return _pipeline_memory(plan, cap, "gpipe", 1, 1, Layout(pp=n))
    if strategy == "pp":
        name = plan.options["schedule"]
        v = chunks_per_rank(name, plan.options["virtual_stages"])
        return _pipeline_memory(plan, cap, name, plan.options["micro_batches"], v, Layout(pp=n))
    if strategy == "3d":
        o = plan.options
        v = o["virtual_stages"] if o["schedule"] == "interleaved" else 1
        return _pipeline_memory(plan, cap, o["schedule"], o["micro_batches"], v,
                                Layout(dp=o["dp"], pp=o["pp"], tp=o["tp"]), o["zero"])
    raise ValueError(f"no memory model for strategy={strategy!r}")


def _expert_parallel_shapes(plan: Pricer, n: int) -> list:
    """Parameter shapes one expert-parallel rank holds: its experts/n experts and every other parameter."""
    with torch.device("meta"):
        model = expert_parallel(plan.cfg.build(), rank=0, world_size=n)
    return [tuple(p.shape) for p in model.parameters()]


def _pipeline_memory(plan, cap, name, m, v, grid, zero=False):
    """Stages of a pipeline on ``grid.pp`` ranks (each stage's Linears split over ``grid.tp``, its
    micro-batches cut from a 1/``grid.dp`` shard of the batch; ZeRO-1 over dp when ``zero``)."""
    p = grid.pp
    groups = partition([b // 4 for b in plan.piece(batch=1).param_bytes.values()], p * v)
    mb = plan.batch // grid.dp // m
    shard = tp_shard if grid.tp > 1 else None
    out = []
    where = placement(name, p, v)
    for rank in range(grid.world_size):
        r = grid.coords(rank)["pp"]
        stages = [s for s in range(p * v) if where[s] == r]
        profs = [plan.piece(groups[s].start, groups[s].stop, batch=mb, tp=grid.tp, shard=shard) for s in stages]
        numel = sum(prof.total_param_bytes for prof in profs) // 4
        ntensors = sum(len(sh) for prof in profs for sh in prof.layer_shapes.values())
        if zero:
            flat = shard_numel(numel, grid.dp) * grid.dp
            values = _states(plan, flat, 1, 1, grid.dp)
            values["gradients"] += _scale(plan, 4 * flat / grid.dp) if plan.hw.precision == "fp32" else 0
        else:
            values = _states(plan, numel, 0, ntensors, 1)
        if m > 1 or grid.dp > 1:
            values["gradients"] += _largest_tensor(plan, profs)
        # every rank makes the whole batch; a profile also counted its own micro-batch's copy
        own = [_target_bytes(plan, mb) + (_input_bytes(plan, mb) if groups[s].start == 0 else 0) for s in stages]
        retained = [prof.retained - o for prof, o in zip(profs, own)]
        peak_one = max(prof.memory["activations"] - o for prof, o in zip(profs, own))
        in_flight = (formulas.inflight_activations(name, p, m, r, v) if name in CLOSED_FORM_SCHEDULES
                     else simulate(schedule(name, p, m, v)).peak_in_flight[r])  # the newer ones: from their lists
        held = (in_flight - 1) * sum(retained) / len(retained)
        values["activations"] = _scale(plan, _batch_bytes(plan, plan.batch) + held + peak_one)
        values["other"] = _scale(plan, max(prof.memory["other"] for prof in profs))
        out.append(PredictedMemory(rank, values, cap))
    return out
