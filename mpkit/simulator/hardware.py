"""Machines the cost model can price a step on: rates, links and their sources.

A ``Hardware`` turns counted work into seconds: each op costs a fixed overhead plus its FLOPs at
the achieved matmul rate plus its bytes at memory bandwidth; each message costs alpha + n·beta on
the link between its ranks, or what a table measured on this machine says (``measured``:
cpu-sim's ranks share cores, which alpha-beta cannot express). ``cpu-sim`` is measured here
(``mpkit.sim.calibrate()``); the GPU presets come from vendor datasheets, with the efficiency
factors stated next to them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from mpkit.whole import is_number, is_whole

PHASES = ("forward", "backward", "optimizer")
USABLE_MEMORY = 0.9  # CUDA context, NCCL buffers and allocator fragmentation take the rest of a GPU


def runnable_per_core(processes: float, background: float, cores: int) -> float:
    """k: runnable processes per core when ``processes`` ranks and the ``background`` load all want
    to run (at least 1: an idle core does not make a process faster). Processor sharing gives each
    1/k of a core."""
    return max(1.0, (processes + background) / cores)


@dataclass(frozen=True)
class Link:
    """Hockney alpha-beta link: ``alpha`` seconds per message, ``beta`` seconds per byte.
    ``kind``: what the link is, for the words that name it ("nvlink", "pcie", "infiniband"; ""
    where not stated); the prices read only alpha and beta."""

    alpha: float
    beta: float
    kind: str = ""

    @property
    def bandwidth(self) -> float:
        """Bytes per second in one direction."""
        return 1.0 / self.beta

    def time(self, nbytes: float) -> float:
        return self.alpha + nbytes * self.beta


@dataclass(frozen=True)
class Hardware:
    """One kind of device, how many there are per node, and how they are connected.

    ``flops``: peak FLOP/s per device at ``precision``; ``mfu``: the share of it big matmuls reach;
    ``attention``: the share fused (flash) attention kernels reach (None: as matmuls).
    ``op_overhead``: fixed seconds per aten op by phase (kernel launch on a GPU, Python + dispatch
    on a CPU). ``p2p``/``collective``: links inside a node (p2p for send/recv, collective for the
    per-step alpha/beta of ring algorithms); ``inter_node`` for groups that span nodes.
    ``nodes``: how many nodes of ``devices_per_node`` the machine has (None: as many as a job
    asks for); ``inter_node`` is then the per-GPU share of a node's network bandwidth.
    ``cores``: CPU cores the ranks share (None: every rank has its own device); ``background``:
    how many other busy processes shared them while the machine was measured (cpu-sim);
    ``lone_share``: the share of a core one rank alone got then, which the compute rates were
    timed at (None: not measured; processor sharing alone, ``sharing``). ``wake_max``/``wake_tau``:
    what a receive that slept for s seconds waits to be scheduled again, beyond the message itself,
    ``wake_max·(1 - exp(-s / wake_tau))`` (cpu-sim, measured; 0: none, ``wake_wait``).
    ``late_waits``: ((seconds a send waited for its receive, and so its sender's event loop idled,
    seconds the message then took beyond its transfer), ...) measured on cpu-sim (empty: none,
    ``late_wait``).
    ``step_overhead``: seconds each rank spends per step outside its phases (making the batch,
    ``loss.item()``, the loop itself); measured on cpu-sim, 0 for the GPU presets.
    ``stage_overhead``: seconds the pp executor adds to each micro-batch's forward/backward
    (measured on cpu-sim, 0 for the GPU presets). ``cpu``: coefficients of a rank's CPU seconds
    per step (``mpkit.costmodel.cpu``), fitted on cpu-sim under the load of the moment; empty for the
    GPU presets, whose ranks do not share cores. ``allreduce``:
    ``"ring"`` (gloo's algorithm, what cpu-sim is fitted to) or ``"auto"`` (ring or tree, whichever
    is faster for the size, as NCCL chooses).
    """

    name: str
    flops: float
    mfu: float
    mem_bw: float
    attention: float | None = None
    op_overhead: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    p2p: Link = Link(0.0, 0.0)
    collective: Link = Link(0.0, 0.0)
    inter_node: Link | None = None
    devices_per_node: int = 8
    nodes: int | None = None
    cores: int | None = None
    background: float = 0.0
    lone_share: float | None = None
    wake_max: float = 0.0
    wake_tau: float = 0.0
    late_waits: tuple = ()
    memory_bytes: float | None = None
    precision: str = "fp32"
    allreduce: str = "auto"
    source: str = ""
    measured: dict = field(default_factory=dict)
    step_overhead: float = 0.0
    stage_overhead: dict = field(default_factory=lambda: {"forward": 0.0, "backward": 0.0})
    cpu: dict = field(default_factory=dict)

    def check_world(self, world_size: int, name: str = "world_size") -> None:
        """A ValueError unless ``world_size`` ranks fit on this machine: never price links a
        machine does not have (64 ranks on one 8-GPU node would all talk over NVLink)."""
        if self.nodes is None or world_size <= self.nodes * self.devices_per_node:
            return
        need = -(-world_size // self.devices_per_node)
        kind = _PRESET_NAME.match(self.name)
        gpu = kind.group(1) if kind and kind.group(1) in _GPUS else "H100"
        raise ValueError(
            f"{name}={world_size} needs {need} nodes of {self.devices_per_node} GPUs, but hardware={self.name!r} "
            f"has {self.nodes * self.devices_per_node}; use a multi-node preset such as '{need}x8x{gpu}-ib' "
            f"(multi-node presets: {', '.join(MULTI_NODE)}; N = number of nodes)")

    def measured_time(self, kind: str, nbytes: float, group_size: int, gap: float = 0.0) -> float | None:
        """Seconds of a collective (or a ``"p2p"`` hop in a world of ``group_size`` ranks) from
        tables measured on this machine, or None where this kind and size were not measured.
        ``measured["all_reduce/4"] = {"warm": {"gap": s, "matmuls": n, "rows": [[bytes, seconds], ...]},
        "cold": {...}}``: the same sweep after a short and after a long stretch of compute (``n``
        96x96 matmuls, measured to take ``gap`` seconds);
        an operation that follows ``gap`` seconds of compute is priced between the two (linear
        in gap, clamped; never below the warm price), each table linear between sizes and along
        its last segment beyond.
        cpu-sim has tables because N ranks on fewer cores wait for the scheduler to wake them,
        which no single alpha fits across group sizes and gaps."""
        entry = self.measured.get(f"{kind}/{group_size}")
        if not entry:
            return None
        warm = _interpolate(entry["warm"]["rows"], nbytes)
        cold = entry.get("cold")
        if cold is None or cold["gap"] <= entry["warm"]["gap"]:
            return warm
        share = (gap - entry["warm"]["gap"]) / (cold["gap"] - entry["warm"]["gap"])
        # a longer sleep never wakes a peer faster: a cold mean below the warm one is noise
        return warm + min(max(share, 0.0), 1.0) * max(_interpolate(cold["rows"], nbytes) - warm, 0.0)

    @property
    def usable_memory(self) -> float:
        """Bytes a rank can fill on one device, ``USABLE_MEMORY`` of ``memory_bytes`` (inf: no
        capacity): ``sim.predict``'s ``fits`` and ``sim.plan``'s both read this one number."""
        return math.inf if self.memory_bytes is None else self.memory_bytes * USABLE_MEMORY

    @property
    def bytes_per_element(self) -> int:
        """Activation/communication element size: fp32 = 4, bf16 = 2."""
        return 2 if self.precision == "bf16" else 4

    def compute_time(self, cost, phase: str) -> float:
        """Seconds for a ``Cost`` (ops, flops, bytes counted in fp32) in ``phase``."""
        scale = self.bytes_per_element / 4
        return (cost.ops * self.op_overhead[phase] + cost.flops / (self.flops * self.mfu)
                + cost.bytes * scale / self.mem_bw)

    def link(self, ranks) -> Link:
        """The link a group of ranks talks over: inter-node as soon as it spans two nodes."""
        ranks = list(ranks)
        nodes = {r // self.devices_per_node for r in ranks}
        return self.inter_node if len(nodes) > 1 and self.inter_node is not None else self.collective

    def p2p_link(self, a: int, b: int) -> Link:
        if self.inter_node is not None and a // self.devices_per_node != b // self.devices_per_node:
            return self.inter_node
        return self.p2p

    def sharing(self, concurrency: float) -> float:
        """k: runnable processes on a rank's core when ``concurrency`` ranks run at once, each getting
        1/k of it: processor sharing among the ranks and the ``background`` (``runnable_per_core``),
        and never fewer than the calibration's lone rank shared its core with (1/``lone_share``):
        a process runs on one core at a time, so beside one busy loop pinned to each of two cores
        a lone rank got 1/2, not the 2/3 that sharing all the cores would give (that assumption
        played dp steps of gpt-64 28-34% too slow under such load, BENCHMARKS.md)."""
        if not self.cores:
            return 1.0  # every rank has its own device
        k = runnable_per_core(concurrency, self.background, self.cores)
        return max(k, 1.0 / self.lone_share) if self.lone_share else k

    def wake_wait(self, slept: float) -> float:
        """Seconds a receive that slept ``slept`` seconds waits to be scheduled once its message is
        there: beside busy loops, 0.3-1.3 ms after 0.1 ms asleep, 3.0-3.7 ms after 20 ms (the woken
        thread waits behind the busy process on its core; BENCHMARKS.md); next to nothing quiet."""
        if not self.wake_max or slept <= 0:
            return 0.0
        return self.wake_max * (1.0 - math.exp(-slept / self.wake_tau))

    def __post_init__(self):
        # a preset edited by hand (dataclasses.replace(hw, flops=0)) is refused here, by name: flops=0
        # was a ZeroDivisionError inside the planner and flops=-1 a table of negative step times
        _positive(self.name, flops=self.flops, mfu=self.mfu)
        _positive(self.name, finite=False, mem_bw=self.mem_bw)
        if self.attention is not None:
            _positive(self.name, attention=self.attention)
        if self.memory_bytes is not None:
            _positive(self.name, memory_bytes=self.memory_bytes)
        for key in ("devices_per_node", "nodes"):
            value = getattr(self, key)
            if value is not None and not (is_whole(value) and value >= 1):
                raise ValueError(f"hardware {self.name!r}: {key}={value!r} must be a whole number >= 1")
        for key in ("p2p", "collective", "inter_node"):
            link = getattr(self, key)
            if link is not None and not (_finite_at_least_0(link.alpha) and _finite_at_least_0(link.beta)):
                raise ValueError(f"hardware {self.name!r}: {key}={link!r} needs alpha and beta >= 0 and finite "
                                 f"(seconds per message, seconds per byte)")
        # one form however it was given (a JSON cache reads back lists): sorted (seconds, seconds) pairs
        object.__setattr__(self, "late_waits", tuple(sorted(map(tuple, self.late_waits))))

    def late_wait(self, idle: float) -> float:
        """Seconds a message whose receive came after its send takes beyond its transfer when the
        sender's event loop had been idle ``idle`` seconds: the receive's notice must wake it
        (gloo's sends are rendezvous; ``simulate`` says when the loop last ran). Interpolated in
        the measured ``late_waits`` (there the send waited that long, its loop idle since the
        previous message), from none at 0 and flat beyond the last; not monotone: beside busy
        loops 1.4-2.8 ms after 1 ms, 0.05-0.9 ms after 5-20 ms (a thread that slept long is
        scheduled at once, BENCHMARKS.md)."""
        points = [(0.0, 0.0), *self.late_waits]
        if len(points) == 1 or idle <= 0:
            return 0.0
        for (s0, w0), (s1, w1) in zip(points, points[1:]):
            if idle <= s1:
                return w0 + (w1 - w0) * (idle - s0) / (s1 - s0)
        return points[-1][1]

    def compute_stretch(self, concurrency: float) -> float:
        """How much slower compute runs when ``concurrency`` ranks compute at once than it ran in
        the calibration (one rank alone), on ``cores`` shared with the ``background``."""
        return self.sharing(concurrency) / self.sharing(1)

    def with_bandwidth(self, gb_per_s: float) -> "Hardware":
        """The same machine with every link's bandwidth set to ``gb_per_s`` GB/s (what-if slider)."""
        if not gb_per_s > 0:
            raise ValueError(f"bandwidth={gb_per_s!r} GB/s must be positive")
        beta = 1.0 / (gb_per_s * 1e9)
        inter = None if self.inter_node is None else replace(self.inter_node, beta=beta)
        return replace(self, name=f"{self.name} @ {gb_per_s:g} GB/s", p2p=replace(self.p2p, beta=beta),
                       collective=replace(self.collective, beta=beta), inter_node=inter,
                       measured={})  # tables hold this machine's bandwidth, not the slider's


def _finite_at_least_0(value) -> bool:
    return is_number(value) and math.isfinite(value) and value >= 0


def _positive(hw_name, finite=True, **values):
    """A ValueError naming the first value that is not a positive (and, if ``finite``, finite) number."""
    for key, value in values.items():
        if not (is_number(value) and value > 0 and (math.isfinite(value) or not finite)):
            what = "a positive, finite number" if finite else "a positive number"
            raise ValueError(f"hardware {hw_name!r}: {key}={value!r} must be {what}")


def _interpolate(table, nbytes: float) -> float:
    """Seconds at ``nbytes`` from [[bytes, seconds], ...] sorted by size: the first row below
    it, linear between rows, the last segment's slope (never negative) beyond."""
    sizes, times = [row[0] for row in table], [row[1] for row in table]
    if nbytes <= sizes[0]:
        return times[0]
    k = next((i for i in range(1, len(sizes)) if nbytes <= sizes[i]), len(sizes) - 1)
    slope = (times[k] - times[k - 1]) / (sizes[k] - sizes[k - 1])
    return times[k - 1] + (nbytes - sizes[k - 1]) * max(slope, 0.0)


# GPU efficiency assumptions, one set shared by every preset so they stay comparable (the
# planner's accuracy against published runs, BENCHMARKS.md, rests on exactly these):
# - mfu: the share of peak that matmuls sustain in training. The best large bf16 matmul reaches
#   more ("Maximum Achievable Matmul FLOPS", stas00/ml-engineering compute/accelerator/README.md:
#   A100 SXM 267.9 of 312 TFLOPS = 85.9 %, H100 SXM 792.1 of 989 = 80.1 %: MATMUL_BEST), but
#   training's matmuls are not that shape and run for hours under the power cap: priced at
#   MATMUL_BEST, published runs come out 25 % too fast on average. MATMUL_SUSTAINED is fitted
#   once per GPU to one published run held out of the comparison, MosaicML's 7B model on one
#   node of 8 GPUs (no inter-node traffic, no pipeline; `python benchmarks/published.py
#   --calibrate`). Everything else a step does (memory-bound ops, communication, bubbles) is
#   priced separately, so this is not an end-to-end MFU.
# - attention: the share of peak fused causal attention reaches (FlashAttention-2): on A100 "50-73 %
#   of the theoretical maximum" (Dao 2023, arXiv 2307.08691; we take the middle), on H100 287-304
#   TFLOPS forward with 128-wide heads, ~30 % (torch SDPA in pytorch/benchmark PR #2296).
# - 80 % of link peak as achieved bus bandwidth (nccl-tests all_reduce busbw on DGX A100/H100).
# - alpha 5 µs NVLink / 10 µs PCIe / 15 µs InfiniBand: NCCL small-message latencies (nccl-tests).
# - op overhead 5 µs: eager PyTorch kernel launch + dispatch per op on a modern host CPU.
# - memory bytes at the datasheet HBM bandwidth (an upper bound: copies reach ~90 % of it).
MATMUL_BEST = {"A100": 267.9 / 312, "H100": 792.1 / 989}
MATMUL_SUSTAINED = {"A100": 0.647, "H100": 0.489}
_FLASH = {"A100": (0.50 + 0.73) / 2, "H100": 296 / 989}


# FP8 matmuls (Hopper): the datasheet doubles the peak (1,979 against 989 TFLOPS dense), but with the
# casts and scaling torchtitan's Float8 linears ran its 8B FSDP steps 1.28-1.29x faster than bf16
# (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3, both compiled), which this model
# reproduces with the blocks' matmuls 1.46x faster (attention and the output layer stay bf16, as
# torchtitan's default leaves the output layer): `python benchmarks/published.py --fp8`
FP8_MATMUL_SPEEDUP = {"H100": 1.46}


@dataclass(frozen=True)
class Stack:
    """Training software as the planner prices it: the sustained matmul efficiency its published
    runs imply on each GPU (``matmul``), and where that comes from (``source``)."""

    name: str
    matmul: dict
    source: str


# The same GPUs run matmuls at different sustained rates under different training software
# (kernels, overlap, launch overheads; eager one-kernel-per-op norms and activations are priced
# apart, plan's fused=False): fitted per stack and GPU by `python
# benchmarks/published.py --stacks` (the grid value 0.30-0.90 with the least mean absolute
# throughput error over that stack's published rows, never above MATMUL_BEST). In-sample fits; out
# of sample, Megatron-LM's two papers predict each other within 7-8 %, while DeepSpeed's two
# sources (MT-NLG, BLOOM) miss each other by 20-25 % (BENCHMARKS.md). "generic" is
# MATMUL_SUSTAINED, what the presets carry. A (stack, GPU) pair the validation runs lack is fitted to
# a source of its own that never enters the validation (benchmarks/published.py STACK_RUNS): Megatron-LM
# on H100 to its README's GPT-3 175B strong-scaling MFU (47 % on 96 H100s, 42 % on 4,608), NeMo on H100
# to NeMo 24.07's DGX-H100 table (FP8 rows, priced with FP8_MATMUL_SPEEDUP). No public table was found
# for Megatron-DeepSpeed on H100 or NeMo on A100: those pairs stay refused, naming the stacks that have one.
STACKS = {
    "generic": Stack("generic (the presets' own)", MATMUL_SUSTAINED,
                     "MosaicML llm-foundry's 7B on one node of 8 GPUs, one run per GPU"),
    "megatron": Stack("Megatron-LM", {"A100": 0.66, "H100": 0.62},
                      "Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 Table 4: 18 runs on A100; on H100 the "
                      "Megatron-LM README's GPT-3 175B on 96 and 4,608 GPUs (MFU 47 % and 42 %)"),
    "deepspeed": Stack("Megatron-DeepSpeed", {"A100": 0.54},
                       "Smith et al. 2022 §2.4 (MT-NLG 530B, 3 runs) and BigScience's BLOOM 176B (1 run)"),
    "torchtitan": Stack("torchtitan (FSDP2)", {"A100": 0.64, "H100": 0.48},
                        "torchtitan docs/performance.md (64 A100s, 5 eager runs) and benchmarks/"
                        "llama3_h100_202412_torchtitan.md (500 W H100s, 2 eager and 2 compiled runs)"),
    "llm-foundry": Stack("MosaicML llm-foundry (FSDP)", {"A100": 0.70, "H100": 0.48},
                         "llm-foundry scripts/train/benchmarking/README.md: 5 A100 and 3 H100 runs"),
    "llama3": Stack("Meta's Llama 3 stack", {"H100": 0.80},
                    "Dubey et al. 2024 Table 4: 3 runs; capped at the best-case matmul rate (they imply more)"),
    "nemo": Stack("NVIDIA NeMo (Megatron-Core, Transformer Engine)", {"H100": 0.76},
                  "NeMo 24.07's DGX-H100 pre-training table, 9 runs, all FP8 (price them with fp8=True; a bf16 "
                  "run at this rate comes out optimistic)"),
}


def gpu_model(hw) -> str | None:
    """The GPU of a preset ("A100", "A100-40GB", "H100") from its name; None for other machines."""
    match = _PRESET_NAME.match(hw.name) if isinstance(hw.name, str) else None
    return match.group(1) if match and match.group(1) in _GPUS else None


def gpu_family(hw) -> str | None:
    """The GPU whose measured rates a preset shares ("A100" for "A100-40GB"); None for other machines."""
    gpu = gpu_model(hw)
    return gpu.split("-")[0] if gpu else None


def with_stack(hw, stack: str):
    """``hw`` with the matmul efficiency ``stack`` was measured at on its GPU; a ValueError that says
    which stacks have runs on it when this one has none."""
    if stack not in STACKS:
        raise ValueError(f"stack={stack!r} is unknown; use one of {', '.join(map(repr, STACKS))} (or None: the "
                         f"hardware preset's fitted matmul efficiency)")
    family = gpu_family(hw)  # A100-40GB runs at an A100's rate
    if family not in STACKS[stack].matmul:
        known = [k for k, v in STACKS.items() if family in v.matmul]
        raise ValueError(f"stack={stack!r} has no published runs on {gpu_model(hw) or hw.name!r}"
                         + (f"; stacks measured on it: {', '.join(map(repr, known))}" if known else "")
                         + "; or pass stack=None to keep the hardware preset's fitted matmul efficiency")
    return replace(hw, mfu=STACKS[stack].matmul[family])
_LINK_EFF, _GPU_OP = 0.8, dict.fromkeys(PHASES, 5e-6)


def _link(alpha, gb_per_s_one_way, kind):
    return Link(alpha, 1.0 / (gb_per_s_one_way * 1e9 * _LINK_EFF), kind)


_NVLINK3 = _link(5e-6, 300, "nvlink")      # NVLink 3: 600 GB/s bidirectional per A100 = 300 GB/s each way
_NVLINK4 = _link(5e-6, 450, "nvlink")      # NVLink 4: 900 GB/s bidirectional per H100 = 450 GB/s each way
_PCIE5 = _link(10e-6, 64, "pcie")          # PCIe Gen5 x16: ~64 GB/s per direction
_IB_HDR = _link(15e-6, 25, "infiniband")   # InfiniBand HDR: 200 Gb/s = 25 GB/s per GPU (DGX A100: one NIC per GPU)
_IB_NDR = _link(15e-6, 50, "infiniband")   # InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU (DGX H100: one NIC per GPU)
# Fewer NICs than GPUs: Jean Zay's A100 nodes (BLOOM, Le Scao et al. 2022 / BigScience) have four 100 Gb/s
# Omni-Path links for 8 GPUs, 6.25 GB/s per GPU; latency taken as InfiniBand's (not published)
_OPA_4X100 = _link(15e-6, 4 * 100 / 8 / 8, "omni-path")
_NETWORKS = {"ib": None, "opa": _OPA_4X100}  # None: the GPU's own node NIC


@dataclass(frozen=True)
class _Gpu:
    """One GPU model as its datasheet gives it, and the node it comes in."""

    flops: float
    mem_bw: float
    memory: float
    mfu: float
    attention: float
    nvlink: Link
    nic: Link
    source: str


# Memory as the driver reports it (nvidia-smi's total; a datasheet's "80GB" is 80 GiB, of which the
# A100 reports all and the H100 a little less): A100 80GB 81,920 MiB, A100 40GB 40,960 MiB, H100
# 80GB HBM3 81,559 MiB (modal-labs/modal-client#2797 lists the three; NVIDIA/nccl#1264 shows the
# H100's). USABLE_MEMORY of it is what a rank can fill. The 96 GB H100 has no published driver
# total; it keeps its datasheet figure in decimal bytes, the smaller reading.
MiB = 2 ** 20

_GPUS = {
    "A100": _Gpu(312e12, 2.039e12, 81920 * MiB, MATMUL_SUSTAINED["A100"], _FLASH["A100"], _NVLINK3, _IB_HDR,
                 "NVIDIA A100 datasheet: SXM4 80GB, 312 TFLOPS bf16 dense, 2,039 GB/s HBM2e, NVLink 3 600 GB/s; "
                 "DGX A100: 8 GPUs, one 200 Gb/s HDR InfiniBand NIC per GPU"),
    "A100-40GB": _Gpu(312e12, 1.555e12, 40960 * MiB, MATMUL_SUSTAINED["A100"], _FLASH["A100"], _NVLINK3, _IB_HDR,
                      "NVIDIA A100 datasheet: SXM4 40GB, 312 TFLOPS bf16 dense, 1,555 GB/s HBM2, NVLink 3 "
                      "600 GB/s; one 200 Gb/s HDR InfiniBand NIC per GPU"),
    "H100": _Gpu(989e12, 3.35e12, 81559 * MiB, MATMUL_SUSTAINED["H100"], _FLASH["H100"], _NVLINK4, _IB_NDR,
                 "NVIDIA H100 datasheet: SXM5 80GB, 989 TFLOPS bf16 dense, 3.35 TB/s HBM3, NVLink 4 900 GB/s; "
                 "DGX H100: 8 GPUs, one 400 Gb/s NDR InfiniBand NIC (ConnectX-7) per GPU"),
    # Meta's Grand Teton H100s (torchtitan benchmarks/llama3_h100_202412_torchtitan.md): 96GB HBM2e at
    # 2.4 TB/s, 400 Gb/s RDMA per GPU, power-capped at 500 W, so its "peak is between SXM and NVL"
    # (989 and 835 TFLOPS) and not published: the midpoint of the two, 912 TFLOPS, a prior chosen
    # before any run was compared (not fitted)
    "H100-96GB": _Gpu(912e12, 2.4e12, 96e9, MATMUL_SUSTAINED["H100"], _FLASH["H100"], _NVLINK4, _IB_NDR,
                      "torchtitan benchmarks/llama3_h100_202412_torchtitan.md: H100 SXM 96GB HBM2e, 2.4 TB/s, "
                      "500 W power limit (peak between SXM's 989 and NVL's 835 TFLOPS: the midpoint, 912, taken), "
                      "NVLink, 400 Gb/s RDMA per GPU"),
}


def _gpu(name, gpu: _Gpu, nodes=1, intra=None, network="ib", **changes):
    intra = intra or gpu.nvlink
    inter = (_NETWORKS[network] or gpu.nic) if nodes != 1 else None
    hw = Hardware(name=name, flops=gpu.flops, mfu=gpu.mfu, attention=gpu.attention, mem_bw=gpu.mem_bw,
                  op_overhead=_GPU_OP, p2p=intra, collective=intra, inter_node=inter, devices_per_node=8,
                  nodes=nodes, memory_bytes=gpu.memory, precision="bf16", source=gpu.source)
    return replace(hw, **changes)


GPU_PRESETS = {
    "8xA100-nvlink": _gpu("8xA100-nvlink", _GPUS["A100"]),
    "8xA100-40GB-nvlink": _gpu("8xA100-40GB-nvlink", _GPUS["A100-40GB"]),
    "8xH100-nvlink": _gpu("8xH100-nvlink", _GPUS["H100"]),
    "8xH100-96GB-nvlink": _gpu("8xH100-96GB-nvlink", _GPUS["H100-96GB"]),
    "8xH100-pcie": _gpu("8xH100-pcie", _GPUS["H100"], intra=_PCIE5, flops=756e12, mem_bw=2.0e12, source=(
        "NVIDIA H100 datasheet: PCIe 80GB, 756 TFLOPS bf16 dense, 2.0 TB/s HBM2e; PCIe Gen5 x16 64 GB/s per "
        "direction between cards (no NVLink bridge); matmul efficiency taken from the SXM5 card")),
    "2x8xH100-ib": _gpu("2x8xH100-ib", _GPUS["H100"], nodes=2),
}

# N nodes of 8 GPUs, NVLink inside a node, InfiniBand between: "4x8xH100-ib"; a literal "N"
# ("Nx8xH100-ib") means as many nodes as the job asks for. "-opa": four Omni-Path links per node
# instead of one InfiniBand NIC per GPU ("Nx8xA100-opa", BLOOM's Jean Zay).
MULTI_NODE = (*(f"Nx8x{gpu}-ib" for gpu in _GPUS), "Nx8xA100-opa")
_PRESET_NAME = re.compile(r"^(?:(?:\d+|N)x)?8x(.+)-(?:nvlink|pcie|ib|opa)$")
_MULTI_NODE = re.compile(r"^(\d+|N)x8x(" + "|".join(map(re.escape, _GPUS)) + r")-(ib|opa)$")

PRESETS = ("cpu-sim", *GPU_PRESETS)


def gpu_preset(name: str) -> Hardware | None:
    """A GPU preset by name, multi-node ones included (``"4x8xH100-ib"``: 4 nodes of 8 H100s, any
    N, or ``"Nx8xH100-ib"`` for as many as the job asks for); None for any other name."""
    if name in GPU_PRESETS:
        return GPU_PRESETS[name]
    match = _MULTI_NODE.match(name) if isinstance(name, str) else None
    if match and match.group(1) != "0":
        nodes = None if match.group(1) == "N" else int(match.group(1))
        return _gpu(name, _GPUS[match.group(2)], nodes=nodes, network=match.group(3))
    return None
