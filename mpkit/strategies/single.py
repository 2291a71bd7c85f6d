"""The reference: the whole model on one device, the global batch at once. Every other
strategy is tested against this run."""
from mpkit.models import build_model
from mpkit.strategies.common import RankOutput, make_optimizer, state_of, train_full_batch

OPTIONS = {}


def validate(cfg):
    if cfg.world_size != 1:
        raise ValueError(f"strategy='single' runs on one device; use world_size=1 (got {cfg.world_size})")


def run_rank(ctx, cfg):
    model = build_model(cfg.model, cfg.seed).to(ctx.device)
    losses = train_full_batch(ctx, cfg, model, make_optimizer(model.parameters(), cfg))
    return RankOutput(losses=losses, params=state_of(model))
