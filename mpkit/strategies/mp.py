"""Layer-wise model parallel: consecutive layers on consecutive devices ("layer 1 on GPU 1,
layer 2 on GPU 2").

Each device holds only its layers, so a model too big for one device fits on several. But the
whole batch goes through the devices one after another: rank 0 computes, sends its activation
to rank 1 and waits; ... the last rank computes the loss and the gradients flow back the same
way. Only one device computes at a time, the others wait in ``recv`` — the bubble share is
(p-1)/p. Pipelining (``pp``) cuts the batch into micro-batches to fill that bubble; with one
micro-batch it is exactly this strategy.

Stages are balanced by parameter count (see ``pp/split.py``).
"""
import torch

from mpkit.models import loss_fn, make_batch
from mpkit.strategies.common import RankOutput, make_optimizer
from mpkit.strategies.pp.split import StageInput, boundary_shape, build_stages, check_stage_count, plan

OPTIONS = {}


def validate(cfg):
    check_stage_count(cfg.model, cfg.world_size, "world_size")


def run_rank(ctx, cfg):
    rank, last = ctx.rank, ctx.world_size - 1
    groups = plan(cfg.model, ctx.world_size, cfg.seed)
    stage = build_stages(cfg.model, cfg.seed, groups, [rank])[rank].to(ctx.device)
    optimizer = make_optimizer(stage.parameters(), cfg)
    shape = boundary_shape(cfg.model, cfg.batch_size)
    stage_input = StageInput(ctx.device)
    losses = []
    with ctx.memory.track(stage, optimizer):
        for step in range(cfg.steps):
            ctx.set_step(step)
            x, y = (t.to(ctx.device) for t in make_batch(cfg.model, cfg.batch_size, step, cfg.seed))
            if rank > 0:  # wait for the previous device's activation (the bubble shows as recv time)
                received = ctx.comm.recv(torch.empty(shape, device=ctx.device), rank - 1, stage=rank)
                x, grad_of_input = stage_input.attach(received)
            with ctx.trace.span("forward", stage=rank):
                out = stage(x)
                if rank == last:
                    out = loss_fn(cfg.model, out, y)
            if rank < last:
                ctx.comm.send(out.detach(), rank + 1, stage=rank)
                grad = ctx.comm.recv(torch.empty(shape, device=ctx.device), rank + 1, stage=rank)
            with ctx.trace.span("backward", stage=rank):
                torch.autograd.backward(out, None if rank == last else grad)
            if rank > 0:  # the gradient w.r.t. our input is the previous device's output gradient
                ctx.comm.send(grad_of_input.pop(), rank - 1, stage=rank)
            with ctx.trace.span("optimizer", stage=rank):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if rank == last:
                losses.append(out.item())
    return RankOutput(losses=losses if rank == last else None, params=stage.single_state(),
                      extra={"layers": list(groups[rank]), "parameters": sum(p.numel() for p in stage.parameters())})
