"""``mpkit.sim.predict`` (this module: ``mpkit.costmodel.prediction``): step time, its breakdown, memory per rank and a timeline — without running.

Inputs are checked by the same ``make_config`` that ``mpkit.train`` uses, so a prediction
accepts exactly the options a real run accepts and refuses the same bad ones. The step is built
as per-rank instruction lists (``programs``), priced from the real model's op counts
(``profile``) on a ``Hardware``, and played forward (``engine``).

Shared CPU cores: on ``cpu-sim`` N ranks may share fewer cores. We first simulate without
contention, measure how many ranks a second of compute shares the machine with on average
(``compute_concurrency``), and stretch compute by processor sharing (``Hardware.compute_stretch``):
four data-parallel ranks that compute together on two cores run at half speed, even though they
all wait in the all-reduce afterwards; other busy processes the calibration saw share the cores too.
A receive that found its rank asleep waits to be scheduled again (``with_wake_ups``, measured by
the calibration: milliseconds beside busy loops), and a message whose receive came after its send
waits for the sender's event loop to wake as well, the longer it idled (``play``: gloo's sends are
rendezvous). Then the fair share (``fair_share_play``, C from ``mpkit.costmodel.cpu``): a rank that needs C
CPU-seconds a step among k runnable processes per core gets about 1/k of a core while busy, so its
busy part of the step lasts at least k·C (a loaded machine: gloo's threads and every wake-up need
CPU too); each rank's instructions are lengthened to that and the step is played again, so the
ranks that wait for it wait longer.
"""
from __future__ import annotations

from dataclasses import replace

from mpkit.config import is_whole
from mpkit.models import describe
from mpkit.observe.trace import Trace, merged_spans, union_seconds
from mpkit.costmodel.cpu import rank_cpu
from mpkit.simulator.engine import P2P, Collective, Compute, simulate
from mpkit.simulator.hardware import Hardware
from mpkit.simulator.machines import get_hardware
from mpkit.costmodel.memory import predict_memory
from mpkit.pricing.pricing import Pricer, price_by_gap
from mpkit.strategies import get_strategy, make_config

# predict plays every rank's events and profiles every pipeline stage: beyond these it would run
# for minutes (a 128-stage pipeline takes ~10 s here, 10**6 ranks never finish); plan() prices
# cluster-scale layouts in closed form instead.
MAX_RANKS = 1024
MAX_STAGES = 64
MAX_LAYERS = 128  # profiled one by one: ~0.01 s per mlp layer, ~0.06 s per gpt block (layers=10**4: minutes)
# the largest tensor a profile builds, in elements: shapes only (meta tensors), but torch's own size
# arithmetic overflows near 2**63 bytes (batch_size=4*10**18 failed inside torch), and tensor
# parallel's index tensors are real ones of the layer's width
MAX_ELEMENTS = 2**48


class Prediction:
    """What ``predict`` returns; shaped like a ``Run`` where plots read it (``trace``, ``memory``
    as per-rank reports, ``world_size``, ``strategy``, ``config``)."""

    def __init__(self, config, hardware: Hardware, trace: Trace, memory, slowdown: float,
                 cpu_seconds=(), played_time: float | None = None, sharing: float = 1.0, programs=()):
        self.config = config
        self.strategy = config.strategy
        self.world_size = config.world_size
        self.hardware = hardware
        self.memory = memory
        self.slowdown = slowdown
        self.cpu_seconds = list(cpu_seconds)  # per rank, predicted (cpu-sim)
        self.sharing = sharing  # k: runnable processes per core while ranks are busy
        self.programs = list(programs)  # per rank, the instructions as played (before the fair share)
        self.trace = trace
        start, end = trace.window()
        self.step_time = end - start
        self.played_time = self.step_time if played_time is None else played_time  # before the fair share
        self.cpu_bound = self.step_time > self.played_time * (1 + 1e-9)
        ranks = trace.ranks or [0]
        compute = sum(trace.busy_time(r, "compute") for r in ranks) / len(ranks)
        # communication counts only where it is not hidden behind compute on the same rank
        busy_any = sum(union_seconds(_busy_events(trace.of_rank(r))) for r in ranks) / len(ranks)
        comm = busy_any - compute
        self.breakdown = {"compute": compute, "comm": comm, "bubble": max(self.step_time - compute - comm, 0.0)}

    def step_times(self) -> list[float]:
        return [self.step_time]

    def memory_by_category(self, kind="max") -> list[dict[str, int]]:
        return [dict(m) for m in self.memory]

    @property
    def peak_memory(self) -> int:
        """Bytes of the fullest rank at its peak."""
        return max(m.peak_total for m in self.memory)

    @property
    def fits(self) -> bool:
        """Whether every rank's peak fits the device's usable memory (``Hardware.usable_memory``, as
        ``sim.plan`` counts; always, where the hardware has no capacity)."""
        return self.peak_memory <= self.hardware.usable_memory

    @property
    def memory_warning(self) -> str:
        """Why this step could not run ('' when it fits): the step time assumes memory it lacks."""
        if self.fits:
            return ""
        worst = max(self.memory, key=lambda m: m.peak_total)
        return (f"does not fit: rank {worst.rank} needs {self.peak_memory / 1e9:,.1f} GB, the device has "
                f"{self.hardware.memory_bytes / 2**30:,.0f} GiB ({self.hardware.memory_bytes / 1e9:,.1f} GB), "
                f"{self.hardware.usable_memory / 1e9:,.1f} GB usable "
                f"({self.hardware.name}); a real run would fail with "
                f"out-of-memory — shard more (zero1, fsdp, tp, pp) or use more ranks")

    def summary(self) -> str:
        b, peak = self.breakdown, self.peak_memory / 2**20
        text = (f"predicted {self.strategy} on {self.world_size} x {self.hardware.name} — {describe(self.config.model)}\n"
                f"  step {self.step_time * 1e3:.3f} ms: compute {b['compute'] * 1e3:.3f}, comm {b['comm'] * 1e3:.3f}, "
                f"bubble {b['bubble'] * 1e3:.3f} ms; peak memory per rank {peak:.2f} MiB")
        if self.cpu_bound:
            text += (f"\n  CPU-bound: ranks need up to {max(self.cpu_seconds) * 1e3:.3f} ms of CPU a step, with "
                     f"{self.sharing:.2f} runnable processes per core while they are busy (played without that: "
                     f"{self.played_time * 1e3:.3f} ms)")
        return text + (f"\n  WARNING: {self.memory_warning}" if self.memory_warning else "")

    def __repr__(self):
        return (f"<Prediction {self.strategy} world_size={self.world_size} on {self.hardware.name}: "
                f"{self.step_time * 1e3:.3f} ms/step{'' if self.fits else ', does not fit in memory'}>")


def _check_size(strategy, world_size):
    """Fail fast on worlds predict cannot play in reasonable time (before any work)."""
    if not is_whole(world_size):
        return  # make_config says what to pass (numpy's integers are whole numbers there too)
    if world_size > MAX_RANKS:
        raise ValueError(f"world_size={world_size} is more ranks than predict simulates one by one (at most "
                         f"{MAX_RANKS}); for cluster-scale layouts use mpkit.sim.plan(model=..., "
                         f"hardware='Nx8xH100-ib', gpus={world_size}, global_batch=...)")
    if strategy in ("pp", "mp") and world_size > MAX_STAGES:
        raise ValueError(f"world_size={world_size} pipeline stages: predict profiles every stage (about 0.1 s "
                         f"each), at most {MAX_STAGES}; for deeper pipelines use mpkit.sim.plan")


def _config(strategy, world_size, model, batch_size, options):
    if world_size is None:
        world_size = 1 if strategy == "single" else 4
    cfg = make_config(strategy, world_size, model=model, batch_size=batch_size, **options)
    if not cfg.model.builtin:
        raise ValueError("the cost model profiles the built-in models (model='mlp' or 'gpt' with their sizes); "
                         "it cannot count the operations of a model factory")
    largest, what = _largest_tensor(cfg.model, cfg.batch_size)
    if largest > MAX_ELEMENTS:
        raise ValueError(f"{what} has {largest:.3g} elements, more than predict profiles (at most 2**48); make "
                         f"those sizes smaller, or for cluster-scale runs use mpkit.sim.plan(model=..., hardware=..., "
                         f"gpus=..., global_batch=...)")
    if cfg.model.layers > MAX_LAYERS:
        raise ValueError(f"layers={cfg.model.layers}: predict profiles every layer (up to 0.06 s each), at most "
                         f"{MAX_LAYERS}; for deeper models use mpkit.sim.plan(model=..., hardware=..., gpus=..., "
                         f"global_batch=...)")
    return cfg


def _largest_tensor(model, batch: int) -> tuple[int, str]:
    """Elements of the largest activation or weight the built-in ``model`` makes for ``batch``, and
    which one it is, by the sizes that make it (a refusal names them, not an innocent batch_size)."""
    m = model
    if m.kind == "mlp":
        widest = max(("d_in", m.d_in), ("hidden", m.hidden), ("classes", m.classes), key=lambda kv: kv[1])
        tensors = [(batch * widest[1], f"a layer's activations (batch_size={batch} x {widest[0]}={widest[1]})"),
                   (m.hidden * widest[1], f"a layer's weight (hidden={m.hidden} x {widest[0]}={widest[1]})")]
    else:
        rows = f"batch_size={batch} x seq_len={m.seq_len}"
        tensors = [(batch * m.seq_len * 4 * m.hidden, f"the MLP's activations ({rows} x 4·hidden, hidden={m.hidden})"),
                   (batch * m.seq_len * m.vocab, f"the logits ({rows} x vocab={m.vocab})"),
                   (batch * m.heads * m.seq_len ** 2,
                    f"the attention scores (batch_size={batch} x heads={m.heads} x seq_len²={m.seq_len}²)"),
                   (m.vocab * m.hidden, f"the embedding (vocab={m.vocab} x hidden={m.hidden})"),
                   (4 * m.hidden ** 2, f"the MLP's weight (4·hidden x hidden, hidden={m.hidden})")]
    return max(tensors, key=lambda t: t[0])


def concurrency(trace) -> float:
    """How many ranks are busy at once, as a second of their busy time sees it: with c(t) ranks
    busy at time t (a rank's overlapping events count once), the integral of c² over the integral
    of c (c itself when it never changes)."""
    edges = sorted((t, d) for r in trace.ranks for start, end in merged_spans(_busy_events(trace.of_rank(r)))
                   for t, d in ((start, 1), (end, -1)))
    busy = weighted = 0.0
    count, last = 0, None
    for t, change in edges:
        if count and last is not None:
            busy += count * (t - last)
            weighted += count * count * (t - last)
        count, last = count + change, t
    return weighted / busy if busy else 0.0


def compute_concurrency(trace) -> float:
    """How many ranks compute at once, as a second of compute sees it (``concurrency``)."""
    return concurrency(trace.filter(category="compute"))


def _busy_events(events) -> list:
    """A rank's busy events: the non-idle ones that last (what its busy time and spans are made of)."""
    return [e for e in events if e.category != "idle" and e.end > e.start]


def fair_share_play(programs, cpu, hw: Hardware, played: Trace | None = None) -> tuple[Trace, float]:
    """(the step's trace when the ranks get their fair share of the cores, k). Rank r needs
    ``cpu[r]`` CPU-seconds a step and, while busy, gets 1/k of a core (k = ``hw.sharing`` of how
    many ranks are busy at once, ``concurrency``), so its busy part of the ``played`` step
    (``programs`` as simulated) lasts at least k·cpu[r]: each rank's instructions are made
    k·cpu[r] / busy[r] times as long (never shorter) and the step is played again, so what a rank
    waits for stretches with the rank it waits for. (k·cpu[r] alone misses a pipeline's waits:
    11-30% short under load, BENCHMARKS.md.)"""
    played = play(programs, hw) if played is None else played
    k = hw.sharing(concurrency(played))
    busy = [union_seconds(_busy_events(played.of_rank(r))) for r in range(len(programs))]
    factors = [max(1.0, k * c / b) if b > 0 else 1.0 for c, b in zip(cpu, busy)]
    if max(factors, default=1.0) == 1.0:
        return played, k
    return play([_lengthened(program, f) for program, f in zip(programs, factors)], hw), k


def play(programs, hw: Hardware) -> Trace:
    """``programs`` played on ``hw``: where it was measured (``hw.late_waits``), a message whose
    receive came after its send waits for the sender's wake-up (``simulate``'s ``late_wait``:
    without it the pipelines beside two busy loops were predicted 12-24% too fast in each of five
    repeats, BENCHMARKS.md)."""
    return simulate(programs, late_wait=hw.late_wait if hw.late_waits else None)


def with_wake_ups(programs, played: Trace, hw: Hardware) -> list:
    """``programs`` with each receive that found its rank asleep in ``played`` (idle since the
    rank's previous event) made ``hw.wake_wait(slept)`` longer: beside busy loops a thread woken
    by its message waits to be scheduled, the longer the more it slept (BENCHMARKS.md,
    ``benchmarks/probes/message_wait.py``). A hop priced from a measured relay (``Hardware.measured``)
    already holds its receiver's wake-up in what it takes beyond the link's transfer, so only the
    wake-up beyond that is added (adding it whole played the 4-rank mlp-256 pipelines beside busy
    loops 26-46% too slow). Receives are matched to the events in the order the rank waited them."""
    out, (begin, _) = [], played.window()
    for rank, program in enumerate(programs):
        slept, last_end = [], begin  # a rank that starts with a receive sleeps from the step's start
        for event in sorted(played.of_rank(rank), key=lambda e: (e.start, e.end)):
            if event.kind == "recv":
                slept.append(max(0.0, event.start - last_end))
            last_end = max(last_end, event.end)
        waits = iter(slept)
        lengthened = []
        for ins in program:
            if isinstance(ins, P2P):
                ins = replace(ins, ops=tuple(
                    _woken(op, next(waits, 0.0), hw, rank)
                    if op.side == "recv" and op.record and (op.kind or "recv") == "recv" else op for op in ins.ops))
            lengthened.append(ins)
        out.append(lengthened)
    return out


def _woken(op, slept: float, hw: Hardware, rank: int):
    """Receive ``op`` of ``rank`` made ``hw.wake_wait(slept)`` longer, less the wake-up its price
    already holds (what it takes beyond its link's transfer: a measured relay's hop)."""
    held = max(0.0, op.seconds - hw.p2p_link(op.peer, rank).time(op.nbytes))
    return op._replace(seconds=op.seconds + max(0.0, hw.wake_wait(slept) - held))


def _lengthened(program, factor: float) -> list:
    """A rank's program with each instruction's seconds ``factor`` times as long."""
    out = []
    for ins in program:
        if isinstance(ins, (Compute, Collective)):
            ins = replace(ins, seconds=ins.seconds * factor)
        elif isinstance(ins, P2P):
            ins = replace(ins, ops=tuple(op._replace(seconds=op.seconds * factor) for op in ins.ops))
        out.append(ins)
    return out


def step_programs(plan, strategy):
    """The strategy's per-rank programs (its ``program``, beside its ``run_rank``), each led by the
    step's work outside its phases, with communication priced by the compute before it."""
    programs = get_strategy(strategy).program(plan)
    if plan.hw.step_overhead > 0:
        lead = Compute("compute", plan.hw.step_overhead * plan.slowdown, name="batch, loss.item(), loop")
        programs = [[lead, *program] for program in programs]
    return price_by_gap(plan, programs)


def programs_for(hw, strategy, world, kwargs):
    """``step_programs`` of ``strategy`` on ``world`` ranks with ``mpkit.train``'s options ``kwargs``."""
    cfg = make_config(strategy, world, **kwargs)
    return step_programs(Pricer(hw, cfg.model, world, cfg.batch_size, cfg.options, precision=cfg.precision,
                                recompute=cfg.recompute), strategy)


def _cpu_programs(plan, programs, strategy):
    """The programs whose compute needs CPU: simulated device time (``layer_ms``) is sleep."""
    if not plan.cfg.layer_ms:
        return programs
    return step_programs(replace(plan, cfg=replace(plan.cfg, layer_ms=0.0)), strategy)


def predict(strategy="single", hardware="cpu-sim", world_size=None, model="mlp", batch_size=32,
            **options) -> Prediction:
    """Predict one optimizer step of ``strategy`` on ``hardware`` (a preset name or a Hardware).

    Options and model sizes are those of ``mpkit.train`` (e.g. ``schedule="1f1b", micro_batches=8,
    hidden=256``); ``world_size`` defaults to 1 for ``single`` and 4 otherwise. A world larger than
    the hardware's nodes (64 ranks on one 8-GPU node) is a ValueError naming the multi-node
    presets; one larger than predict can play (``MAX_RANKS``, ``MAX_STAGES``) fails at once.
    A step that needs more memory than the device has says so (``fits``, ``memory_warning``).
    """
    _check_size(strategy, world_size)
    cfg = _config(strategy, world_size, model, batch_size, options)
    hw = get_hardware(hardware)
    hw.check_world(cfg.world_size)
    if get_strategy(strategy).program is None:
        raise ValueError(f"strategy={strategy!r} has no cost model")
    plan = Pricer(hw, cfg.model, cfg.world_size, cfg.batch_size, cfg.options, precision=cfg.precision,
                  recompute=cfg.recompute)
    programs = step_programs(plan, strategy)
    trace = play(programs, hw)
    slowdown, cpu, k = 1.0, [], 1.0
    if hw.cores:
        slowdown = hw.compute_stretch(compute_concurrency(trace))
        if hw.cpu:  # from the unstretched programs: the coefficients take priced compute as calibrated
            cpu = [rank_cpu(hw.cpu, program) for program in _cpu_programs(plan, programs, strategy)]
        if slowdown > 1.0:
            plan.slowdown = slowdown
            programs = step_programs(plan, strategy)
            trace = play(programs, hw)
        if hw.wake_max:
            programs = with_wake_ups(programs, trace, hw)
            trace = play(programs, hw)
    start, end = trace.window()
    if cpu:
        trace, k = fair_share_play(programs, cpu, hw, played=trace)
    return Prediction(cfg, hw, trace, predict_memory(strategy, plan), slowdown, cpu, end - start, k, programs)
