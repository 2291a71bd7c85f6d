"""Prices for the cost model's instructions: what a strategy's ``program(pricer)`` builds with.

Each strategy writes its step as per-rank instruction lists (``mpkit.simulator.engine``) beside its
``run_rank``, from the same plan objects the run executes; a ``Pricer`` turns the pieces of work
into seconds on one ``Hardware``: compute from the real model's op counts (``profile``),
collectives and messages from the machine's links or measured tables.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import torch

from mpkit.models import ModelConfig
from mpkit.simulator import formulas
from mpkit.simulator.engine import Collective, Compute, Msg, P2P
from mpkit.simulator.hardware import Hardware
from mpkit.pricing.profile import PieceProfile, profile_piece

@dataclass
class Pricer:
    """Everything a program needs: the machine, the model, the world and the options, and their prices."""

    hw: Hardware
    cfg: ModelConfig
    world: int
    batch: int
    options: dict
    slowdown: float = 1.0  # compute stretch when ranks share CPU cores (see predict)
    precision: str = "fp32"  # the run's recipe (TrainConfig.precision): model states in costmodel.memory
    recompute: str | None = None  # the run's recomputation: every piece is profiled checkpointed as it runs

    def piece(self, first=0, last=None, batch=None, tp=1, shard=None) -> PieceProfile:
        """The profile of layers ``first..last-1`` on ``batch`` samples; ``shard(model, rank,
        tp)`` slices them as a tensor-parallel strategy does (rank 0's slice)."""
        last = self.cfg.num_layers if last is None else last
        return profile_piece(self.cfg, first, last, self.batch if batch is None else batch, tp, shard, self.recompute)

    def meta_model(self):
        """The model on the meta device: its real parameters' shapes, no memory (bucket plans, shards)."""
        return _meta_model(self.cfg)

    def seconds(self, cost, phase) -> float:
        return self.hw.compute_time(cost, phase) * self.slowdown + cost.device_seconds

    def wire(self, nbytes) -> int:
        """Bytes on the wire at the machine's precision (profiles count fp32)."""
        return int(nbytes * self.hw.bytes_per_element / 4)

    def collective(self, kind, group, nbytes, key, async_op=False, name="", **tags) -> Collective:
        group, size = tuple(group), self.wire(nbytes)
        return Collective(kind, group, size, self.collective_time(kind, size, group), key, async_op, name, **tags)

    def collective_time(self, kind, size, group, gap=0.0) -> float:
        """Seconds of a collective moving ``size`` wire bytes among ``group``, issued after
        ``gap`` seconds of compute (which only measured tables tell apart)."""
        n, link = len(group), self.hw.link(group)
        if n == 1 or size <= 0:
            return 0.0
        measured = self.hw.measured_time(kind, size, n, gap)
        if measured is not None:
            return measured
        if kind == "all_reduce":
            ring = formulas.ring_allreduce_time(size, n, link.alpha, link.beta)
            if self.hw.allreduce == "ring":
                return ring
            return min(ring, formulas.tree_allreduce_time(size, n, link.alpha, link.beta))
        if kind in ("all_gather", "reduce_scatter", "all_to_all"):  # all-to-all: N-1 messages of S/N, as the ring
            return formulas.ring_reduce_scatter_time(size, n, link.alpha, link.beta)
        if kind == "broadcast":
            return math.ceil(math.log2(n)) * link.time(size)
        raise ValueError(f"no time model for collective {kind!r}")

    def p2p_time(self, src, dst, nbytes) -> float:
        return self.message_time(src, dst, self.wire(nbytes))

    def message_time(self, src, dst, size, gap=0.0) -> float:
        """Seconds of one message of ``size`` wire bytes: the hop measured in a world of this
        size where there is one (cpu-sim), else alpha + n·beta on the link between the ranks."""
        measured = self.hw.measured_time("p2p", size, self.world, gap)
        return measured if measured is not None else self.hw.p2p_link(src, dst).time(size)

    @cached_property
    def all_ranks(self) -> tuple:
        return tuple(range(self.world))




@lru_cache(maxsize=64)
def _meta_model(cfg: ModelConfig):
    with torch.device("meta"):
        return cfg.build()


def fwd_bwd(pricer, prof, stage=None, mb=None):
    return [Compute("forward", pricer.seconds(prof.cost("forward"), "forward"), stage, mb),
            Compute("backward", pricer.seconds(prof.cost("backward"), "backward"), stage, mb)]


def optimizer(pricer, prof, extra_ops=None):
    cost = prof.optimizer if extra_ops is None else prof.optimizer + extra_ops
    return Compute("optimizer", pricer.seconds(cost, "optimizer"))


def message(pricer, side, me, peer, key, nbytes, stage=None, mb=None, **event) -> P2P:
    """A blocking send or receive of ``nbytes`` between ``me`` and ``peer`` (a batch of one);
    ``event``: ``kind``, ``name``, ``record`` of ``engine.Msg``."""
    src, dst = (me, peer) if side == "send" else (peer, me)
    return P2P((Msg(side, peer, key, pricer.wire(nbytes), pricer.p2p_time(src, dst, nbytes), stage, mb, **event),))


def price_by_gap(plan, programs):
    """Re-price each collective and message by the compute its rank did since its previous
    communication (``Hardware.measured_time``); programs are unchanged where the machine has
    no measured tables (the GPU presets)."""
    if not plan.hw.measured:
        return programs
    out = []
    for rank, program in enumerate(programs):
        gap, priced = 0.0, []
        for ins in program:
            if isinstance(ins, Compute):
                gap += ins.seconds
            elif isinstance(ins, Collective):
                ins = replace(ins, seconds=plan.collective_time(ins.kind, ins.nbytes, ins.group, gap))
                gap = 0.0
            elif isinstance(ins, P2P):
                ops = tuple(op._replace(seconds=plan.message_time(*((rank, op.peer) if op.side == "send"
                                                                    else (op.peer, rank)), op.nbytes, gap))
                            for op in ins.ops)
                ins, gap = replace(ins, ops=ops), 0.0
            priced.append(ins)
        out.append(priced)
    return out

