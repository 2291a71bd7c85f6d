"""The reference: the whole model on one device, the global batch at once. Every other
strategy is tested against this run."""
from mpkit.pricing.pricing import fwd_bwd, optimizer
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer, state_of
from mpkit.strategies.checkpointing import Resumable
from mpkit.strategies.loop import build_model, full_batch, mixed_precision, plain_step, run_steps

OPTIONS = {}


def validate(cfg):
    if cfg.world_size != 1:
        raise ValueError(f"strategy='single' runs on one device; use world_size=1 (got {cfg.world_size})")


def run_rank(ctx, cfg):
    mp = mixed_precision(cfg)
    model = build_model(ctx, cfg, mp)
    opt = make_optimizer(model.parameters(), cfg)

    losses = run_steps(ctx, cfg, plain_step(ctx, cfg, model, opt, mp), full_batch(ctx, cfg), track=(model, opt),
                       state=Resumable(model, opt, mp=mp))
    return RankOutput(losses=losses, params=state_of(model), extra=mp.report())


def program(pricer):
    prof = pricer.piece()
    return [[*fwd_bwd(pricer, prof), optimizer(pricer, prof)]]


STRATEGY = Strategy("single", OPTIONS, validate, run_rank, program, takes_precision=True)
