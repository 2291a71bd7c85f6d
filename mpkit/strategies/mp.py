"""Layer-wise model parallel: consecutive layers on consecutive devices ("layer 1 on GPU 1,
layer 2 on GPU 2").

Each device holds only its layers, so a model too big for one device fits on several. But the
whole batch goes through the devices one after another: rank 0 computes, sends its activation
to rank 1 and waits; ... the last rank computes the loss and the gradients flow back the same
way. In this naive split only one device computes at a time, the others wait in ``recv`` — the
bubble share is (p-1)/p. It is the pipeline (``pp``) with one micro-batch: the same stages, the
same executor, a GPipe schedule with m = 1 (``mpkit.parallel.parallelize`` on a mesh of
``pp = world_size``); more micro-batches fill the bubble.
"""
from mpkit.parallel.parallelize import Plan
from mpkit.strategies.base import Strategy
from mpkit.strategies.checks import check_stages
from mpkit.strategies.loop import parallelized, recipe, train_parallelized
from mpkit.strategies.programs import pipeline_program

OPTIONS = {}


def validate(cfg):
    check_stages(cfg, cfg.world_size, "world_size")


def run_rank(ctx, cfg):
    par = parallelized(ctx, cfg, STRATEGY.mesh(cfg), Plan(**recipe(cfg), schedule="gpipe", micro_batches=1))
    out = train_parallelized(ctx, cfg, par)
    (layers,) = par.layers.values()  # one stage per rank
    out.extra.update(layers=layers, parameters=sum(p.numel() for p in par.model.parameters()))
    return out


def program(pricer):
    return pipeline_program(pricer, "gpipe", 1, 1)


STRATEGY = Strategy("mp", OPTIONS, validate, run_rank, program, dim='pp', takes_precision=True)
