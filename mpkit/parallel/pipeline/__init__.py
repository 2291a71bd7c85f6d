"""Pipeline parallel on any ``nn.Sequential`` (or a list of stage modules): the model cut into
stages, the batch into micro-batches that flow through them so several devices compute at once.

The mechanism in ~20 lines: ``pipeline(...)`` cuts the model and keeps this rank's stages;
``pipe.step(x, y)`` runs this rank's instruction list from the schedule (``executor.py``):

    program = schedule("1f1b", world_size, micro_batches)[rank]   # the order is all data
    for ins in program:
        Forward(mb, s):    x = micro-batch mb (stage 0) or the activation received for it
                           out[mb] = stages[s](x)
                           on the last stage: out[mb] = loss_fn(out[mb], y[mb]) / micro_batches
        SendAct(mb, s):    isend(out[mb]) to the rank holding stage s+1
        RecvAct(mb, s):    irecv(the activation of mb) from the rank holding stage s-1
        Backward(mb, s):   out[mb].backward(grad[mb])      # accumulates into the stages' .grad
        SendGrad(mb, s):   isend(x.grad) to the rank holding stage s-1
        RecvGrad(mb, s):   irecv(grad[mb]) from the rank holding stage s+1
        OptimizerStep():   wait for the last sends; the caller then steps its optimizer

The schedules (``schedules.py``: one list per rank, written in the instructions of
``instructions.py``, checked by ``validate`` in ``simulation.py`` and drawn by the labs) differ
only in the order of those instructions:

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

from mpkit.parallel.checks import global_rank, mark_split_gradients
from mpkit.parallel.pipeline.checks import (check_every_rank_trains, check_no_tie_across_ranks, check_pipeline_args,
                                            check_ranks_agree, check_stages_given)
from mpkit.parallel.pipeline.executor import PipelineExecutor
from mpkit.parallel.pipeline.schedules import (MULTI_CHUNK, SCHEDULES, check_schedule_args, chunks_per_rank, placement,
                                               schedule)
from mpkit.parallel.pipeline.simulation import simulate, validate
from mpkit.parallel.pipeline.split import Stage, partition, split_layers


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
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    if virtual_stages is None:
        virtual_stages = 2 if schedule in MULTI_CHUNK and schedule != "interleaved_zb" else 1
    virtual = virtual_stages if schedule in MULTI_CHUNK else 1
    check_pipeline_args(schedule, p, micro_batches, virtual_stages, loss_fn, scale_grads)
    count, where = p * chunks_per_rank(schedule, virtual), placement(schedule, p, virtual)
    check_stages_given(stages_or_module, split_points, num_stages, count, schedule, p, virtual)
    if isinstance(stages_or_module, dict):  # this rank's own stages
        mine, cuts = dict(sorted(stages_or_module.items())), None
    else:  # the whole model: cut it, keep the stages the schedule places here
        if isinstance(stages_or_module, nn.Sequential):
            stages = split_layers(stages_or_module, count, split_points)
            cuts = [stage.layer_ids[0] for stage in stages[1:]]
        else:
            stages, cuts = list(stages_or_module), None
        check_no_tie_across_ranks(stages, p, where)
        check_every_rank_trains(stages, p, "use fewer stages (world_size" + (" x virtual_stages" if virtual > 1 else "")
                                + "), other split_points, or give that rank a layer with parameters", where)
        mine = {s: stages[s] for s in range(count) if where[s] == rank}
    check_ranks_agree(group, p, where, {
        "schedule": schedule, "micro_batches": micro_batches, "num_stages": count, "virtual_stages": virtual,
        "scale_grads": scale_grads, "split_points": cuts, "stages": sorted(mine),
        "trains": any(True for m in mine.values() for _ in m.parameters())})
    return Pipeline(mine, count, schedule, micro_batches, loss_fn, group, virtual, scale_grads)


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
        peers = [global_rank(group, r) for r in range(self.world_size)]
        where = placement(schedule_name, self.world_size, virtual_stages)
        self.executor = PipelineExecutor(stages, num_stages, micro_batches, loss_fn, peers, group, where, scale_grads)
        mark_split_gradients(self.parameters(), self.world_size)  # fp16's overflow check must cover the group

    def step(self, x=None, y=None, *, losses=None, outputs=None):
        """Forward and backward of one batch over the micro-batches. ``x``: needed where the first
        stage lives; ``y``: where the last one lives. Returns there the batch's loss (the mean of
        the micro-batch losses under ``scale_grads=True``, their sum under False), else None.
        ``losses=[]``/``outputs=[]`` (as torch's ``schedule.step(..., losses=[])``): lists that
        receive each micro-batch's loss (as ``loss_fn`` returned it) and last-stage output. As in
        torch, where the last stage lives each step clears and refills them (a list built once and
        stepped twice holds this step's m losses, not 2m); elsewhere they are left as given."""
        step_losses, step_outputs = ([] if given is not None else None for given in (losses, outputs))
        loss = self.executor.step(self.program, x, y, step_losses, step_outputs)
        if self.holds_last_stage:
            for given, filled in ((losses, step_losses), (outputs, step_outputs)):
                if given is not None:
                    given.clear()
                    given.extend(filled)
        return loss

    @property
    def stages(self) -> dict:
        """{global stage index: module} held by this rank (see ``placement``: stage s on rank s % p,
        or in a V for ``zbv`` and ``dualpipev``)."""
        return {int(s): module for s, module in self.local.items()}

    @property
    def holds_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stages

    def forward(self, *args, **kwargs):
        raise RuntimeError("a Pipeline trains with pipe.step(x, y) (forward and backward of every micro-batch "
                           "in the schedule's order), not by calling it")


__all__ = ["pipeline", "Pipeline", "Stage", "SCHEDULES", "schedule", "simulate", "validate", "partition", "placement",
           "split_layers", "check_schedule_args", "check_no_tie_across_ranks", "check_every_rank_trains"]
