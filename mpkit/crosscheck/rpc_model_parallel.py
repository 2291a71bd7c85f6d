"""The layer-wise split of ``mp`` with PyTorch's RPC framework: what the seed note means by
"torch.distributed.rpc: 모델 병렬화를 구현" (cross-check for ``mp``).

Rank r owns stage r, the same cut as ``mp`` (``loop.all_stages``). Rank 0 drives every step: its own
stage, then ``rpc_sync`` hands the activation to the next stage's owner, which runs it and
returns the result; rank 0 computes the loss, ``dist_autograd.backward`` carries the gradients
back across the ranks, and ``DistributedOptimizer`` updates each stage's parameters where they
live (through their ``RRef``\\ s). One device computes at a time, as in ``mp``; the other ranks
only answer calls. rpc is in maintenance mode; it is here to show the seed's claim run.
``train(world_size, **options)`` runs it like ``mpkit.train("mp", ...)`` (the driver's output first).
"""
from torch.distributed import autograd as dist_autograd
from torch.distributed import rpc
from torch.distributed.optim import DistributedOptimizer

from mpkit.runtime.launch import launch
from mpkit.strategies import make_config
from mpkit.strategies.base import RankOutput, optimizer_spec
from mpkit.strategies.loop import all_stages, full_batch, run_steps
from mpkit.strategies.rpcworld import join_rpc

_stage = None  # this process's stage: the driver's calls run it where its parameters live


def _forward(activation):
    return _stage(activation)


def _parameter_rrefs():
    return [rpc.RRef(p) for p in _stage.parameters()]


def _parameters(prefix):
    return {name: t.detach().clone() for name, t in _stage.named_as_original(prefix).items()}


def run_rank(ctx, cfg):
    global _stage
    p = ctx.world_size
    _stage = all_stages(cfg, p)[ctx.rank].to(ctx.device)
    join_rpc(ctx)
    if ctx.rank != 0:
        rpc.shutdown()  # answers the driver's calls until every rank is done
        return RankOutput()
    owners = [f"rank{r}" for r in range(p)]
    cls, kwargs = optimizer_spec(cfg)
    kwargs.pop("foreach", None)  # the functional optimizers behind DistributedOptimizer take no foreach
    optimizer = DistributedOptimizer(cls, [rref for owner in owners for rref in rpc.rpc_sync(owner, _parameter_rrefs)],
                                     **kwargs)

    def step(x, y):
        with dist_autograd.context() as context_id:
            activation = _stage(x)
            for owner in owners[1:]:
                activation = rpc.rpc_sync(owner, _forward, args=(activation,))
            loss = cfg.model.loss(activation, y)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)
        return loss.item()

    losses = run_steps(ctx, cfg, step, full_batch(ctx, cfg))
    prefix = "layers." if cfg.model.builtin else ""
    params = {name: t for owner in owners for name, t in rpc.rpc_sync(owner, _parameters, args=(prefix,)).items()}
    rpc.shutdown()
    return RankOutput(losses=losses, params=params)


def train(world_size=2, *, timeout=120.0, **options):
    """Run the model and options of ``mpkit.train("mp", world_size, **options)`` over rpc; the
    per-rank ``RankOutput`` list (rank 0, the driver, holds the losses and every parameter).
    No memory tracking: the tracker follows each rank's main thread, and a stage owner runs its
    stage in rpc's threads (its peak would read 0)."""
    return launch(run_rank, world_size=world_size, args=(make_config("mp", world_size, **options),),
                  timeout=timeout, memory=False)
