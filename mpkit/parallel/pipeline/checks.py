"""The pipeline's checks: each names what is wrong and what to change, before a step can hang or
train the wrong model. ``pipeline()`` calls them; ``pp`` and ``3d`` use the first two on a model
they cut themselves."""
from __future__ import annotations

import torch.distributed as dist
from torch import nn

from mpkit.parallel.pipeline.schedules import check_schedule_args
from mpkit.parallel.pipeline.split import Stage


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


def check_pipeline_args(schedule, p, micro_batches, virtual_stages, loss_fn, scale_grads) -> None:
    check_schedule_args(schedule, p, micro_batches, virtual_stages)
    if loss_fn is None or not callable(loss_fn):
        raise ValueError("pipeline(..., loss_fn=...) needs the loss function of one micro-batch, e.g. "
                         "torch.nn.functional.cross_entropy")
    if not isinstance(scale_grads, bool):
        raise TypeError(f"scale_grads={scale_grads!r}: pass True (loss_fn is a mean: divide by micro_batches) "
                        f"or False (loss_fn is a sum)")


def check_stages_given(stages_or_module, split_points, num_stages, count, schedule, p, virtual) -> None:
    """What ``pipeline()`` was given fits the schedule's ``count`` stages: ``{stage: module}`` (this
    rank's own) with ``num_stages``, an ``nn.Sequential`` deep enough to cut, or a list of stages."""
    ranks = f"world_size={p}" + (f" x virtual_stages={virtual}" if virtual > 1 else "")
    if isinstance(stages_or_module, dict):
        if num_stages != count:
            raise ValueError(f"pipeline({{stage: module}}, num_stages=...) needs num_stages={count} for schedule="
                             f"{schedule!r} on {ranks}; got num_stages={num_stages!r}")
        if split_points is not None:
            raise ValueError("split_points apply to an nn.Sequential; a dict of modules already is the stages")
        if not all(isinstance(k, int) and isinstance(m, nn.Module) for k, m in stages_or_module.items()):
            raise TypeError("pipeline({stage: module}) takes global stage indices (int) to nn.Modules")
        return
    if num_stages is not None and num_stages != count:
        raise ValueError(f"num_stages={num_stages} differs from the {count} stages of schedule={schedule!r} "
                         f"on world_size={p}; leave num_stages out")
    if isinstance(stages_or_module, nn.Sequential):
        if len(stages_or_module) < count:
            raise ValueError(f"the nn.Sequential has {len(stages_or_module)} layers, fewer than the {count} stages "
                             f"of {ranks}; use fewer ranks or a deeper model")
    elif isinstance(stages_or_module, (list, tuple)) and all(isinstance(s, nn.Module) for s in stages_or_module):
        if split_points is not None:
            raise ValueError("split_points apply to an nn.Sequential; a list of modules already is the stages")
        if len(stages_or_module) != count:
            raise ValueError(f"got {len(stages_or_module)} stage modules for {count} stages ({ranks})")
    else:
        raise TypeError(f"pipeline() takes an nn.Sequential, a list of stage modules or {{stage index: module}}; "
                        f"got {type(stages_or_module).__name__}")


def check_ranks_agree(group, p, where, facts: dict) -> None:
    """Every rank's ``facts`` (one small all-gather at construction) agree, each stage is held once
    by the rank the schedule puts it on, and every rank has a parameter to train: a pipeline whose
    ranks were built differently would train some other model, or hang, with no error saying why."""
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
    for r, g in enumerate(gathered):
        expected = [s for s, rank in enumerate(where) if rank == r]
        if g["stages"] != expected:
            raise ValueError(f"pipeline(): rank {r} holds stages {g['stages']}, but the schedule puts stages "
                             f"{expected} there (stage s on rank {'s % world_size' if len(set(where)) == len(where) or where[-1] != 0 else 'in a V'}); "
                             f"give each rank the stages the schedule places on it")
    for r, g in enumerate(gathered):
        if not g["trains"]:  # only where each rank built its own stages; else checked before, with the layers
            raise ValueError(f"rank {r} holds stages {g['stages']}, none of which has a parameter, so it "
                             f"would have nothing to train; give that rank a layer with parameters")
