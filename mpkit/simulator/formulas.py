"""The closed-form numbers the labs teach, as pure functions (sources in each docstring).

Everything here is arithmetic on sizes and rates, so a lab cell, a quiz answer key and the cost
model in ``predict`` all quote the same formula. Sizes are bytes, times seconds, rates per second.
"""
from __future__ import annotations

import math

from mpkit.vocabulary import CLOSED_FORM_SCHEDULES, RECOMPUTE, SCHEDULES
from mpkit.whole import is_number, is_whole

ZERO_STAGES = (0, 1, 2, 3)


def _positive(**values) -> None:
    for name, value in values.items():
        if not is_number(value) or not 0 < value < math.inf:
            raise ValueError(f"{name}={value!r} must be a positive, finite number")


def require_whole(**values) -> None:
    """A ValueError naming the first value that is not a whole number >= 1 (numpy's integers are)."""
    for name, value in values.items():
        if not is_whole(value) or value < 1:
            raise ValueError(f"{name}={value!r} must be a whole number >= 1")


def _schedule(schedule: str) -> str:
    if schedule not in CLOSED_FORM_SCHEDULES:
        known = "has no closed form (mpkit.parallel.simulate plays its lists)" if schedule in SCHEDULES else "is unknown"
        raise ValueError(f"schedule={schedule!r} {known}; use one of {', '.join(CLOSED_FORM_SCHEDULES)}")
    return schedule


# ---- pipelines -------------------------------------------------------------------------------

def bubble_fraction(p: int, m: int, v: int = 1, schedule: str = "gpipe", relative_to: str | None = None) -> float:
    """Idle share of a pipeline with ``p`` stages, ``m`` micro-batches, ``v`` chunks per device.

    GPipe (Huang et al. 2019) and 1F1B (PipeDream-Flush, Narayanan et al. 2021) both idle for
    (p-1) slots out of (m+p-1): share of step time (p-1)/(m+p-1). Interleaved 1F1B (Narayanan et
    al. 2021, §2.2.2) shrinks the bubble time v-fold; the paper quotes it relative to the ideal
    compute time, (p-1)/(v·m). ``relative_to`` picks the form: ``"step"`` (bubble / step time,
    (p-1)/(v·m+p-1)) or ``"ideal"`` (bubble / compute time, (p-1)/(v·m)); by default each
    schedule uses the form it is usually quoted in (step for gpipe/1f1b, ideal for interleaved).
    """
    require_whole(p=p, m=m, v=v)
    if _schedule(schedule) != "interleaved" and v != 1:
        raise ValueError(f"v={v} virtual stages only apply to schedule='interleaved'")
    if relative_to is None:
        relative_to = "ideal" if schedule == "interleaved" else "step"
    if relative_to == "step":
        return (p - 1) / (v * m + p - 1)
    if relative_to == "ideal":
        return (p - 1) / (v * m)
    raise ValueError(f"relative_to={relative_to!r} is unknown; use 'step', 'ideal' or None")


def inflight_activations(schedule: str, p: int, m: int, rank: int, v: int = 1) -> int:
    """Most micro-batches whose activations ``rank`` holds at once (waiting for their backward).

    GPipe runs all m forwards before any backward: m. 1F1B (Narayanan et al. 2021) lets stage r
    run p-r forwards before its first backward: min(p-r, m), at most p. Interleaved (Megatron-LM's
    schedule, v model chunks per device) counts chunk-micro-batches (each 1/v of the rank's
    layers): its warm-up of 2(p-r-1) + (v-1)·p forwards plus the one in flight, at most v·m.
    """
    require_whole(p=p, m=m, v=v)
    if not is_whole(rank) or not 0 <= rank < p:
        raise ValueError(f"rank={rank!r} must be in 0..{p - 1}")
    if _schedule(schedule) == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - rank, m)
    return min(2 * (p - rank - 1) + (v - 1) * p + 1, v * m)


# ---- collectives: bytes each rank sends --------------------------------------------------------

def ring_allreduce_bytes(S: float, N: int) -> float:
    """Bytes one rank sends in a ring all-reduce of S bytes over N ranks: 2(N-1)/N · S
    (reduce-scatter then all-gather, each N-1 steps of S/N; Patarasuk & Yuan 2009)."""
    _positive(S=S)
    require_whole(N=N)
    return 2 * (N - 1) / N * S


def reduce_scatter_bytes(S: float, N: int) -> float:
    """Ring reduce-scatter of S bytes: (N-1)/N · S per rank (N-1 steps of S/N)."""
    _positive(S=S)
    require_whole(N=N)
    return (N - 1) / N * S


def all_gather_bytes(S: float, N: int) -> float:
    """Ring all-gather to S bytes in total: (N-1)/N · S per rank (N-1 steps of S/N)."""
    return reduce_scatter_bytes(S, N)


MEASURED_KINDS = ("send", "rpc")  # trace events that record the bytes that really left the rank


def wire_factor(kind: str, n: int) -> float:
    """Bytes on the wire per rank as a multiple of the bytes a trace event of ``kind`` records: a
    collective's event holds its payload S, so the ring factor applies (all-reduce 2(N-1)/N,
    reduce-scatter / all-gather / all-to-all / broadcast / reduce (N-1)/N); a send or rpc event
    already holds what left the rank."""
    if kind in MEASURED_KINDS:
        return 1.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n


def wire_bytes(trace, n: int) -> dict[int, dict[str, float]]:
    """{rank: {kind: bytes on the wire}} of a trace (``Run.trace``) of a world of ``n`` ranks."""
    return {rank: {kind: b * wire_factor(kind, n) for kind, b in kinds.items()}
            for rank, kinds in trace.bytes_by_kind().items()}


BUS_FACTORS = {  # nccl-tests doc/PERFORMANCE.md: busbw = algbw x this, per collective
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n, "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0,
}


def bus_bandwidth(algbw: float, N: int, collective: str = "all_reduce") -> float:
    """nccl-tests bus bandwidth: algbw x a factor of the collective (``BUS_FACTORS``; all-reduce
    2(N-1)/N, reduce-scatter, all-gather and all-to-all (N-1)/N, broadcast and reduce 1), where
    algbw = S / time and S is the full tensor (the gathered output, the scattered input). It is the
    rate the busiest link achieved, comparable to the hardware's peak whatever N is."""
    _positive(algbw=algbw)
    require_whole(N=N)
    if collective not in BUS_FACTORS:
        raise ValueError(f"collective={collective!r}: use one of {', '.join(map(repr, BUS_FACTORS))}")
    return algbw * BUS_FACTORS[collective](N)


# ---- memory ----------------------------------------------------------------------------------

def zero_memory(psi: float, N: int, stage: int, param_bytes: float = 2, grad_bytes: float = 2,
                optim_bytes: float = 12) -> dict[str, float]:
    """Per-rank model-state bytes {parameters, gradients, optimizer} under ZeRO (Rajbhandari et al.
    2020, §5): stage 0 replicates all three, stage 1 shards optimizer state, stage 2 also
    gradients, stage 3 also parameters. Defaults are mixed-precision Adam (2+2+12 = 16 bytes per
    parameter: fp16 weights and gradients, fp32 master weights + momentum + variance); our fp32
    CPU runs use param_bytes=4, grad_bytes=4, optim_bytes=8."""
    _positive(psi=psi)
    require_whole(N=N)
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage={stage!r} is unknown; use one of {ZERO_STAGES}")
    for name, value in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes), ("optim_bytes", optim_bytes)):
        if not is_number(value) or not 0 <= value < math.inf:  # nan and inf too: a silent nan memory
            raise ValueError(f"{name}={value!r} must be a finite number >= 0")
    return {
        "parameters": psi * param_bytes / (N if stage >= 3 else 1),
        "gradients": psi * grad_bytes / (N if stage >= 2 else 1),
        "optimizer": psi * optim_bytes / (N if stage >= 1 else 1),
    }


# Bytes per parameter of Adam's model states (parameters, gradients, optimizer) by precision recipe.
PRECISION_RECIPES = {
    "fp32": (4, 4, 8),  # fp32 weights and gradients, Adam's two moments
    # torch.autocast (precision="bf16"/"fp16"): the weights, gradients and moments stay fp32 (the
    # master weights); 2-byte copies of the weights exist only while a layer computes
    "autocast": (4, 4, 8),
    "mixed": (2, 2, 12),  # Micikevicius et al. 2018 / ZeRO: 16-bit weights and gradients, fp32 master + moments
    "mixed_fp32_grads": (2, 4, 12),  # Megatron-LM: gradients accumulated in fp32, 18 bytes
}


def bytes_per_parameter(recipe: str) -> int:
    """Model-state bytes per parameter of a ``PRECISION_RECIPES`` recipe (16 for all but Megatron's 18)."""
    if recipe not in PRECISION_RECIPES:
        raise ValueError(f"recipe={recipe!r} is unknown; use one of {', '.join(PRECISION_RECIPES)}")
    return sum(PRECISION_RECIPES[recipe])


def activation_memory_per_layer(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                                recompute: str = "none") -> float:
    """Activation bytes one transformer layer keeps for backward (Korthikanti et al. 2022,
    "Reducing Activation Recomputation", Table 2; 16-bit activations, 1-byte dropout masks):
    s·b·h·(34 + 5·a·s/h) without tensor parallel, s·b·h·(10 + 24/t + 5·a·s/(h·t)) with tp size t
    (the LayerNorm and dropout inputs, 10·s·b·h, stay replicated), s·b·h/t·(34 + 5·a·s/h) with
    sequence parallelism (those are split along the sequence too). ``recompute="selective"``
    drops the attention-score terms (5·a·s/h: recomputed in backward), ``"full"`` keeps only each
    layer's input, 2·s·b·h (split t ways under sequence parallelism)."""
    require_whole(s=s, b=b, h=h, a=a, t=t)
    if recompute not in RECOMPUTE or recompute == "op":
        known = "has no per-layer formula (mpkit.sim.plan prices it)" if recompute == "op" else "is unknown"
        raise ValueError(f"recompute={recompute!r} {known}; use one of none, selective, full")
    split = t if sequence_parallel else 1
    if recompute == "full":
        return 2 * s * b * h / split
    scores = 0 if recompute == "selective" else 5 * a * s / (h * t)
    if sequence_parallel or t == 1:
        return s * b * h * (34 / t + scores)
    return s * b * h * (10 + 24 / t + scores)


def megatron_flops(B: int, s: int, l: int, h: int, V: int, recompute: bool = True) -> float:
    """FLOPs of one training iteration of a GPT model as Megatron-LM counts them (Narayanan et al.
    2021, eq. 3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) with full activation recomputation (a
    second forward of every layer, not of the logit layer), 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))
    without. Only matrix multiplications count; papers divide it by time and GPUs for "TFLOP/s
    per GPU", so it turns a published throughput back into a step time."""
    require_whole(B=B, s=s, l=l, h=h, V=V)
    if recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


# ---- alpha-beta time ---------------------------------------------------------------------------

def _alpha_beta(alpha: float, beta: float) -> None:
    for name, value in (("alpha", alpha), ("beta", beta)):
        if not is_number(value) or not 0 <= value < math.inf:
            raise ValueError(f"{name}={value!r} must be a finite number of seconds (per byte for beta) >= 0")


def p2p_time(nbytes: float, alpha: float, beta: float) -> float:
    """Hockney's alpha-beta model of one message: alpha (latency, s) + n·beta (s per byte)."""
    _positive(nbytes=nbytes)
    _alpha_beta(alpha, beta)
    return alpha + nbytes * beta


def ring_allreduce_time(S: float, N: int, alpha: float, beta: float) -> float:
    """Ring all-reduce: 2(N-1) steps, each one message of S/N (Thakur et al. 2005)."""
    _positive(S=S)
    require_whole(N=N)
    _alpha_beta(alpha, beta)
    return 2 * (N - 1) * (alpha + S / N * beta)


def ring_reduce_scatter_time(S: float, N: int, alpha: float, beta: float) -> float:
    """Ring reduce-scatter (or all-gather) of S bytes: N-1 steps of S/N (Thakur et al. 2005)."""
    _positive(S=S)
    require_whole(N=N)
    _alpha_beta(alpha, beta)
    return (N - 1) * (alpha + S / N * beta)



def tree_allreduce_time(S: float, N: int, alpha: float, beta: float) -> float:
    """Binary-tree reduce then broadcast of S bytes: 2·ceil(log2 N) steps of the whole message
    (Thakur et al. 2005). Fewer latencies than the ring, N/(N-1)·log2 N times the bytes: it wins
    for small messages, the ring for large ones."""
    _positive(S=S)
    require_whole(N=N)
    _alpha_beta(alpha, beta)
    return 2 * math.ceil(math.log2(N)) * (alpha + S * beta) if N > 1 else 0.0


def allreduce_time(S: float, N: int, alpha: float, beta: float) -> float:
    """The faster of ring and tree, as NCCL and gloo pick by message size."""
    return min(ring_allreduce_time(S, N, alpha, beta), tree_allreduce_time(S, N, alpha, beta))


def hierarchical_allreduce_time(S: float, k: int, n: int, intra: tuple[float, float],
                                inter: tuple[float, float]) -> float:
    """All-reduce of S bytes over a group of k ranks on each of n nodes, with ``intra`` and
    ``inter`` the (alpha, beta) of the links inside and between nodes: reduce-scatter inside each
    node (S/k each), all-reduce the slices across nodes (each of the k ranks over its own NIC, in
    parallel), all-gather inside the node (Horovod's hierarchical all-reduce, Sergeev & Del Balso
    2018; NCCL reaches the same cost with one ring per NIC). k = 1 is a plain all-reduce across
    nodes, n = 1 one inside a node."""
    _positive(S=S)
    require_whole(k=k, n=n)
    inside = 2 * ring_reduce_scatter_time(S, k, *intra) if k > 1 else 0.0
    across = allreduce_time(S / k, n, *inter) if n > 1 else 0.0
    return inside + across


def hierarchical_reduce_scatter_time(S: float, k: int, n: int, intra: tuple[float, float],
                                     inter: tuple[float, float]) -> float:
    """Reduce-scatter of S bytes (or all-gather to S bytes) over k ranks on each of n nodes: inside
    the node first (S/k each), then across nodes (S/(k·n) each): half a hierarchical all-reduce."""
    _positive(S=S)
    require_whole(k=k, n=n)
    inside = ring_reduce_scatter_time(S, k, *intra) if k > 1 else 0.0
    across = ring_reduce_scatter_time(S / k, n, *inter) if n > 1 else 0.0
    return inside + across


# ---- checkpoints and failures ----------------------------------------------------------------
# Failures arrive at random (a Poisson process) with mean time between them M; every tau seconds
# of work the job writes a checkpoint that takes delta seconds, and after a failure it spends R
# seconds restarting and then redoes the work since the last checkpoint.


def young_interval(checkpoint: float, mtbf: float) -> float:
    """The work between checkpoints that wastes the least, to first order: sqrt(2·delta·M) (Young,
    "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974). It
    balances the checkpoints' cost delta/tau against the work a failure loses, tau/(2M) on average."""
    _positive(checkpoint=checkpoint, mtbf=mtbf)
    return math.sqrt(2 * checkpoint * mtbf)


def daly_interval(checkpoint: float, mtbf: float) -> float:
    """Daly's higher-order optimum ("A higher order estimate of the optimum checkpoint interval for
    restart dumps", FGCS 22(3), 2006): sqrt(2·delta·M)·[1 + sqrt(xi)/3 + xi/9] - delta with
    xi = delta/(2M), for delta < 2M; M otherwise. It corrects Young's when checkpoints are not cheap
    next to M (his M = 24 h, delta = 5 min: 117 min against Young's 120)."""
    _positive(checkpoint=checkpoint, mtbf=mtbf)
    if checkpoint >= 2 * mtbf:
        return mtbf
    xi = checkpoint / (2 * mtbf)
    return math.sqrt(2 * checkpoint * mtbf) * (1 + math.sqrt(xi) / 3 + xi / 9) - checkpoint


def expected_runtime(work: float, interval: float, checkpoint: float, mtbf: float, restart: float = 0.0) -> float:
    """Expected wall time to finish ``work`` seconds of computation checkpointing every ``interval``
    seconds of it: M·e^(R/M)·(e^((tau+delta)/M) - 1)·work/tau (Daly 2006; failures may also strike
    during a checkpoint or a restart)."""
    _positive(work=work, interval=interval, checkpoint=checkpoint, mtbf=mtbf)
    if not is_number(restart) or restart < 0:
        raise ValueError(f"restart={restart!r} must be a number of seconds >= 0")
    return mtbf * math.exp(restart / mtbf) * math.expm1((interval + checkpoint) / mtbf) * work / interval


def waste_fraction(interval: float, checkpoint: float, mtbf: float, restart: float = 0.0) -> float:
    """The share of the wall time that is not useful work: 1 - work/``expected_runtime``."""
    return 1.0 - 1.0 / expected_runtime(1.0, interval, checkpoint, mtbf, restart)


def mtbf_of(interruptions: int, days: float) -> float:
    """Mean time between failures in seconds from a count over a period (Llama 3 405B's pre-training:
    419 unexpected interruptions in 54 days, Dubey et al. 2024, "The Llama 3 Herd of Models" § 3.3.4:
    one every 3.1 hours on 16,384 GPUs)."""
    require_whole(interruptions=interruptions)
    _positive(days=days)
    return days * 86400.0 / interruptions
