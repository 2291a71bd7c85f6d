"""The reference: the whole model on one device, the global batch at once. Every other
strategy is tested against this run."""
from mpkit.models import build_model, loss_fn, make_batch
from mpkit.strategies.common import RankOutput, make_optimizer, state_of

OPTIONS = {}


def validate(cfg):
    if cfg.world_size != 1:
        raise ValueError(f"strategy='single' runs on one device; use world_size=1 (got {cfg.world_size})")


def run_rank(ctx, cfg):
    model = build_model(cfg.model, cfg.seed).to(ctx.device)
    optimizer = make_optimizer(model.parameters(), cfg)
    losses = []
    with ctx.memory.track(model, optimizer):
        for step in range(cfg.steps):
            ctx.set_step(step)
            x, y = (t.to(ctx.device) for t in make_batch(cfg.model, cfg.batch_size, step, cfg.seed))
            with ctx.trace.span("forward"):
                loss = loss_fn(cfg.model, model(x), y)
            with ctx.trace.span("backward"):
                loss.backward()
            with ctx.trace.span("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    return RankOutput(losses=losses, params=state_of(model))
