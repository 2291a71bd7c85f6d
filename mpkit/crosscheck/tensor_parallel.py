"""The same tensor parallelism done by PyTorch: ``parallelize_module`` with ``ColwiseParallel`` /
``RowwiseParallel`` on a 1-D DeviceMesh. Not a registered strategy: the tests run it with
``mpkit.launch(run_rank, world_size, args=(cfg,))`` to cross-check ``tp`` (and so
``mpkit.parallel.tensor_parallel``).

The one subtlety is the fused qkv Linear(h, 3h). ``ColwiseParallel`` shards its weight rows
contiguously (``Shard(0)``): with t=2 and h=64, rank 0 would get rows 0..95, i.e. all of q and
half of k — not whole heads, and the local output would not view as (3, heads/t, head_dim).
So before sharding we permute qkv's rows into rank-major order [q_0 k_0 v_0 | q_1 k_1 v_1 | ...]
(q_r = the rows of rank r's heads, ``mpkit.parallel.tensor_parallel.head_split``). Its contiguous shard r then is
exactly the rows our ``tp`` gives rank r, in the same order; the permutation is undone when the
parameters are reported. Everything else (proj, up, down) splits contiguously in both.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from mpkit.models import Block
from mpkit.parallel.tensor_parallel import head_split
from mpkit.strategies.base import RankOutput, make_optimizer
from mpkit.strategies.loop import full_batch, plain_step, run_steps


def _permute_rows(linear, order):
    with torch.no_grad():
        linear.weight.copy_(linear.weight[order])
        linear.bias.copy_(linear.bias[order])


def run_rank(ctx, cfg):
    t = ctx.world_size
    mesh = init_device_mesh(ctx.device.type, (t,))
    model = cfg.model.build(cfg.seed).to(ctx.device)
    order = torch.cat(head_split(cfg.model.hidden, t)).to(ctx.device)
    plan = ({"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
             "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()} if cfg.model.kind == "gpt" else None)
    for i, layer in enumerate(model.layers):
        if isinstance(layer, Block):
            _permute_rows(layer.attn.qkv, order)
            parallelize_module(layer, mesh, plan)
        elif cfg.model.kind == "mlp" and i % 2 == 0 and i + 1 < len(model.layers):
            parallelize_module(layer, mesh, {"fc": ColwiseParallel()})
            parallelize_module(model.layers[i + 1], mesh, {"fc": RowwiseParallel()})
    # DTensor and plain parameters in separate groups: one foreach op cannot mix the two kinds.
    params = list(model.parameters())
    groups = [{"params": [p for p in params if isinstance(p, DTensor)]},
              {"params": [p for p in params if not isinstance(p, DTensor)]}]
    opt = make_optimizer(groups, cfg)

    losses = run_steps(ctx, cfg, plain_step(ctx, cfg, model, opt), full_batch(ctx, cfg), track=(model, opt))
    full = {}
    for name, p in model.named_parameters():
        value = (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            value[order] = value.clone()  # row i of the permuted tensor is row order[i] of the original
        full[name] = value
    return RankOutput(losses=losses, params=full)
