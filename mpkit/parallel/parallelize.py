"""``parallelize(model, mesh, plan)``: every parallelism of mpkit applied to one model, in one place
and in one fixed order, in the spirit of torchtitan's ``parallelize_llama``.

The order, and why (each step one function below, run on this rank's part of the model):

1. **Pipeline cut** (pp > 1, or micro_batches > 1): the model's layers (an ``nn.Sequential``'s
   children, the built-in models' ``layers``) are cut into pp·v stages balanced by parameter count
   (``split_layers``), and this rank keeps the stages its schedule places on its pp coordinate.
   First, as torchtitan splits before it parallelizes: every later step works on this rank's
   layers only, under their names in the whole model.
2. **Tensor parallel** (tp > 1): the plan's ``nn.Linear`` layers become this rank's column/row
   slices over the tp group (``tensor_parallel``). With ``sp=True`` each block is a
   sequence-parallel region instead (``sequence_parallel``): the sequence is scattered over tp
   after ``sequence_start`` and gathered back before ``sequence_end``.
3. **Context parallel** (cp > 1): every attention core becomes ring or Ulysses attention over the
   cp group, and ``sequence_start``'s output (looked up at global positions) is cut to this rank's
   tokens, the load-balanced chunks, ahead of SP's scatter.
4. **Expert parallel** (ep > 1): every mixture of experts keeps its E/ep experts, with the
   dispatch and combine all-to-alls over the ep group (``expert_parallel``).
5. **Precision and recomputation**, per layer: autocast (bf16/fp16) and activation checkpointing.
6. **Data parallel** over the dp x cp group (the ranks holding the same weights and other
   tokens): ``"replicate"`` (``DataParallel``, bucketed all-reduces; with experts, the experts'
   gradients averaged over the expert-data-parallel group and the rest over dp x cp),
   ``"zero1"`` (``ShardedOptimizer``: reduce-scatter, update a shard, all-gather) or ``"fsdp"``
   (torch's ``fully_shard``, each layer a unit, on the dp x cp sub-mesh; ``fully_sharded.py``).

``parallelize`` returns a ``Parallelized``: ``build_optimizer(cls, **kwargs)`` (a ZeRO-1
``ShardedOptimizer`` for ``dp="zero1"``), ``step(x, y)`` (one training step on the GLOBAL batch:
cut over dp, targets cut along the sequence over cp; returns this rank's loss, None off the last
stage), ``full_parameters()`` (every parameter whole, under the single model's names),
``mean_losses(losses)`` (the global batch's loss per step), and the pieces a checkpoint needs:
``stages`` ({stage index: module} this rank holds), ``model`` (the module to call or track: the
model, or the ``Pipeline`` of the stages) and ``optimizer``.

Every rank of the mesh calls ``parallelize`` with the same model (built from one seed) and plan:
steps 1-5 are local, the pipeline and data-parallel steps check that the ranks agree.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from mpkit.config import DEFAULT_LOSS_SCALE
from mpkit.models import LayerStack
from mpkit.observe import active
from mpkit.parallel.buckets import DEFAULT_BUCKET_MB
from mpkit.parallel.context_parallel import context_parallel_attention, shard_sequence
from mpkit.parallel.data_parallel import DataParallel
from mpkit.parallel.expert_parallel import ExpertParallelMoE, expert_parallel, expert_parameters, moe_layers
from mpkit.parallel.fully_sharded import shard_fully, units_of
from mpkit.parallel.functional import all_reduce_flat
from mpkit.parallel.learner_pieces import Pieces, group_scope
from mpkit.parallel.mesh import Mesh
from mpkit.parallel.pipeline import check_every_rank_trains, check_no_tie_across_ranks, pipeline
from mpkit.parallel.pipeline.schedules import MULTI_CHUNK, SCHEDULES, chunks_per_rank, placement
from mpkit.parallel.pipeline.split import Stage, split_layers
from mpkit.parallel.precision import LossScaler, MixedPrecision
from mpkit.parallel.recompute import attention_cores, recompute_layers
from mpkit.parallel.mappings import gather_from_sequence_parallel_region, scatter_to_sequence_parallel_region
from mpkit.parallel.sequence_parallel import all_reduce_sequence_parallel_gradients, sequence_parallel
from mpkit.parallel.sharded_optimizer import ShardedOptimizer
from mpkit.parallel.tensor_parallel import Split, plan_targets, sharded_layers, tensor_parallel, unpaired_columns

DP_MODES = ("replicate", "zero1", "fsdp")
WHOLE_BACKWARD = ("gpipe", "1f1b", "interleaved", "looped_bfs")  # the schedules that never split a backward into B and W


@dataclass(frozen=True)
class Plan:
    """What ``parallelize`` applies. Module names are names in the whole model (``fnmatch``
    patterns allowed); the built-in models' come from ``mpkit.parallel.plans.builtin_structure``.

    The model: ``loss(output, target)`` (the mean loss of a batch); ``tp`` ({layer: "column" |
    "row" | ``Split``}, Megatron's plan; needed when tp > 1); ``blocks`` (the sequence-parallel
    regions); ``attention_modules`` (modules whose ``attention`` core context parallelism swaps,
    as ``mpkit.models.SelfAttention``); ``sequence_start`` / ``sequence_end`` (the modules whose
    output starts and whose input ends the part the sequence is split in); ``seq_dim`` (the
    sequence's dimension there and in the targets: 1 for [batch, seq, hidden], 0 for Megatron's
    [seq, batch, hidden]).

    The recipe: ``sp`` (sequence parallelism in the tp groups), ``attention`` ("ring" or "ulysses",
    cp > 1), ``schedule``, ``micro_batches``, ``virtual_stages``, ``split_points`` (the pipeline),
    ``dp`` ("replicate", "zero1", "fsdp"), ``overlap`` (replicate: all-reduce buckets during
    backward; None: yes without a pipeline or SP, no with one, reducing after the flush as
    Megatron does), ``bucket_mb``, ``precision``, ``loss_scale`` (fp16), ``recompute``; ``pieces``: a learner's
    own gradient sync, f and g, MLP, schedule or ZeRO-1 step in mpkit's place (``learner_pieces.Pieces``)."""

    loss: Callable
    tp: dict = field(default_factory=dict)
    blocks: tuple = ()
    attention_modules: tuple = ()
    sequence_start: str | None = None
    sequence_end: str | None = None
    seq_dim: int = 1
    sp: bool = False
    attention: str = "ring"
    schedule: str = "1f1b"
    micro_batches: int = 1
    virtual_stages: int = 2
    split_points: tuple | None = None
    dp: str = "replicate"
    overlap: bool | None = None
    bucket_mb: float = DEFAULT_BUCKET_MB
    precision: str = "fp32"
    loss_scale: float = DEFAULT_LOSS_SCALE
    recompute: str | None = None
    pieces: Pieces | None = None


def parallelize(model: nn.Module, mesh: Mesh, plan: Plan) -> Parallelized:
    """Apply the mesh's parallelisms to ``model`` by ``plan`` (the steps of the module docstring),
    in place where they swap modules; returns this rank's ``Parallelized``."""
    lay = mesh.layout
    check_plan(lay, plan)
    layers, prefix = stack_of(model)
    targets = tensor_parallel_targets(model, plan) if lay.tp > 1 else {}  # on the whole model: pairs across stages
    pipelined = lay.pp > 1 or plan.micro_batches > 1
    parts = cut_pipeline(layers, mesh, plan) if pipelined else {0: model}
    named = _by_original_names(parts, prefix) if pipelined else model
    if lay.tp > 1:
        apply_tensor_parallel(named, targets, mesh, plan)
        if plan.pieces is not None:
            plan.pieces.apply_to_tensor_parallel(named, mesh.group("tp"))
    if lay.cp > 1:
        apply_context_parallel(named, mesh, plan)
    if lay.ep > 1:
        apply_expert_parallel(named, mesh)
    if pipelined:
        _put_back(parts, named, prefix)
    mp = MixedPrecision(plan.precision, LossScaler(plan.loss_scale) if plan.precision == "fp16" else None)
    apply_precision(parts, mp, plan.recompute)
    device = _device(mesh)
    for part in parts.values():
        part.to(device)
    return Parallelized(mesh, plan, parts, mp, device, prefix if pipelined else None)


def check_plan(lay, plan: Plan) -> None:
    """The plan against the mesh's ``Layout``: a ValueError saying what to change, on every rank alike."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a mpkit.parallel.Plan; got {type(plan).__name__}")
    if plan.schedule not in SCHEDULES:
        raise ValueError(f"schedule={plan.schedule!r} is unknown; use one of {', '.join(SCHEDULES)}")
    if plan.dp not in DP_MODES:
        raise ValueError(f"dp={plan.dp!r} is unknown; use one of {', '.join(map(repr, DP_MODES))}")
    if lay.tp > 1 and not plan.tp:
        raise ValueError(f"tp={lay.tp} splits the layers the plan names, and plan.tp names none: pass "
                         f"tp={{'<layer>': 'column' | 'row', ...}}, e.g. {{'mlp.up': 'column', 'mlp.down': 'row'}}")
    if plan.sp and (lay.tp == 1 or not plan.blocks):
        raise ValueError("sp=True makes each block a sequence-parallel region of the tp group: it needs tp >= 2 and "
                         "plan.blocks naming the blocks")
    if (plan.sp or lay.cp > 1) and plan.sequence_start is None:
        raise ValueError("sequence and context parallelism cut the sequence after plan.sequence_start (the module "
                         "whose output is [batch, seq, hidden]): name it")
    if lay.cp > 1 and not plan.attention_modules:
        raise ValueError("cp > 1 swaps every attention core for ring or Ulysses attention: name the modules holding "
                         "it in plan.attention_modules (modules with an `attention` slot, as mpkit.models.SelfAttention)")
    if plan.sp and plan.overlap:
        raise ValueError("overlap=True all-reduces buckets during backward, while sequence parallelism still sums "
                         "the LayerNorm gradients over tp after it: use overlap=False (or None) with sp=True")
    if plan.dp != "replicate" and (lay.ep > 1 or plan.sp):
        what = "ep > 1 (experts and the rest average over different groups)" if lay.ep > 1 else \
            "sp=True (its LayerNorm gradients are summed over tp after backward)"
        raise ValueError(f"dp={plan.dp!r} with {what} is not supported: use dp='replicate'")
    if plan.dp == "fsdp" and plan.schedule not in WHOLE_BACKWARD and (lay.pp > 1 or plan.micro_batches > 1):
        raise ValueError(f"dp='fsdp' reduce-scatters after a whole backward; schedule={plan.schedule!r} splits some "
                         f"backwards into B and W: use 'gpipe', '1f1b', 'interleaved' or 'looped_bfs'")


# ---- 1. the pipeline cut ----

def stack_of(model: nn.Module):
    """(the layers a pipeline cuts, the prefix of their names in the model): an ``nn.Sequential``'s
    children ("") or a built-in model's ``layers`` ("layers."); (None, None) for any other model."""
    if isinstance(model, nn.Sequential):
        return list(model), ""
    if isinstance(model, LayerStack):
        return list(model.layers), "layers."
    return None, None


def cut_pipeline(layers, mesh: Mesh, plan: Plan) -> dict:
    """{stage index: ``Stage``} this rank holds: the layers cut into pp·v stages (balanced by
    parameter count, or at ``split_points``), the ones placed on this rank's pp coordinate kept."""
    pp = mesh.layout.pp
    if layers is None:
        raise ValueError("a pipeline (pp > 1 or micro_batches > 1) cuts a stack of layers: make the model an "
                         "nn.Sequential (or pass pp=1 and micro_batches=1)")
    virtual = plan.virtual_stages if plan.schedule in MULTI_CHUNK else 1
    count, where = pp * chunks_per_rank(plan.schedule, virtual), placement(plan.schedule, pp, virtual)
    stages = split_layers(layers, count, plan.split_points)
    check_no_tie_across_ranks(stages, pp, where)
    check_every_rank_trains(stages, pp, "use fewer stages (pp x virtual_stages), other split_points, or give that "
                            "rank a layer with parameters", where)
    return {s: stage for s, stage in enumerate(stages) if where[s] == mesh.coords["pp"]}


def _by_original_names(parts: dict, prefix: str) -> nn.Module:
    """A module holding this rank's layers under their names in the whole model ("layers.3"), so
    the plan's names find them; the layers are the stages' own objects."""
    layers = nn.ModuleDict({str(i): layer for stage in parts.values() for i, layer in zip(stage.layer_ids, stage)})
    if not prefix:
        return layers
    holder = nn.Module()
    holder.add_module(prefix.rstrip("."), layers)
    return holder


def _put_back(parts: dict, named: nn.Module, prefix: str) -> None:
    """A layer the plan swapped whole (a top-level ``nn.Linear``) goes back into its stage."""
    for stage in parts.values():
        for k, i in enumerate(stage.layer_ids):
            stage[k] = named.get_submodule(f"{prefix}{i}")


# ---- 2. tensor (and sequence) parallel ----

def tensor_parallel_targets(model: nn.Module, plan: Plan) -> dict:
    """{layer name: Split} of the plan on the whole model (a pattern that matches nothing is a
    ValueError). A column layer whose slice a row layer takes may sit in another pipeline stage,
    so the pairing is checked here, once, and each column layer says it keeps its slice."""
    targets = plan_targets(model, plan.tp)
    columns = [n for n, s in targets.items() if s.style == "column" and s.gather_output is None]
    if columns and not any(s.style == "row" for s in targets.values()):
        raise unpaired_columns(columns, "say what its output is: Split('column', gather_output=True) all-gathers the "
                               "full output; pair it with the row layer that takes its slice otherwise")
    return {n: Split(s.style, s.indices, False) if n in columns else s for n, s in targets.items()}


def apply_tensor_parallel(named: nn.Module, targets: dict, mesh: Mesh, plan: Plan) -> None:
    """This rank's slices of the plan's layers it holds; with ``sp`` each block a sequence-parallel
    region, the sequence scattered after ``sequence_start`` and gathered before ``sequence_end``."""
    group, here = mesh.group("tp"), {n for n, _ in named.named_modules()}
    targets = {n: s for n, s in targets.items() if n in here}
    if plan.sp:
        for block in _matching(named, plan.blocks):
            inner = {n[len(block) + 1:]: s for n, s in targets.items() if n.startswith(block + ".")}
            sequence_parallel(named.get_submodule(block), inner, group, seq_dim=plan.seq_dim)
            targets = {n: s for n, s in targets.items() if not n.startswith(block + ".")}
        _hook_output(named, plan.sequence_start,
                     lambda out: scatter_to_sequence_parallel_region(out, group, seq_dim=plan.seq_dim, name="embedding"))
        if plan.sequence_end in here:  # the layers after it are replicated: backward keeps this rank's shard
            named.get_submodule(plan.sequence_end).register_forward_pre_hook(
                lambda _m, args: (gather_from_sequence_parallel_region(args[0], False, group, seq_dim=plan.seq_dim,
                                                                       name="head"), *args[1:]))
    if targets:
        tensor_parallel(named, targets, group)


# ---- 3. context parallel ----

def apply_context_parallel(named: nn.Module, mesh: Mesh, plan: Plan) -> None:
    """Ring or Ulysses attention over the cp group in every attention module this rank holds, and
    ``sequence_start``'s output cut to this rank's tokens."""
    group = mesh.group("cp")
    for name in _matching(named, plan.attention_modules):
        named.get_submodule(name).attention = context_parallel_attention(plan.attention, group)
    # prepend: the sequence is cut over cp before sequence parallelism scatters this rank's part over tp
    _hook_output(named, plan.sequence_start, lambda out: shard_sequence(out, group, dim=plan.seq_dim), prepend=True)


# ---- 4. expert parallel ----

def apply_expert_parallel(named: nn.Module, mesh: Mesh) -> None:
    """This rank's experts of every mixture of experts it holds (a pipeline stage may hold none)."""
    if moe_layers(named):
        expert_parallel(named, mesh.group("ep"))


# ---- 5. precision and recomputation ----

def apply_precision(parts: dict, mp: MixedPrecision, recompute: str | None) -> None:
    """Autocast and checkpointing on each layer this rank holds (a model that is not a stack: as a
    whole). Selective recomputation needs an attention core; a stage without one has nothing to do."""
    layers = [layer for part in parts.values() for layer in (stack_of(part)[0] or [part])]
    mp.wrap(layers)
    if recompute != "selective" or attention_cores(layers):
        recompute_layers(layers, recompute)


# ---- what a step runs ----

class Parallelized:
    """This rank's model, parallelized: see the module docstring."""

    def __init__(self, mesh: Mesh, plan: Plan, parts: dict, mp: MixedPrecision, device, prefix):
        self.mesh, self.plan, self.stages, self.mp, self.device = mesh, plan, parts, mp, device
        self._prefix = prefix  # None: the model unpipelined, its own names
        self.prefix = prefix or ""  # the single model's name of the pipeline's layer sequence (a checkpoint's)
        lay = mesh.layout
        self.dp_group = mesh.group("dp_cp")
        self._replicas = lay.size("dp_cp")
        if plan.dp == "fsdp":
            self._shard_fully()
        self.pipe = None
        if prefix is not None:
            virtual = plan.virtual_stages if plan.schedule in MULTI_CHUNK else 1
            self.loss = PipelineLoss(plan.loss, mp)
            self.pipe = pipeline(parts, schedule=plan.schedule, micro_batches=plan.micro_batches, group=mesh.group("pp"),
                                 loss_fn=self.loss, virtual_stages=virtual,
                                 num_stages=lay.pp * chunks_per_rank(plan.schedule, virtual))  # its stages: on device
            if plan.pieces is not None and plan.pieces.pipeline_schedule is not None:
                self.pipe.program = plan.pieces.program(self.pipe.rank, self.pipe.world_size, plan.micro_batches)
        self.model = self.pipe if self.pipe is not None else parts[0]
        self.data_parallel = None
        pieces = plan.pieces
        self._gradient_sync = pieces is not None and pieces.gradient_sync is not None
        self._bucketed = None if pieces is None or pieces.bucketed_gradient_sync is None else \
            pieces.start_bucketed(self.model, self.dp_group, self.device, plan.bucket_mb)
        if plan.dp == "replicate" and self._replicas > 1 and lay.ep == 1 and not self._gradient_sync \
                and self._bucketed is None:
            overlap = plan.overlap if plan.overlap is not None else (self.pipe is None and not plan.sp)
            self.data_parallel = DataParallel(self.model, bucket_mb=plan.bucket_mb, overlap=overlap, group=self.dp_group)
        # the ranks holding different gradients (slices, stages, shards) agree on an fp16 overflow
        self._overflow_group = None if lay.world_size == self._replicas and plan.dp == "replicate" and lay.ep == 1 \
            else dist.group.WORLD
        self.optimizer = None

    def _shard_fully(self) -> None:
        mesh = self.mesh.submesh("dp_cp")
        for part in self.stages.values():  # each layer a unit, under its name in the whole model
            if isinstance(part, Stage):
                children = {f"{self._prefix}{i}": layer for i, layer in zip(part.layer_ids, part)}
            elif isinstance(part, LayerStack):
                children = {f"layers.{i}": layer for i, layer in enumerate(part.layers)}
            else:  # an nn.Sequential's layers ("0", "1", ...), another model's top-level children
                children = dict(part.named_children())
            shard_fully(units_of(children), part, mesh)

    def build_optimizer(self, optimizer_cls, param_groups=None, **defaults) -> torch.optim.Optimizer:
        """The optimizer of this rank's parameters (a ``ShardedOptimizer`` over dp x cp for ZeRO-1),
        ``optimizer_cls(params, **defaults)``. ``param_groups(named)``: the parameter groups, as a
        training script makes them, from ``named`` = {name in the single model: parameter} of this
        rank (e.g. weight decay on matrices only)."""
        params = list(self.model.parameters()) if param_groups is None else param_groups(self.named_parameters())
        if self.plan.dp == "zero1" and self.plan.pieces is not None and self.plan.pieces.zero1_step is not None:
            self.optimizer = self.plan.pieces.zero1_optimizer(params, optimizer_cls, defaults, self.dp_group, self.device)
        elif self.plan.dp == "zero1" and self._replicas > 1:
            self.optimizer = ShardedOptimizer(params, optimizer_cls, group=self.dp_group, average_gradients=True,
                                              **defaults)
        else:
            self.optimizer = optimizer_cls(params, **defaults)
        return self.optimizer

    def named_parameters(self) -> dict:
        """{name in the single model: parameter} of this rank: its slices, shards and stages (its experts
        under their local index, 0 .. E/ep-1)."""
        return {self._original(part, name): p for _, part in sorted(self.stages.items())
                for name, p in part.named_parameters()}

    @property
    def zero(self) -> bool:
        return isinstance(self.optimizer, ShardedOptimizer)

    @property
    def tracked(self) -> tuple:
        """What memory tracking files as parameters, gradients and optimizer state."""
        if self.zero:  # the shards' .grad are a module's gradients, as in zero1
            return self.model, nn.ParameterList(self.optimizer.shard_parameters), self.optimizer.inner
        if not isinstance(self.optimizer, torch.optim.Optimizer):  # a learner's ZeRO-1 step: their shards as they go
            return (self.model,)
        return self.model, self.optimizer

    @property
    def layers(self) -> dict:
        """{stage index: the indices of its layers in the model} this rank holds (unpipelined: every
        layer of a stack in stage 0; another model: no layer list)."""
        if self._prefix is not None:
            return {s: list(stage.layer_ids) for s, stage in self.stages.items()}
        stack = stack_of(self.stages[0])[0]
        return {0: list(range(len(stack))) if stack is not None else []}

    @property
    def holds_last_stage(self) -> bool:
        return self.pipe is None or self.pipe.holds_last_stage

    def local_batch(self, x, y):
        """This rank's share of the global batch: its dp slice, the targets cut to its tokens over cp
        (the inputs stay whole: ``sequence_start`` looks them up at their global positions)."""
        lay, c = self.mesh.layout, self.mesh.coords
        x, y = (t.tensor_split(lay.dp)[c["dp"]].to(self.device) for t in (x, y))
        if lay.cp > 1:
            y = shard_sequence(y, self.mesh.group("cp"), dim=self.plan.seq_dim)
        return x, y

    def step(self, x, y) -> float | None:
        """One optimizer step on the global batch ``(x, y)``: forward, backward, the gradients'
        communication, the optimizer. Returns this rank's loss (None off the last stage)."""
        if self.optimizer is None:
            raise RuntimeError("call build_optimizer(torch.optim.<Class>, lr=...) before step()")
        x, y = self.local_batch(x, y)
        trace = active.trace()
        # a learner's bucketed sync: its hooks' dist calls, in backward, go to the dp x cp group
        with group_scope(self.dp_group, "bucketed_gradient_sync") if self._bucketed is not None else nullcontext():
            loss = self._forward_backward(x, y, trace)
        self.synchronize_gradients()
        self.optimizer_step()
        return loss.item() if isinstance(loss, torch.Tensor) else loss

    def _forward_backward(self, x, y, trace):
        if self.pipe is not None:
            loss = self.loss.step(self.pipe, x, y)
        else:
            with trace.span("forward"):
                out = self.plan.loss(self.model(x), y)
            with trace.span("backward"):
                self.mp.backward(out)
            loss = out
        return loss

    def synchronize_gradients(self) -> None:
        """After backward: sequence parallelism's LayerNorm sums over tp, then the data-parallel
        average (ZeRO-1's reduce-scatter runs in ``optimizer_step``; FSDP's ran during backward)."""
        lay = self.mesh.layout
        if self.plan.sp:
            all_reduce_sequence_parallel_gradients(self.model, self.mesh.group("tp"))
        if self.data_parallel is not None:
            self.data_parallel.finish_gradient_synchronization()
        elif self._gradient_sync:
            self.plan.pieces.synchronize_gradients(self.model, self.dp_group, self.device)
        elif self._bucketed is not None:
            self.plan.pieces.finish_bucketed(self._bucketed, self.dp_group)
        elif lay.ep > 1:
            self._average_with_experts()

    def _average_with_experts(self) -> None:
        """An expert's gradient already sums the tokens of its ep group (each rank's loss a mean of
        its own): divide by ep, average over the ranks holding the same expert (edp); average every
        other gradient over dp x cp."""
        experts, rest = expert_parameters(self.model)
        ep, edp = self.mesh.layout.ep, self.mesh.group("edp")
        grads = [p.grad for p in experts if p.grad is not None]
        for g in grads:
            g.div_(ep)
        all_reduce_flat(grads, edp, "expert grads", average=True)
        all_reduce_flat([p.grad for p in rest if p.grad is not None], self.dp_group, "non-expert grads", average=True)

    def optimizer_step(self) -> None:
        trace, opt = active.trace(), self.optimizer
        if self.zero:
            opt.reduce_scatter_gradients()
            with trace.span("optimizer"):  # every rank holds other stages, slices or shards: all agree
                if self.mp.unscale_(opt.shard_parameters, group=dist.group.WORLD):
                    opt.update_shard()
                opt.zero_grad()
            opt.all_gather_parameters()
            return
        with trace.span("optimizer"):
            self.mp.step(opt, self.model.parameters(), self._overflow_group)
            opt.zero_grad(set_to_none=True)

    def mean_losses(self, losses) -> list[float]:
        """The global batch's loss per step from this rank's: the mean over dp x cp (equal shares:
        the mean of the shard means). One all-reduce; call on the ranks holding the last stage."""
        return mean_losses(losses, self.dp_group, self.device)

    @property
    def reports(self) -> bool:
        """Whether this rank speaks for its stages: the first replica (dp, cp and tp index 0)."""
        c = self.mesh.coords
        return c["dp"] == c["cp"] == c["tp"] == 0

    def full_parameters(self) -> dict:
        """{name in the single model: the whole tensor} of this rank's stages: FSDP shards gathered
        over dp x cp, tensor-parallel slices over tp, experts over ep. A collective: every rank calls it."""
        out = {}
        for s, part in sorted(self.stages.items()):
            tp_layers = sharded_layers(part)
            owners = {f"{n}.experts.": m for n, m in part.named_modules() if isinstance(m, ExpertParallelMoE)}
            for name, p in part.named_parameters():
                t = p.full_tensor() if isinstance(p, DTensor) else p.detach()
                layer, _, pname = name.rpartition(".")
                if layer in tp_layers:
                    t = tp_layers[layer].gather(pname, local=t)
                owner = next((prefix for prefix in owners if name.startswith(prefix)), None)
                if owner is None:
                    out[self._original(part, name)] = t.clone()
                    continue
                local, _, rest = name[len(owner):].partition(".")
                per = len(owners[owner].experts)
                shards = [torch.empty_like(t) for _ in range(self.mesh.size("ep"))]
                active.comm().all_gather(shards, t.contiguous(), group=self.mesh.group("ep"), name=f"gather {name}")
                for r, shard in enumerate(shards):
                    out[self._original(part, f"{owner}{r * per + int(local)}.{rest}")] = shard
        return out

    def _original(self, part, name: str) -> str:
        if self._prefix is None:
            return name
        k, _, rest = name.partition(".")
        return f"{self._prefix}{part.layer_ids[int(k)]}.{rest}"


class PipelineLoss:
    """The loss a pipeline's executor runs backward from: for fp16 each micro-batch's loss scaled
    by the loss scale (the executor calls backward itself, so ``MixedPrecision.backward`` cannot);
    ``step`` returns the pipeline's loss unscaled."""

    def __init__(self, loss: Callable, mp: MixedPrecision):
        self.loss, self.scaler = loss, mp.scaler

    def __call__(self, out, y):
        loss = self.loss(out, y)
        return loss if self.scaler is None else self.scaler.scale(loss)

    def step(self, pipe, x, y):
        """``pipe.step(x, y)``'s loss (None off the last stage) divided by the scale it was run with."""
        scale = 1.0 if self.scaler is None else self.scaler.value
        loss = pipe.step(x, y)
        return None if loss is None else loss / scale


def mean_losses(losses, group=None, device=None) -> list[float]:
    """The mean over ``group`` of each step's loss: one all-reduce for all steps, outside the timed steps."""
    values = torch.tensor(losses, dtype=torch.float64, device=device)
    active.comm().all_reduce(values, op="avg", group=group, name="losses")
    return values.tolist()


# ---- helpers ----

def _matching(module: nn.Module, patterns) -> list[str]:
    return [n for n, _ in module.named_modules() if n and any(fnmatchcase(n, p) for p in patterns)]


def _hook_output(named: nn.Module, name: str, fn, prepend: bool = False) -> None:
    """``fn`` applied to the output of ``name``, where this rank holds it (a pipeline stage may not)."""
    if name in {n for n, _ in named.named_modules()}:
        named.get_submodule(name).register_forward_hook(lambda _m, _x, out: fn(out), prepend=prepend)


def _device(mesh: Mesh) -> torch.device:
    kind = mesh.device_mesh.device_type
    return torch.device(kind, torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)


__all__ = ["Plan", "Parallelized", "parallelize", "PipelineLoss", "mean_losses", "DP_MODES"]
