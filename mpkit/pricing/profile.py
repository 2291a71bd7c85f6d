"""What one rank's piece of the real model costs, counted on the meta device (no data, no time).

We build the same layers ``mpkit.models`` builds (and, for tensor parallel, let the tp strategy
slice them), run one forward + loss + backward + optimizer step on meta tensors, and count each
aten op: FLOPs (torch's own ``FlopCounterMode`` registry), bytes read+written, and the op itself
(on a CPU the fixed per-op cost dominates small models). ``mpkit.observe.memory``'s tracker runs
along, so activation and temporary bytes come out exactly as a real run would categorise them.
Shapes are all it needs, so a 7-billion-parameter what-if costs the same milliseconds as ours.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from mpkit.models import LayerStack, ModelConfig, build_layers, loss_fn
from mpkit.observe import active
from mpkit.observe.memory import MemoryTracker
from mpkit.observe.trace import Trace
from mpkit.parallel.recompute import recompute_layers

_FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_VIEW_OPS = frozenset({"view", "_unsafe_view", "expand", "transpose", "permute", "t", "select", "slice",
                       "unsqueeze", "squeeze", "detach", "alias", "as_strided", "split", "unbind"})


@dataclass
class Cost:
    """Work of a stretch of ops: how many, FLOPs, and bytes of tensors they read and wrote;
    ``device_seconds`` is the model's simulated device time (``ModelConfig.layer_ms``), which
    takes no CPU and so is not stretched when ranks share cores."""

    ops: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    device_seconds: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.ops + other.ops, self.flops + other.flops, self.bytes + other.bytes,
                    self.device_seconds + other.device_seconds)


@dataclass(frozen=True)
class CommOp:
    """A collective the strategy's own code issued in the middle of compute (tensor parallel)."""

    kind: str
    bytes: int
    name: str = ""


@dataclass
class PieceProfile:
    """One rank's piece of the model for one micro-batch.

    ``forward``/``backward``: per layer index (the loss counts with the last layer) a list of
    ``Cost`` and ``CommOp`` items in execution order. ``param_bytes``: per layer. ``output_bytes``:
    the activation each layer hands on (what a pipeline sends). ``memory``: {category: bytes}
    peaks of one forward+backward+optimizer step; ``retained``: activation bytes a forward leaves
    alive until its backward (what each in-flight micro-batch costs); ``optimizer``: the step.
    """

    layers: tuple[int, ...]
    forward: dict[int, list] = field(default_factory=dict)
    backward: dict[int, list] = field(default_factory=dict)
    param_bytes: dict[int, int] = field(default_factory=dict)
    layer_shapes: dict[int, tuple] = field(default_factory=dict)
    output_bytes: dict[int, int] = field(default_factory=dict)
    input_bytes: int = 0
    memory: dict[str, int] = field(default_factory=dict)
    retained: int = 0
    optimizer: Cost = field(default_factory=Cost)

    def cost(self, phase: str, layers=None) -> Cost:
        """Total compute ``Cost`` of ``phase`` ('forward'/'backward') over ``layers`` (default all)."""
        table = getattr(self, phase)
        total = Cost()
        for i in self.layers if layers is None else layers:
            for item in table[i]:
                if isinstance(item, Cost):
                    total = total + item
        return total

    @property
    def total_param_bytes(self) -> int:
        return sum(self.param_bytes.values())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _sdpa_flops(q: torch.Tensor) -> float:
    b, a, s, d = q.shape
    return 4.0 * b * a * s * s * d  # QKᵀ and PV, 2·s·s·d each per (batch, head)


class _CpuKernels(TorchFunctionMode):
    """On meta, SDPA would decompose into the math path (which keeps the attention matrix);
    route it to the fused CPU kernel a real CPU run uses, so ops and saved bytes match."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and args[0].device.type == "meta":
            q, k, v = args[:3]
            return _FLASH_CPU(q, k, v, 0.0, kwargs.get("is_causal", False))[0]
        return func(*args, **kwargs)


class _Counter(TorchDispatchMode):
    """Adds every aten op to the list of items under the current label."""

    def __init__(self):
        super().__init__()
        self.label = None
        self.items: dict = {}

    def emit(self, item) -> None:
        bucket = self.items.setdefault(self.label, [])
        if isinstance(item, Cost) and bucket and isinstance(bucket[-1], Cost):
            bucket[-1] = bucket[-1] + item
        else:
            bucket.append(item)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        flops = 0.0
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
        elif packet is _FLASH_CPU:
            flops = _sdpa_flops(args[0])
        elif packet is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
            flops = 2.5 * _sdpa_flops(args[1])  # recomputes QKᵀ, then dV, dP, dQ, dK
        moved = 0
        if packet.__name__ not in _VIEW_OPS:
            moved = sum(_nbytes(t) for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor))
        self.emit(Cost(1, float(flops), float(moved)))
        return out


class RecordingComm:
    """Stands in for the rank's communicator while profiling: logs each collective the model
    code issues (``mpkit.parallel``'s layers ask ``mpkit.observe.active`` for it)."""

    def __init__(self, counter: _Counter):
        self._counter = counter

    def all_reduce(self, tensor, op="sum", group=None, async_op=False, name="", **tags):
        self._counter.emit(CommOp("all_reduce", _nbytes(tensor), name))

    def all_gather(self, tensor_list, tensor, group=None, async_op=False, name="", **tags):
        self._counter.emit(CommOp("all_gather", sum(_nbytes(t) for t in tensor_list), name))


def _example(cfg: ModelConfig, batch: int):
    if cfg.kind == "mlp":
        return torch.empty(batch, cfg.d_in, device="meta"), torch.empty(batch, dtype=torch.long, device="meta")
    shape = (batch, cfg.seq_len)
    return torch.empty(shape, dtype=torch.long, device="meta"), torch.empty(shape, dtype=torch.long, device="meta")


def _stage_input(cfg: ModelConfig, batch: int, layer):
    """What a later pipeline stage receives: the previous layer's output (it needs a gradient).
    An mlp stage takes what its first Linear takes: under tensor parallelism a stage that starts
    at a row-parallel layer receives the column-parallel layer's slice (hidden/tp features)."""
    width = (batch, cfg.seq_len, cfg.hidden) if cfg.kind == "gpt" else (batch, layer.fc.weight.shape[1])
    return torch.empty(width, device="meta", requires_grad=True)


@lru_cache(maxsize=512)
def profile_piece(cfg: ModelConfig, first: int, last: int, batch: int, tp: int = 1, shard=None,
                  recompute: str | None = None) -> PieceProfile:
    """Profile layers ``first..last-1`` of ``cfg`` on one micro-batch of ``batch`` samples;
    ``shard(model, rank, tp)`` (with ``tp`` > 1) slices them as a tensor-parallel strategy does
    (rank 0's slice); the collectives its layers issue are recorded as ``CommOp`` items.
    ``recompute``: the layers checkpointed as the run does (``parallel.recompute_layers``), so the
    recomputed forward counts in each layer's backward and memory keeps what checkpointing keeps."""
    if not 0 <= first < last <= cfg.num_layers:
        raise ValueError(f"layers {first}..{last - 1} are outside the model's {cfg.num_layers} layers")
    counter = _Counter()
    with torch.device("meta"):  # no simulated sleeps while counting: they are added per layer below
        model = LayerStack(build_layers(replace(cfg, layer_ms=0.0)), cfg)
    if tp > 1:
        if shard is None:
            raise ValueError("profile_piece(tp > 1) needs the strategy's shard(model, rank, tp)")
        with torch.device("meta"):  # its index lists too: real ones of a huge width took seconds per layer
            shard(model, 0, tp)
    layers = list(range(first, last))
    piece = torch.nn.ModuleList([model.layers[i] for i in layers])
    recompute_layers(piece, recompute, lambda: (contextlib.nullcontext(), _CpuKernels()))  # recomputed as run
    prof = PieceProfile(tuple(layers))
    for i in layers:
        prof.param_bytes[i] = sum(_nbytes(p) for p in model.layers[i].parameters())
        prof.layer_shapes[i] = tuple(tuple(p.shape) for p in model.layers[i].parameters())
    params = [p for layer in piece for p in layer.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-3, foreach=True)
    is_last = last == cfg.num_layers
    tracker = MemoryTracker(device="meta")
    recorder = SimpleNamespace(comm=RecordingComm(counter), trace=Trace(enabled=False), memory=tracker)
    with tracker.track(piece, optimizer), _CpuKernels(), counter, active.recording(recorder):
        h, y = _example(cfg, batch)
        if first > 0:
            h = _stage_input(cfg, batch, model.layers[first])
        prof.input_bytes = _nbytes(h)
        outputs = []
        for i, layer in zip(layers, piece):
            counter.label = ("forward", i)
            h = layer(h)
            prof.output_bytes[i] = _nbytes(h)
            outputs.append(h)
        counter.label = ("forward", last - 1)
        out = loss_fn(cfg, h, y) if is_last else h
        prof.retained = tracker.current()["activations"]
        for i, o in zip(layers, outputs):
            if o.requires_grad:
                o.register_hook(lambda g, i=i: setattr(counter, "label", ("backward", i)))
        counter.label = ("backward", last - 1)
        out.backward(None if is_last else torch.empty_like(out))
        counter.label = ("optimizer", None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    prof.memory = tracker.report().max_by_category
    counter.items.pop(None, None)  # making the batch: outside the step's timed spans
    counter.items.pop(("optimizer", None), None)  # the first step also creates the state
    for (phase, i), items in counter.items.items():
        getattr(prof, phase)[i] = items
    prof.optimizer = optimizer_cost(tuple(s for i in layers for s in prof.layer_shapes[i]))
    for i in layers:
        prof.forward.setdefault(i, []).append(Cost(device_seconds=cfg.layer_ms / 1e3))
        prof.backward.setdefault(i, []).append(Cost(device_seconds=2 * cfg.layer_ms / 1e3))
    return prof


@lru_cache(maxsize=512)
def optimizer_cost(shapes: tuple) -> Cost:
    """One steady-state step of foreach Adam (``strategies.base.make_optimizer``) over
    parameters of these shapes: the second step, since the first also creates the state."""
    with torch.device("meta"):
        params = [torch.nn.Parameter(torch.empty(shape)) for shape in shapes]
    optimizer = torch.optim.Adam(params, lr=1e-3, foreach=True)
    counter = _Counter()
    for label in ("first", "steady"):
        for p in params:
            p.grad = torch.empty_like(p)
        counter.label = label
        with counter:
            optimizer.step()
    return sum((c for c in counter.items["steady"] if isinstance(c, Cost)), Cost())
