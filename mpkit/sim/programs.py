"""One optimizer step of each strategy as per-rank instruction lists for ``engine.simulate``.

Each builder mirrors what ``mpkit/strategies/<name>.py`` does in its step, op for op: which
micro-batch sizes each rank computes (costs from ``profile``), which collectives or messages
follow, and in what order. Pipelines take their order from the pp strategy's own
``schedules.schedule`` — the same lists the executor runs — so predicted and measured
timelines can only differ in durations, never in order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from mpkit.models import ModelConfig
from mpkit.sim import formulas
from mpkit.sim.engine import Collective, Compute, P2P, Wait, WaitSends
from mpkit.sim.hardware import Hardware
from mpkit.sim.profile import Cost, PieceProfile, optimizer_cost, profile_piece

MiB = 2**20
DDP_FIRST_BUCKET = 1 * MiB  # torch DDP caps its first bucket at 1 MiB so communication starts early


@dataclass
class Plan:
    """Everything a builder needs: the machine, the model, the world and the options."""

    hw: Hardware
    cfg: ModelConfig
    world: int
    batch: int
    options: dict
    slowdown: float = 1.0  # compute stretch when ranks share CPU cores (see predict)

    def piece(self, first=0, last=None, batch=None, tp=1) -> PieceProfile:
        last = self.cfg.num_layers if last is None else last
        return profile_piece(self.cfg, first, last, self.batch if batch is None else batch, tp)

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
        if kind in ("all_gather", "reduce_scatter"):
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


def _fwd_bwd(plan, prof, stage=None, mb=None):
    return [Compute("forward", plan.seconds(prof.cost("forward"), "forward"), stage, mb),
            Compute("backward", plan.seconds(prof.cost("backward"), "backward"), stage, mb)]


def _optimizer(plan, prof, extra_ops=None):
    cost = prof.optimizer if extra_ops is None else prof.optimizer + extra_ops
    return Compute("optimizer", plan.seconds(cost, "optimizer"))


def single(plan):
    prof = plan.piece()
    return [[*_fwd_bwd(plan, prof), _optimizer(plan, prof)]]


def _buckets(prof, cap_bytes, first_cap=None):
    """dp_buckets.plan_buckets on layer granularity: reverse order, new bucket past the cap.
    Returns [(bytes, index of the layer whose backward completes it)]."""
    out, size, cap = [], 0, first_cap if first_cap is not None else cap_bytes
    for i in reversed(prof.layers):
        nbytes = prof.param_bytes[i]
        if size and size + nbytes > cap:
            out.append((size, last_layer))
            size, cap = 0, cap_bytes
        size += nbytes
        last_layer = i
    if size:
        out.append((size, last_layer))
    return out


def _data_parallel(plan, bucket_bytes, overlap, first_cap=None):
    """dp / ddp: forward, backward, bucketed all-reduce (after or during backward), optimizer."""
    local = plan.batch // plan.world
    prof = plan.piece(batch=local)
    buckets = _buckets(prof, bucket_bytes, first_cap)
    program = [Compute("forward", plan.seconds(prof.cost("forward"), "forward"))]
    if overlap:
        done_by = {layer: k for k, (_, layer) in enumerate(buckets)}
        for i in reversed(prof.layers):
            program.append(Compute("backward", plan.seconds(prof.cost("backward", [i]), "backward"), name=f"layer {i}"))
            if i in done_by:
                k = done_by[i]
                program.append(plan.collective("all_reduce", plan.all_ranks, buckets[k][0], ("bucket", k), True,
                                               f"bucket {k}"))
        program += [Wait(("bucket", k)) for k in range(len(buckets))]
    else:
        program.append(Compute("backward", plan.seconds(prof.cost("backward"), "backward")))
        program += [plan.collective("all_reduce", plan.all_ranks, size, ("bucket", k), name=f"bucket {k}")
                    for k, (size, _) in enumerate(buckets)]
    program.append(_optimizer(plan, prof))
    return [list(program) for _ in range(plan.world)]


def dp(plan):
    return _data_parallel(plan, int(plan.options["bucket_mb"] * MiB), plan.options["overlap"])


def ddp(plan):
    return _data_parallel(plan, int(plan.options["bucket_mb"] * MiB), True, first_cap=DDP_FIRST_BUCKET)


def padded_numel(total: int, parts: int) -> int:
    """zero1's flat buffer: the parameter count padded to a multiple of the world size."""
    return math.ceil(total / parts) * parts


def zero1(plan):
    """Reduce-scatter the flat gradient, Adam on this rank's slice, all-gather the parameters."""
    local = plan.batch // plan.world
    prof = plan.piece(batch=local)
    flat = padded_numel(prof.total_param_bytes // 4, plan.world) * 4
    step = optimizer_cost(((flat // 4 // plan.world,),))  # Adam sees one flat slice
    program = [*_fwd_bwd(plan, prof),
               plan.collective("reduce_scatter", plan.all_ranks, flat, ("grads",), name="grads"),
               Compute("optimizer", plan.seconds(step, "optimizer")),
               plan.collective("all_gather", plan.all_ranks, flat, ("params",), name="params")]
    return [list(program) for _ in range(plan.world)]


def fsdp(plan):
    """FSDP2 with one unit per layer: all-gather before each layer's forward and again before its
    backward, reduce-scatter after its backward, Adam on the local shards."""
    local = plan.batch // plan.world
    prof = plan.piece(batch=local)
    program = []
    gathered = {i: fsdp_unsharded_bytes(prof, i, plan.world) for i in prof.layers}
    for i in prof.layers:
        if gathered[i]:
            program.append(plan.collective("all_gather", plan.all_ranks, gathered[i], ("ag", i), name=f"layers.{i}"))
        program.append(Compute("forward", plan.seconds(prof.cost("forward", [i]), "forward"), name=f"layer {i}"))
    for i in reversed(prof.layers):
        if gathered[i]:
            program.append(plan.collective("all_gather", plan.all_ranks, gathered[i], ("ag-b", i), name=f"layers.{i}"))
        program.append(Compute("backward", plan.seconds(prof.cost("backward", [i]), "backward"), name=f"layer {i}"))
        if gathered[i]:
            program.append(plan.collective("reduce_scatter", plan.all_ranks, gathered[i], ("rs", i),
                                           name=f"layers.{i}"))
    shapes = tuple((math.ceil(s[0] / plan.world), *s[1:]) for i in prof.layers for s in prof.layer_shapes[i])
    program.append(Compute("optimizer", plan.seconds(optimizer_cost(shapes), "optimizer")))
    return [list(program) for _ in range(plan.world)]


def fsdp_unsharded_bytes(prof: PieceProfile, layer: int, world: int) -> int:
    """Bytes of one FSDP2 unit once gathered: every tensor's dim 0 padded to a multiple of N."""
    return sum(math.ceil(s[0] / world) * world * math.prod(s[1:]) * 4 for s in prof.layer_shapes[layer])


def tp(plan):
    """Megatron tensor parallel: the whole batch on every rank, the tp strategy's own slices and
    its f/g all-reduces in the order its code issues them (recorded while profiling)."""
    prof = plan.piece(tp=plan.world)
    program = []
    for phase in ("forward", "backward"):
        table = getattr(prof, phase)
        order = prof.layers if phase == "forward" else reversed(prof.layers)
        for i in order:
            for k, item in enumerate(table[i]):
                if hasattr(item, "flops"):
                    program.append(Compute(phase, plan.seconds(item, phase), name=f"layer {i}"))
                else:
                    program.append(plan.collective(item.kind, plan.all_ranks, item.bytes, (phase, i, k),
                                                   name=item.name))
    program.append(_optimizer(plan, prof))
    return [list(program) for _ in range(plan.world)]


def stage_groups(plan, stages):
    """The pp/mp split (balanced by parameter count, ``strategies.pp.split.partition``)."""
    from mpkit.strategies.pp.split import partition

    sizes = [b // 4 for b in plan.piece(batch=1).param_bytes.values()]
    return partition(sizes, stages)


def mp(plan):
    """Layer-wise model parallel: the whole batch through rank 0, 1, ..., and gradients back."""
    groups = stage_groups(plan, plan.world)
    last = plan.world - 1
    programs = []
    for r, group in enumerate(groups):
        prof = plan.piece(group.start, group.stop)
        act = prof.output_bytes[group.stop - 1]
        ins = []
        if r > 0:
            ins.append(_p2p(plan, "recv", r, r - 1, ("act", r), prof.input_bytes, r))
        ins.append(Compute("forward", plan.seconds(prof.cost("forward"), "forward"), r))
        if r < last:
            ins.append(_p2p(plan, "send", r, r + 1, ("act", r + 1), act, r))
            ins.append(_p2p(plan, "recv", r, r + 1, ("grad", r), act, r))
        ins.append(Compute("backward", plan.seconds(prof.cost("backward"), "backward"), r))
        if r > 0:
            ins.append(_p2p(plan, "send", r, r - 1, ("grad", r - 1), prof.input_bytes, r))
        ins.append(_optimizer(plan, prof))
        programs.append(ins)
    return programs


def _p2p(plan, side, me, peer, key, nbytes, stage=None, mb=None):
    src, dst = (me, peer) if side == "send" else (peer, me)
    return P2P(((side, peer, key, plan.wire(nbytes), plan.p2p_time(src, dst, nbytes), stage, mb),))


def pp(plan):
    """The pp strategy's schedule lists, each instruction priced on its stage's profile."""
    from mpkit.strategies.pp import schedules

    name, m = plan.options["schedule"], plan.options["micro_batches"]
    v = plan.options["virtual_stages"] if name == "interleaved" else 1
    p = plan.world
    groups = stage_groups(plan, p * v)
    profs = {s: plan.piece(g.start, g.stop, batch=plan.batch // m) for s, g in enumerate(groups)}

    def message(kind, stage, src, dst):
        prof = profs[stage]
        nbytes = prof.input_bytes if kind == "act" else prof.output_bytes[groups[stage].stop - 1]
        return plan.wire(nbytes), plan.p2p_time(src, dst, nbytes)

    def optimizer(rank):
        return plan.seconds(sum((profs[s].optimizer for s in range(rank, p * v, p)), Cost()), "optimizer")

    def compute(phase):
        extra = plan.hw.stage_overhead[phase] * plan.slowdown  # the executor's own work per micro-batch
        return lambda s: plan.seconds(profs[s].cost(phase), phase) + extra

    return schedule_programs(schedules.schedule(name, p, m, v), compute("forward"), compute("backward"),
                             message, optimizer)


def schedule_programs(lists, forward, backward, message, optimizer):
    """Engine programs from ``strategies.pp.schedules`` lists. ``forward(stage)``/``backward(stage)``
    -> seconds; ``message(kind 'act'|'grad', stage it feeds, src, dst)`` -> (bytes, seconds);
    ``optimizer(rank)`` -> seconds. Each communication batch stays one batch, as the executor runs
    it: receives waited at once, sends at the next batch or before the optimizer step."""
    from mpkit.strategies.pp import schedules as S

    programs = []
    for rank, program in enumerate(lists):
        ins = []
        for item in S.batches(program):
            if isinstance(item, list):
                ops = []
                for c in item:
                    send = isinstance(c, (S.SendAct, S.SendGrad))
                    peer = c.to if send else c.frm
                    key = S._message(c)
                    nbytes, seconds = message(key[0], key[2], *((rank, peer) if send else (peer, rank)))
                    ops.append(("send" if send else "recv", peer, key, nbytes, seconds, c.stage, c.mb))
                ins.append(P2P(tuple(ops), defer_sends=True))
            elif isinstance(item, S.Forward):
                ins.append(Compute("forward", forward(item.stage), item.stage, item.mb))
            elif isinstance(item, S.Backward):
                ins.append(Compute("backward", backward(item.stage), item.stage, item.mb))
            elif isinstance(item, S.OptimizerStep):
                ins += [WaitSends(), Compute("optimizer", optimizer(rank))]
        programs.append(ins)
    return programs


def ps(plan):
    """Synchronous parameter server (rank 0; ``strategies.ps``): each worker pulls the parameters,
    runs forward/backward on its shard and pushes its gradients; the server takes the pushes one
    after another over its own link, averages them, steps, and replies. rpc (TensorPipe) is
    priced with the gloo p2p link: same sockets, a little more per-message software."""
    workers = plan.world - 1
    prof = plan.piece(batch=plan.batch // workers)
    size = prof.total_param_bytes
    tensors = sum(len(sh) for sh in prof.layer_shapes.values())
    server = []
    for w in range(1, plan.world):
        server.append(_p2p(plan, "send", 0, w, ("pull", w), size))
    for w in range(1, plan.world):
        server.append(_p2p(plan, "recv", 0, w, ("push", w), size))
    average = Cost(ops=tensors * (workers + 1), bytes=3 * size * workers)  # copy, add_ per push, div_
    server += [Compute("compute", plan.seconds(average, "optimizer"), name="average gradients"),
               _optimizer(plan, prof)]
    server += [_p2p(plan, "send", 0, w, ("reply", w), 8) for w in range(1, plan.world)]
    programs = [server]
    for w in range(1, plan.world):
        programs.append([_p2p(plan, "recv", w, 0, ("pull", w), size), *_fwd_bwd(plan, prof),
                         _p2p(plan, "send", w, 0, ("push", w), size), _p2p(plan, "recv", w, 0, ("reply", w), 8)])
    return programs


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
                ops = tuple((side, peer, key, size, plan.message_time(*((rank, peer) if side == "send" else (peer, rank)),
                                                                     size, gap), *rest)
                            for side, peer, key, size, _, *rest in ins.ops)
                ins, gap = replace(ins, ops=ops), 0.0
            priced.append(ins)
        out.append(priced)
    return out


BUILDERS = {"single": single, "dp": dp, "ddp": ddp, "zero1": zero1, "fsdp": fsdp, "mp": mp, "tp": tp, "pp": pp, "ps": ps}
