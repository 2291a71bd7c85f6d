"""The strategy registry: name -> module. Each module defines

- ``OPTIONS``: its own options and their defaults (anything else is rejected by name),
- ``validate(cfg)``: raise ``ValueError`` saying what to change, before any rank starts,
- ``run_rank(ctx, cfg) -> RankOutput``: the training loop of one rank.
"""
from importlib import import_module

from mpkit.config import TrainConfig, build_config

STRATEGIES = {
    "single": "reference run on one device",
    "dp": "data parallel from scratch: broadcast, shard batch, all-reduce gradients (buckets, overlap)",
    "ddp": "torch.nn.parallel.DistributedDataParallel",
    "zero1": "data parallel with optimizer state sharded across ranks (ZeRO stage 1)",
    "fsdp": "FSDP2 fully_shard: parameters, gradients and optimizer state sharded (ZeRO-3)",
    "mp": "layer-wise model parallel: consecutive layers on different devices",
    "tp": "Megatron tensor parallel: column- then row-parallel linear layers",
    "pp": "pipeline parallel: micro-batches through stages (gpipe, 1f1b, interleaved)",
    "ps": "parameter server over torch.distributed.rpc (mode sync or async)",
}


def get_strategy(name):
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is unknown; use one of {', '.join(STRATEGIES)}")
    return import_module(f"mpkit.strategies.{name}")


def make_config(strategy, world_size, *, model="mlp", steps=3, batch_size=32, lr=1e-2, optimizer="adam",
                seed=0, **options) -> TrainConfig:
    """Resolve model sizes and strategy options into a ``TrainConfig`` checked by the strategy too."""
    module = get_strategy(strategy)
    cfg = build_config(strategy, world_size, options, module.OPTIONS, model=model, steps=steps,
                       batch_size=batch_size, lr=lr, optimizer=optimizer, seed=seed)
    module.validate(cfg)
    return cfg
