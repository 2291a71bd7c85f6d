"""Parameter server over rpc: sync equals ``single``; async learns from stale gradients."""
import functools

import pytest
import torch

import mpkit
from mpkit.models import ModelConfig, UserModel, build_model, loss_fn, make_batch, parameter_count

BATCH = 24  # divisible by 1 and 3 workers (world_size 2 and 4) and by 2 workers (world_size 3)

# Float32 reduction-order differences only: the server averages per-shard mean gradients where
# single takes one mean over the batch (~1e-7 relative; losses ~2-4, weights ~0.1).
LOSS_ATOL = 1e-5
PARAM_ATOL = 1e-6
# Adam divides each gradient element by its own running RMS, so an element that is tiny (mlp:
# measured 6e-7) or zero in exact arithmetic (gpt's key bias, see test_strategy_tp) turns its
# rounding difference into a visible step difference. mlp runs Adam with a looser parameter
# bound; gpt runs SGD, where every difference stays at rounding level.
ADAM_PARAM_ATOL = 1e-5


def ps_run(world_size, mode="sync", model="mlp", optimizer="adam", steps=3):
    return _cached_run(world_size, mode, model, optimizer, steps)  # one cache key per run, however called


@functools.cache
def _cached_run(world_size, mode, model, optimizer, steps):
    return mpkit.train("ps", world_size=world_size, mode=mode, model=model, optimizer=optimizer, steps=steps,
                       batch_size=BATCH)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model,optimizer,world_size", [
    ("mlp", "adam", 2), ("mlp", "adam", 4), ("gpt", "sgd", 2), ("gpt", "sgd", 4)])
def test_sync_matches_single(model, optimizer, world_size):
    run = ps_run(world_size, model=model, optimizer=optimizer)
    cmp = run.compare_to_reference()
    assert len(run.losses) == 3 and cmp.loss <= LOSS_ATOL, cmp
    assert cmp.params <= (ADAM_PARAM_ATOL if optimizer == "adam" else PARAM_ATOL), cmp
    server = run.extra[0]
    assert server["staleness"] == [0] * 3 * (world_size - 1)  # every push was computed on the newest version
    assert server["pushes_per_worker"] == {w: 3 for w in range(1, world_size)}


@pytest.mark.timeout(120)
def test_sync_roles_trace_and_memory():
    run = ps_run(4)
    param_bytes = 4 * parameter_count(ModelConfig())
    assert [e["role"] for e in run.extra] == ["server", "worker", "worker", "worker"]
    kinds = {r: {e.kind for e in run.trace.of_rank(r)} for r in range(4)}
    assert {"optimizer", "rpc"} <= kinds[0] and not {"forward", "backward"} & kinds[0]
    assert all({"forward", "backward", "rpc"} <= kinds[r] and "optimizer" not in kinds[r] for r in (1, 2, 3))
    rpc = [e for e in run.trace.events if e.kind == "rpc"]
    pushes = [e for e in rpc if e.name.startswith("push")]
    replies = [e for e in rpc if e.name.startswith("pull reply")]
    assert len(pushes) == 9 and {e.bytes for e in pushes} == {param_bytes}  # a gradient per parameter
    assert len(replies) == 6 and {e.bytes for e in replies} == {param_bytes}  # steps 1, 2 of each worker
    # The server answers pulls on rpc threads while its loop may be on another step: each reply
    # carries the step of the worker's pull it answers, never the server's current one.
    for w in (1, 2, 3):
        pulls = sorted(e.step for e in rpc if e.rank == w and e.name.startswith("pull version"))
        assert pulls == [1, 2] and sorted(e.step for e in replies if e.name == f"pull reply to rank {w}") == pulls
    server, worker = run.memory[0].max_by_category, run.memory[1].max_by_category
    assert server["parameters"] == server["gradients"] == param_bytes
    assert server["optimizer"] >= 2 * param_bytes and server["activations"] == 0  # the server never runs the model
    assert worker["parameters"] == worker["gradients"] == param_bytes and worker["optimizer"] == 0
    assert worker["activations"] > 0


@pytest.mark.timeout(120)
def test_async_learns_from_stale_gradients():
    steps, workers = 12, 3  # 36 Adam steps: enough to learn visibly despite stale gradients
    run = ps_run(workers + 1, mode="async", steps=steps)
    server = run.extra[0]
    order, staleness = server["apply_order"], server["staleness"]
    assert len(run.losses) == len(order) == len(staleness) == steps * workers
    assert server["pushes_per_worker"] == {w: steps for w in range(1, workers + 1)}
    # Every worker's first gradient is computed on version 0 and only one push can be applied
    # at version 0, so at least workers-1 pushes are stale; no push can be staler than the
    # number of pushes applied before it.
    assert sum(s > 0 for s in staleness) >= workers - 1
    assert all(0 <= s <= i for i, s in enumerate(staleness))
    losses = dict(zip(order, run.losses))
    first = [losses[(w, 0)] for w in range(1, workers + 1)]
    # step 0: every worker saw version 0, so their shard losses average to single's first loss
    assert sum(first) / workers == pytest.approx(run.reference().losses[0], abs=LOSS_ATOL)
    # Learning, judged on one large held-out batch: shard losses (8 samples, a fresh batch each
    # step) are too noisy to compare the first step with the last (a CI run once saw them rise).
    initial = build_model(run.config.model, run.config.seed).state_dict()
    before, after = held_out_loss(initial), held_out_loss(run.params)
    assert after < before, (before, after)  # measured 1.82-1.98 from 2.09 in 14 runs (single: 1.91)


def held_out_loss(params, samples=4096):
    """The default mlp's loss with ``params`` on a batch no step trained on (same teacher)."""
    cfg = ModelConfig()
    model = build_model(cfg)
    model.load_state_dict(params)
    x, y = make_batch(cfg, samples, step=10_000)
    with torch.no_grad():
        return loss_fn(cfg, model(x), y).item()


@pytest.mark.timeout(120)
def test_async_is_not_single_but_sync_is():
    # 3 workers x 3 steps = 9 Adam steps on shard gradients vs 3 on the global batch
    assert ps_run(4, mode="async").compare_to_reference().params > 1e-3
    assert ps_run(4).compare_to_reference().params <= ADAM_PARAM_ATOL


@pytest.mark.timeout(120)
def test_async_with_one_worker_is_sync():
    # one worker: nothing can be stale and its shard is the global batch
    run = ps_run(2, mode="async")
    assert run.extra[0]["staleness"] == [0, 0, 0]
    assert run.compare_to_reference().max == 0.0


class FrozenAndUnused(torch.nn.Module):
    """A frozen input layer (no gradient anywhere) and a branch the forward never uses."""

    def __init__(self):
        super().__init__()
        self.frozen = torch.nn.Linear(6, 8).requires_grad_(False)
        self.head = torch.nn.Linear(8, 3)
        self.unused = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.frozen(x)))


def three_classes(step, batch_size):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch_size, 6, generator=g)
    return x, (x[:, :3].sum(1) > 0).long() + (x[:, 3:].sum(1) > 0).long()


@pytest.mark.timeout(120)
def test_sync_trains_a_model_with_frozen_and_unused_parameters():
    # workers send no gradient where they have none; the server's optimizer skips a parameter no
    # worker reached, as one device's does (a worker's p.grad.cpu() on None failed before)
    run = mpkit.train("ps", world_size=3, model=FrozenAndUnused, data=three_classes, steps=3, batch_size=8)
    assert run.compare_to_reference().max <= ADAM_PARAM_ATOL
    initial = UserModel(FrozenAndUnused, three_classes).build(run.config.seed).state_dict()
    for name in ("frozen.weight", "unused.weight"):
        assert torch.equal(run.params[name], initial[name])


@pytest.mark.parametrize("kwargs,message", [
    (dict(world_size=1), "ps needs a server and at least one worker: use world_size>=2"),
    (dict(world_size=2, mode="hogwild"), "mode='hogwild' is unknown; use one of sync, async"),
    (dict(world_size=4, batch_size=2), "batch_size=2 is smaller than the 3 workers (world_size-1)"),
])
def test_bad_inputs_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError) as err:
        mpkit.train("ps", steps=1, **kwargs)
    assert message in str(err.value)
