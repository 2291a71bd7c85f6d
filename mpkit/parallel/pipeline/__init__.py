"""Pipeline parallel on any ``nn.Sequential`` (or a list of stage modules): the model cut into
stages, the batch into micro-batches that flow through them so several devices compute at once.

The schedule is data (``schedules.py``: one instruction list per rank, checked by ``validate``
and drawn by the labs), run by one executor for every schedule (``executor.py``):

- ``gpipe``: all forwards, then all backwards; every rank keeps m micro-batches of activations.
- ``1f1b``: rank r runs p-1-r warm-up forwards, then alternates one forward / one backward; at
  most p-r micro-batches of activations alive (its warm-up plus the one in flight), same bubble
  (p-1)/(m+p-1).
- ``interleaved``: v model chunks per rank (Megatron's virtual stages); the bubble shrinks to
  (p-1)/(v·m+p-1) of the step, i.e. (p-1)/(v·m) of the ideal time, for v times the messages.
- ``looped_bfs``: v chunks per rank, every micro-batch through a rank's first chunk before the next
  (GPipe chunk by chunk; Lamy-Poirier 2023); the interleaved bubble with GPipe's memory.
- ``interleaved_zb`` and ``zbv``: zero bubble (Qi et al. 2024). The backward splits into B (the
  input gradient, which the previous stage waits for) and W (the weight gradients, which nobody
  waits for; ``split_backward.py``), and W fills the slots where 1F1B waits. ``interleaved_zb``
  keeps (interleaved) 1F1B's order (ZB-H1 with v = 1); ``zbv`` folds two chunks per rank in a V.
- ``dualpipev``: DeepSeek's DualPipe folded in a V (torch's ``ScheduleDualPipeV``): ZB-V's
  placement, and in the steady state each forward of one chunk paired with a whole backward of the
  other chunk for another micro-batch (torch's OVERLAP_F_B; on a GPU the pair's compute and
  communication can overlap, here and in torch's default runtime the two run one after the other);
  the backward is split into B and W only at the start and the end. Needs m >= 2p.

``pipeline(...)`` returns a ``Pipeline`` holding this rank's stages: ``loss = pipe.step(x, y)``
runs forward and backward of every micro-batch (each holds batch/m samples, its loss scaled by
1/m unless ``scale_grads=False``, gradients accumulated), then the caller steps its optimizer over
``pipe.parameters()``. ``tests/test_pipeline_torch_cases.py`` runs PyTorch's own pipelining test
cases against it through an adapter with torch's names.
"""
from __future__ import annotations

import torch.distributed as dist
from torch import nn

from mpkit.parallel.pipeline.executor import PipelineExecutor
from mpkit.parallel.pipeline.schedules import (MULTI_CHUNK, SCHEDULES, check_schedule_args, chunks_per_rank, placement,
                                               schedule, simulate, validate)
from mpkit.parallel.pipeline.split import Stage, partition, split_layers


class Pipeline(nn.Module):
    """This rank's stages of a pipeline (``stages``: {global stage index: module}) and its program."""

    def __init__(self, stages: dict, num_stages: int, schedule_name: str, micro_batches: int, loss_fn,
                 group=None, virtual_stages: int = 1, scale_grads: bool = True):
        super().__init__()
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.schedule, self.micro_batches, self.virtual_stages = schedule_name, micro_batches, virtual_stages
        self.num_stages, self.scale_grads = num_stages, scale_grads
        self.local = nn.ModuleDict({str(s): module for s, module in stages.items()})
        self.program = schedule(schedule_name, self.world_size, micro_batches, virtual_stages)[self.rank]
        peers = [dist.get_global_rank(group or dist.group.WORLD, r) for r in range(self.world_size)]
        where = placement(schedule_name, self.world_size, virtual_stages)
        self.executor = PipelineExecutor(stages, num_stages, micro_batches, loss_fn, peers, group, where, scale_grads)

    @property
    def stages(self) -> dict:
        """{global stage index: module} held by this rank (see ``placement``: stage s on rank s % p,
        or in a V for ``zbv`` and ``dualpipev``)."""
        return {int(s): module for s, module in self.local.items()}

    @property
    def holds_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stages

    def step(self, x=None, y=None, *, losses=None, outputs=None):
        """Forward and backward of one batch over the micro-batches. ``x``: needed where the first
        stage lives; ``y``: where the last one lives. Returns there the batch's loss (the mean of
        the micro-batch losses under ``scale_grads=True``, their sum under False), else None.
        ``losses=[]``/``outputs=[]`` (as torch's ``schedule.step(..., losses=[])``): lists that
        receive each micro-batch's loss (as ``loss_fn`` returned it) and last-stage output."""
        return self.executor.step(self.program, x, y, losses, outputs)

    def forward(self, *args, **kwargs):
        raise RuntimeError("a Pipeline trains with pipe.step(x, y) (forward and backward of every micro-batch "
                           "in the schedule's order), not by calling it")


def check_no_tie_across_ranks(stages, p: int, where=None) -> None:
    """A parameter shared by stages on different ranks (an embedding tied to the output layer)
    would become one copy per rank, each trained on its own stage's gradient only: refuse it."""
    where = where or [s % p for s in range(len(stages))]
    seen = {}  # id(parameter) -> (stage, name) where first met
    for s, stage in enumerate(stages):
        for name, param in stage.named_parameters(remove_duplicate=False):
            if isinstance(stage, Stage):  # the original model's name: layer index, not index in the stage
                index, _, rest = name.partition(".")
                name = f"{stage.layer_ids[int(index)]}.{rest}"
            first = seen.setdefault(id(param), (s, name))
            if where[first[0]] != where[s]:
                raise ValueError(f"parameter {first[1]!r} of stage {first[0]} is shared with {name!r} of stage {s} "
                                 f"(tied weights), and the two stages are on different ranks, which would train two "
                                 f"copies apart; put both layers in one stage (split_points) or untie them")


def check_every_rank_trains(stages, p: int, remedy: str, where=None) -> None:
    """Each rank must hold a parameter in at least one of its stages (stage s lives on rank s % p),
    else it would have nothing to train. A parameter-free stage (an activation, a Flatten) is fine
    on a rank that holds other stages with parameters, as under the interleaved schedule."""
    def held(s):
        stage = stages[s]
        if isinstance(stage, Stage):
            return f"{s} (layers {stage.layer_ids}: {', '.join(type(m).__name__ for m in stage)})"
        return f"{s} (a {type(stage).__name__})"

    where = where or [s % p for s in range(len(stages))]
    for rank in range(min(p, len(stages))):
        mine = [s for s in range(len(stages)) if where[s] == rank]
        if any(True for s in mine for _ in stages[s].parameters()):
            continue
        which = (f"stage {held(mine[0])}, which has no" if len(mine) == 1 else
                 f"stages {', '.join(held(s) for s in mine[:-1])} and {held(mine[-1])}, none of which has")
        raise ValueError(f"rank {rank} would hold only {which} parameters, so it would have nothing to train; {remedy}")


def _agree(group, p, facts: dict) -> list[dict]:
    """Every rank's ``facts`` (one small all-gather at construction): a pipeline whose ranks were
    built differently would train some other model, or hang, with no error saying why."""
    gathered = [None] * p
    dist.all_gather_object(gathered, facts, group=group)
    for key, fix in (("schedule", "the same schedule"), ("micro_batches", "the same micro_batches"),
                     ("num_stages", "the same number of stages (num_stages, virtual_stages)"),
                     ("virtual_stages", "the same virtual_stages"), ("scale_grads", "the same scale_grads"),
                     ("split_points", "the same split_points (and the same model)")):
        values = [g[key] for g in gathered]
        for r, value in enumerate(values):
            if value != values[0]:
                raise ValueError(f"pipeline(): rank {r} has {key}={value!r} but rank 0 has {key}={values[0]!r}; "
                                 f"pass {fix} on every rank")
    return gathered


def _check_placement(gathered, where) -> None:
    """Each stage held once, by the rank the schedule puts it on."""
    for r, g in enumerate(gathered):
        expected = [s for s, rank in enumerate(where) if rank == r]
        if g["stages"] != expected:
            raise ValueError(f"pipeline(): rank {r} holds stages {g['stages']}, but the schedule puts stages "
                             f"{expected} there (stage s on rank {'s % world_size' if len(set(where)) == len(where) or where[-1] != 0 else 'in a V'}); "
                             f"give each rank the stages the schedule places on it")


def pipeline(stages_or_module, split_points=None, schedule="1f1b", micro_batches=4, group=None, loss_fn=None,
             virtual_stages=None, *, num_stages=None, scale_grads=True) -> Pipeline:
    """Cut ``stages_or_module`` into stages and keep this rank's.

    ``stages_or_module``: an ``nn.Sequential`` (cut at ``split_points`` — the indices where a new
    stage starts — or balanced by parameter count), or a list of stage modules (one per stage),
    or — as torch's ``PipelineStage`` — only this rank's stages, ``{global stage index: module}``
    with ``num_stages``, so no rank needs the whole model. Stage s lives on rank ``placement(...)[s]``
    (s % world_size; ``zbv`` and ``dualpipev`` fold them in a V). ``loss_fn(output, target)``: the loss of one
    micro-batch, on the rank holding the last stage; ``scale_grads=True`` divides it by m (a mean
    loss: gradients of the batch's mean), False leaves it (a sum loss: the batch's sum, as torch's
    ``scale_grads=False``). ``virtual_stages``: model chunks per rank for ``interleaved``,
    ``looped_bfs``, ``interleaved_zb`` (default 2; 1 for the others). Call this on every rank: one
    small all-gather checks that the ranks agree (schedule, micro_batches, split_points, stages)
    and that every rank has a parameter to train, and names the rank that differs. A weight tied
    across ranks is refused where the whole model is given; from one rank's own stages it cannot be
    seen (each rank's copy is its own object), so keep tied layers in one stage there.
    """
    p = dist.get_world_size(group)
    if virtual_stages is None:
        virtual_stages = 2 if schedule in MULTI_CHUNK and schedule != "interleaved_zb" else 1
    virtual = virtual_stages if schedule in MULTI_CHUNK else 1
    check_schedule_args(schedule, p, micro_batches, virtual_stages)
    if loss_fn is None or not callable(loss_fn):
        raise ValueError("pipeline(..., loss_fn=...) needs the loss function of one micro-batch, e.g. "
                         "torch.nn.functional.cross_entropy")
    if not isinstance(scale_grads, bool):
        raise TypeError(f"scale_grads={scale_grads!r}: pass True (loss_fn is a mean: divide by micro_batches) "
                        f"or False (loss_fn is a sum)")
    count = p * chunks_per_rank(schedule, virtual)
    where = placement(schedule, p, virtual)
    rank = dist.get_rank(group)
    cuts = None
    if isinstance(stages_or_module, dict):
        if num_stages != count:
            raise ValueError(f"pipeline({{stage: module}}, num_stages=...) needs num_stages={count} for schedule="
                             f"{schedule!r} on world_size={p}" + (f" x virtual_stages={virtual}" if virtual > 1 else "")
                             + f"; got num_stages={num_stages!r}")
        if split_points is not None:
            raise ValueError("split_points apply to an nn.Sequential; a dict of modules already is the stages")
        if not all(isinstance(k, int) and isinstance(m, nn.Module) for k, m in stages_or_module.items()):
            raise TypeError("pipeline({stage: module}) takes global stage indices (int) to nn.Modules")
        mine = dict(sorted(stages_or_module.items()))
    else:
        if num_stages is not None and num_stages != count:
            raise ValueError(f"num_stages={num_stages} differs from the {count} stages of schedule={schedule!r} "
                             f"on world_size={p}; leave num_stages out")
        if isinstance(stages_or_module, nn.Sequential):
            if len(stages_or_module) < count:
                raise ValueError(f"the nn.Sequential has {len(stages_or_module)} layers, fewer than the {count} stages "
                                 f"of world_size={p}" + (f" x virtual_stages={virtual}" if virtual > 1 else "")
                                 + "; use fewer ranks or a deeper model")
            stages = split_layers(stages_or_module, count, split_points)
            cuts = [stage.layer_ids[0] for stage in stages[1:]]
        elif isinstance(stages_or_module, (list, tuple)) and all(isinstance(s, nn.Module) for s in stages_or_module):
            if split_points is not None:
                raise ValueError("split_points apply to an nn.Sequential; a list of modules already is the stages")
            if len(stages_or_module) != count:
                raise ValueError(f"got {len(stages_or_module)} stage modules for {count} stages (world_size={p}"
                                 + (f" x virtual_stages={virtual}" if virtual > 1 else "") + ")")
            stages = list(stages_or_module)
        else:
            raise TypeError(f"pipeline() takes an nn.Sequential, a list of stage modules or {{stage index: module}}; "
                            f"got {type(stages_or_module).__name__}")
        check_no_tie_across_ranks(stages, p, where)
        check_every_rank_trains(stages, p, "use fewer stages (world_size" + (" x virtual_stages" if virtual > 1 else "")
                                + "), other split_points, or give that rank a layer with parameters", where)
        mine = {s: stages[s] for s in range(count) if where[s] == rank}
    facts = {"schedule": schedule, "micro_batches": micro_batches, "num_stages": count, "virtual_stages": virtual,
             "scale_grads": scale_grads, "split_points": cuts, "stages": sorted(mine),
             "trains": any(True for m in mine.values() for _ in m.parameters())}
    gathered = _agree(group, p, facts)
    _check_placement(gathered, where)
    for r, g in enumerate(gathered):
        if not g["trains"]:  # only where each rank built its own stages; else checked above, with the layers
            raise ValueError(f"rank {r} holds stages {g['stages']}, none of which has a parameter, so it "
                             f"would have nothing to train; give that rank a layer with parameters")
    return Pipeline(mine, count, schedule, micro_batches, loss_fn, group, virtual, scale_grads)


__all__ = ["pipeline", "Pipeline", "Stage", "SCHEDULES", "schedule", "simulate", "validate", "partition", "placement",
           "split_layers", "check_schedule_args", "check_no_tie_across_ranks", "check_every_rank_trains"]
