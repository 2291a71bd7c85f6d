"""Expert parallel (ep size = world_size), built-in gpt with ``experts=`` only.

Every block's MLP is a mixture of experts (``mpkit.models.MixtureOfExperts``); each rank keeps
experts/world_size of them and its own slice of the batch (as in data parallelism). In each
block the router picks experts for this rank's tokens, an all-to-all dispatches them to the
ranks that own those experts, and a second all-to-all brings the outputs back
(``mpkit.parallel.expert_parallel``). After backward the router, attention, LayerNorms,
embedding and head are averaged over the ranks like data-parallel gradients, and the experts'
gradients, which already hold every rank's tokens, are divided by the world size
(``synchronize_expert_gradients``). Capacity is per sequence, so the dropped tokens are the ones a
single device drops.
"""
from __future__ import annotations

import math

import torch.distributed as dist

from mpkit.parallel.expert_parallel import (ExpertParallelMoE, check_expert_split, expert_load, expert_parallel,
                                            full_expert_parameters, synchronize_expert_gradients)
from mpkit.simulator.engine import Compute
from mpkit.pricing.profile import optimizer_cost
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer, require_divisible
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import (forward_backward, group_mean, local_batch, mixed_precision, optimizer_step,
                                   prepare_layers, run_steps)
from mpkit.strategies.sp import require_gpt

OPTIONS = {}


def validate(cfg):
    require_gpt(cfg, "its blocks' MLPs become mixtures of experts")
    if not cfg.model.experts:
        raise ValueError("strategy='ep' spreads the experts of a mixture-of-experts model: pass experts=<a multiple "
                         f"of world_size={cfg.world_size}>, e.g. experts={2 * cfg.world_size}")
    check_expert_split(cfg.model.experts, cfg.world_size)
    require_divisible(cfg.batch_size, cfg.world_size, "batch_size", "world_size",
                      "every rank routes an equal slice of the batch")


def run_rank(ctx, cfg, group=None):
    mp = mixed_precision(cfg)  # the dispatch/combine all-to-alls inside the autocast blocks move bf16/fp16
    model = expert_parallel(cfg.model.build(cfg.seed), group)
    prepare_layers(cfg, model, mp)
    model = model.to(ctx.device)
    opt = make_optimizer(model.parameters(), cfg)
    loads = []

    def step(x, y):
        loss = forward_backward(ctx, cfg, model, x, y, mp)
        loads.append([{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in s.items()} for s in expert_load(model)])
        synchronize_expert_gradients(model, group)
        optimizer_step(ctx, opt, mp=mp, params=model.parameters(), group=dist.group.WORLD)  # experts: per rank
        return loss.item()

    losses = run_steps(ctx, cfg, step, local_batch(ctx, cfg), track=(model, opt), state=Resumable(model, opt, mp=mp))
    return RankOutput(losses=group_mean(ctx, losses, group), params=full_expert_parameters(model, group),
                      extra={"expert_load": loads, **mp.report(),
                             "first_expert": [m.first for m in model.modules() if isinstance(m, ExpertParallelMoE)]})


def program(pricer):
    """Every rank: the model on its batch/ep sequences (the single-device MoE does the same expert
    work per rank: E/ep experts on ep ranks' slots), each block's MoE between a dispatch and a
    combine all-to-all of the [E, sequences·capacity, h] buffer (reversed in backward), then the
    one all-reduce of the non-expert gradients and the optimizer on this rank's parameters."""
    n, cfg, group = pricer.world, pricer.cfg, pricer.all_ranks
    prof = pricer.piece(batch=pricer.batch // n)
    blocks = range(1, cfg.num_layers - 1)
    moe = next(layer.mlp for layer in pricer.meta_model().layers[1:-1])
    buffer = cfg.experts * pricer.batch // n * moe.capacity(cfg.seq_len) * cfg.hidden * 4

    def a2a(name, i):
        return pricer.collective("all_to_all", group, buffer, (name, i), name=name)

    def compute(phase, i, share=1.0):
        return Compute(phase, pricer.seconds(prof.cost(phase, [i]), phase) * share, name=f"layer {i}")

    forward, backward = [], []
    for i in prof.layers:
        forward += [compute("forward", i, 0.5), a2a("moe dispatch forward", i), a2a("moe combine forward", i),
                    compute("forward", i, 0.5)] if i in blocks else [compute("forward", i)]
    for i in reversed(prof.layers):
        backward += [compute("backward", i, 0.5), a2a("moe combine backward", i), a2a("moe dispatch backward", i),
                     compute("backward", i, 0.5)] if i in blocks else [compute("backward", i)]
    named = list(pricer.meta_model().named_parameters())
    rest = [tuple(p.shape) for name, p in named if ".experts." not in name]
    mine = [tuple(p.shape) for name, p in named if ".experts." in name
            and int(name.split(".experts.")[1].split(".")[0]) < cfg.experts // n]
    sync = pricer.collective("all_reduce", group, 4 * sum(math.prod(s) for s in rest), ("non-expert",),
                             name="non-expert grads")
    step = Compute("optimizer", pricer.seconds(optimizer_cost(tuple(rest + mine)), "optimizer"))
    return [[*forward, *backward, sync, step] for _ in group]


STRATEGY = Strategy("ep", OPTIONS, validate, run_rank, program, dim="dp",
                    model_defaults=lambda world_size: {"model": "gpt", "experts": 2 * world_size}, takes_precision=True)
