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

``pipeline(...)`` returns a ``Pipeline`` holding this rank's stages: ``loss = pipe.step(x, y)``
runs forward and backward of every micro-batch (each holds batch/m samples, its loss scaled by
1/m, gradients accumulated), then the caller steps its optimizer over ``pipe.parameters()``.
"""
from __future__ import annotations

import torch.distributed as dist
from torch import nn

from mpkit.parallel.pipeline.executor import PipelineExecutor
from mpkit.parallel.pipeline.schedules import SCHEDULES, check_schedule_args, schedule, simulate, validate
from mpkit.parallel.pipeline.split import Stage, partition, split_layers


class Pipeline(nn.Module):
    """This rank's stages of a pipeline (``stages``: {global stage index: module}) and its program."""

    def __init__(self, stages: dict, num_stages: int, schedule_name: str, micro_batches: int, loss_fn,
                 group=None, virtual_stages: int = 1):
        super().__init__()
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.schedule, self.micro_batches, self.virtual_stages = schedule_name, micro_batches, virtual_stages
        self.num_stages = num_stages
        self.local = nn.ModuleDict({str(s): module for s, module in stages.items()})
        self.program = schedule(schedule_name, self.world_size, micro_batches, virtual_stages)[self.rank]
        peers = [dist.get_global_rank(group or dist.group.WORLD, r) for r in range(self.world_size)]
        self.executor = PipelineExecutor(stages, num_stages, micro_batches, loss_fn, peers, group)

    @property
    def stages(self) -> dict:
        """{global stage index: module} held by this rank (stage s lives on pipeline rank s % p)."""
        return {int(s): module for s, module in self.local.items()}

    @property
    def holds_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stages

    def step(self, x=None, y=None):
        """Forward and backward of one batch over the micro-batches. ``x``: needed where the first
        stage lives; ``y``: where the last one lives. Returns the mean loss there, else None."""
        return self.executor.step(self.program, x, y)

    def forward(self, *args, **kwargs):
        raise RuntimeError("a Pipeline trains with pipe.step(x, y) (forward and backward of every micro-batch "
                           "in the schedule's order), not by calling it")


def check_no_tie_across_ranks(stages, p: int) -> None:
    """A parameter shared by stages on different ranks (an embedding tied to the output layer)
    would become one copy per rank, each trained on its own stage's gradient only: refuse it."""
    seen = {}  # id(parameter) -> (stage, name) where first met
    for s, stage in enumerate(stages):
        for name, param in stage.named_parameters(remove_duplicate=False):
            if isinstance(stage, Stage):  # the original model's name: layer index, not index in the stage
                index, _, rest = name.partition(".")
                name = f"{stage.layer_ids[int(index)]}.{rest}"
            first = seen.setdefault(id(param), (s, name))
            if first[0] % p != s % p:
                raise ValueError(f"parameter {first[1]!r} of stage {first[0]} is shared with {name!r} of stage {s} "
                                 f"(tied weights), and the two stages are on different ranks, which would train two "
                                 f"copies apart; put both layers in one stage (split_points) or untie them")


def check_every_rank_trains(stages, p: int, remedy: str) -> None:
    """Each rank must hold a parameter in at least one of its stages (stage s lives on rank s % p),
    else it would have nothing to train. A parameter-free stage (an activation, a Flatten) is fine
    on a rank that holds other stages with parameters, as under the interleaved schedule."""
    def held(s):
        stage = stages[s]
        if isinstance(stage, Stage):
            return f"{s} (layers {stage.layer_ids}: {', '.join(type(m).__name__ for m in stage)})"
        return f"{s} (a {type(stage).__name__})"

    for rank in range(min(p, len(stages))):
        mine = range(rank, len(stages), p)
        if any(True for s in mine for _ in stages[s].parameters()):
            continue
        which = (f"stage {held(mine[0])}, which has no" if len(mine) == 1 else
                 f"stages {', '.join(held(s) for s in mine[:-1])} and {held(mine[-1])}, none of which has")
        raise ValueError(f"rank {rank} would hold only {which} parameters, so it would have nothing to train; {remedy}")


def pipeline(stages_or_module, split_points=None, schedule="1f1b", micro_batches=4, group=None, loss_fn=None,
             virtual_stages=None) -> Pipeline:
    """Cut ``stages_or_module`` into ``world_size x virtual_stages`` stages and keep this rank's.

    ``stages_or_module``: an ``nn.Sequential`` (cut at ``split_points`` — the indices where a new
    stage starts — or balanced by parameter count), or a list of stage modules (one per stage).
    Stage s lives on rank s % world_size. ``loss_fn(output, target)``: the mean loss of a
    micro-batch, used on the rank holding the last stage. ``virtual_stages``: model chunks per
    rank for ``schedule="interleaved"`` (default 2; 1 for the other schedules). Build the same model on every rank
    (same seed) and call this everywhere; the stages a rank does not hold are dropped. A rank whose
    stages together hold no parameter is refused (it would have nothing to train); a
    parameter-free stage on a rank with other stages is fine.
    """
    p = dist.get_world_size(group)
    if virtual_stages is None:
        virtual_stages = 2 if schedule == "interleaved" else 1
    virtual = virtual_stages if schedule == "interleaved" else 1
    check_schedule_args(schedule, p, micro_batches, virtual_stages)
    if loss_fn is None or not callable(loss_fn):
        raise ValueError("pipeline(..., loss_fn=...) needs the loss function of one micro-batch, e.g. "
                         "torch.nn.functional.cross_entropy")
    count = p * virtual
    if isinstance(stages_or_module, nn.Sequential):
        if len(stages_or_module) < count:
            raise ValueError(f"the nn.Sequential has {len(stages_or_module)} layers, fewer than the {count} stages of "
                             f"world_size={p}" + (f" x virtual_stages={virtual}" if virtual > 1 else "")
                             + "; use fewer ranks or a deeper model")
        stages = split_layers(stages_or_module, count, split_points)
    elif isinstance(stages_or_module, (list, tuple)) and all(isinstance(s, nn.Module) for s in stages_or_module):
        if split_points is not None:
            raise ValueError("split_points apply to an nn.Sequential; a list of modules already is the stages")
        if len(stages_or_module) != count:
            raise ValueError(f"got {len(stages_or_module)} stage modules for {count} stages (world_size={p}"
                             + (f" x virtual_stages={virtual}" if virtual > 1 else "") + ")")
        stages = list(stages_or_module)
    else:
        raise TypeError(f"pipeline() takes an nn.Sequential or a list of stage modules; got "
                        f"{type(stages_or_module).__name__}")
    check_no_tie_across_ranks(stages, p)
    check_every_rank_trains(stages, p, "use fewer stages (world_size" + (" x virtual_stages" if virtual > 1 else "")
                            + "), other split_points, or give that rank a layer with parameters")
    rank = dist.get_rank(group)
    mine = {s: stages[s] for s in range(rank, count, p)}
    return Pipeline(mine, count, schedule, micro_batches, loss_fn, group, virtual)


__all__ = ["pipeline", "Pipeline", "Stage", "SCHEDULES", "schedule", "simulate", "validate", "partition",
           "split_layers", "check_schedule_args", "check_no_tie_across_ranks", "check_every_rank_trains"]
