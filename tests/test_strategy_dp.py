"""The data-parallel family (dp from scratch, ddp, zero1, fsdp): parity with ``single``, zero1
against PyTorch's ZeroRedundancyOptimizer, buckets and overlap in the trace, bad options."""
import functools

import pytest
import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import mpkit
from mpkit.models import ModelConfig, build_model, parameter_count
from mpkit.parallel.buckets import plan_buckets
from mpkit.strategies.base import state_of
from mpkit.strategies.loop import group_mean, local_batch, plain_step, run_steps
from mpkit.strategies import make_config

# Float32 reduction-order differences only: each rank's mean over b/N samples, summed over ranks
# and divided by N, rounds differently from one mean over b samples: ~1e-7 relative on losses ~2-4
# and weights ~0.1. Measured: losses <= 5e-7, parameters <= 1.2e-7.
LOSS_ATOL = 1e-5
PARAM_ATOL = 1e-6

# Optimizer per model. With Adam, a gradient element that is zero in exact arithmetic is rounding
# noise (~1e-9) whose sign depends on the reduction order, and Adam normalises it to a step of
# ±lr: the gpt's key bias (softmax ignores q·b_k added to a whole row) and a few dead MLP units
# differ by up to 1.4e-4 between two correct runs. Adam is also blind to a missing 1/N (it is
# scale invariant), SGD is not. So gpt parameters are checked with SGD, gpt + Adam via the losses.
PARITY_CASES = [("mlp", "adam", 2), ("mlp", "adam", 4), ("gpt", "sgd", 2), ("gpt", "sgd", 4)]
STRATEGIES = ["dp", "ddp", "zero1", "fsdp"]


@functools.cache
def run_of(strategy, model="mlp", optimizer="adam", world_size=4, **options):
    return mpkit.train(strategy, world_size=world_size, model=model, optimizer=optimizer, steps=3, **options)


@functools.cache
def reference(model, optimizer, **sizes):
    return mpkit.train("single", model=model, optimizer=optimizer, steps=3, **sizes)


def diffs(run, ref):
    loss = max(abs(a - b) for a, b in zip(run.losses, ref.losses))
    assert set(run.params) == set(ref.params)
    params = max((run.params[n] - t).abs().max().item() for n, t in ref.params.items())
    return loss, params


def assert_matches(run, ref, params=True):
    assert len(run.losses) == 3 and run.losses[-1] < run.losses[0]
    loss, param = diffs(run, ref)
    assert loss <= LOSS_ATOL, loss
    if params:
        assert param <= PARAM_ATOL, param


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("model,optimizer,world_size", PARITY_CASES)
def test_parity_with_single(strategy, model, optimizer, world_size):
    assert_matches(run_of(strategy, model, optimizer, world_size), reference(model, optimizer))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gpt_adam_losses_match_single(strategy):
    assert_matches(run_of(strategy, "gpt", "adam", 4), reference("gpt", "adam"), params=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("bucket_mb,overlap", [(0, False), (0.001, True), (0.05, False), (0.05, True),
                                               (25.0, True)])
def test_dp_buckets_and_overlap_match_single(bucket_mb, overlap):
    run = run_of("dp", "gpt", "sgd", 4, bucket_mb=bucket_mb, overlap=overlap)
    assert_matches(run, reference("gpt", "sgd"))
    # every step all-reduces each gradient exactly once: 4 bytes per parameter, per rank
    psi = parameter_count(ModelConfig(kind="gpt"))
    assert run.extra[0]["all_reduce_bytes_per_step"] == 4 * psi
    for step in range(3):
        grads = [e for e in run.trace.filter(kind="all_reduce", step=step).events if e.name.startswith("bucket")]
        assert sum(e.bytes for e in grads) == 4 * psi * 4
        assert len(grads) == run.extra[0]["buckets"] * 4


def test_bucket_plan():
    model = build_model(ModelConfig(kind="gpt"))
    params = list(model.parameters())
    assert plan_buckets(params, 0) == [[p] for p in reversed(params)]  # one per tensor
    assert plan_buckets(params, 25 * 2**20) == [list(reversed(params))]  # all in one
    cap = 50_000
    buckets = plan_buckets(params, cap)
    assert [p for b in buckets for p in b] == list(reversed(params))  # reverse order, each once
    for bucket in buckets:  # never over the cap, unless a single tensor is bigger than it
        assert len(bucket) == 1 or sum(4 * p.numel() for p in bucket) <= cap
    for a, b in zip(buckets, buckets[1:]):  # greedy: the next tensor did not fit
        assert sum(4 * p.numel() for p in a) + 4 * b[0].numel() > cap


@pytest.mark.timeout(120)
def test_overlap_starts_all_reduce_during_backward():
    """overlap=True: bucket all-reduces start before backward ends; overlap=False: only after."""
    for overlap in (True, False):
        run = run_of("dp", "gpt", "sgd", 4, bucket_mb=0.05, overlap=overlap)
        assert run.extra[0]["buckets"] >= 10
        for rank in range(4):
            for step in range(3):
                events = [e for e in run.trace.of_rank(rank) if e.step == step]
                backward_end = max(e.end for e in events if e.kind == "backward")
                starts = [e.start for e in events if e.kind == "all_reduce"]
                early = sum(s < backward_end for s in starts)
                if overlap:
                    assert early == len(starts) > 0, (rank, step, early, len(starts))
                else:
                    assert early == 0


@pytest.mark.timeout(120)
def test_dp_on_one_rank_is_single():
    """world_size=1 is allowed: all-reduces of one rank are no-ops, so it is the reference exactly."""
    run = run_of("dp", "mlp", "adam", 1, bucket_mb=0.001, overlap=True)
    ref = reference("mlp", "adam")
    assert run.losses == ref.losses
    assert all(torch.equal(run.params[n], t) for n, t in ref.params.items())


@pytest.mark.timeout(120)
def test_ddp_traces_one_all_reduce_per_bucket():
    """DDP's first step uses a first bucket of 1 MiB (all 818 KiB of the gpt fit), then it rebuilds
    the buckets with bucket_cap_mb: with 0, one bucket per tensor."""
    run = run_of("ddp", "gpt", "sgd", 4, bucket_mb=0)
    n_tensors = len(list(build_model(ModelConfig(kind="gpt")).parameters()))
    psi = parameter_count(ModelConfig(kind="gpt"))
    assert run.extra[0]["buckets"] == n_tensors
    for step, buckets in ((0, 1), (1, n_tensors), (2, n_tensors)):
        events = run.trace.filter(kind="all_reduce", step=step).events
        assert len(events) == 4 * buckets
        assert sum(e.bytes for e in events) == 4 * 4 * psi


@pytest.mark.timeout(120)
def test_zero1_and_fsdp_communication_volume():
    """zero1: reduce-scatter of the gradients + all-gather of the parameters, each the full
    (padded) model per step; fsdp: every layer gathered for forward and again for backward, and
    its gradients reduce-scattered once."""
    cfg = ModelConfig(kind="gpt")
    psi = parameter_count(cfg)
    zero = run_of("zero1", "gpt", "sgd", 4)
    fsdp = run_of("fsdp", "gpt", "sgd", 4)
    for step in range(3):
        by_kind = {k: [e for e in zero.trace.filter(step=step).events if e.kind == k and e.rank == 0]
                   for k in ("reduce_scatter", "all_gather")}
        assert [e.bytes for e in by_kind["reduce_scatter"]] == [4 * psi]  # psi % 4 == 0: no padding
        assert [e.bytes for e in by_kind["all_gather"]] == [4 * psi]
        events = [e for e in fsdp.trace.filter(step=step).events if e.rank == 0]
        assert sum(e.kind == "all_gather" for e in events) == 2 * cfg.num_layers
        assert sum(e.kind == "reduce_scatter" for e in events) == cfg.num_layers
        assert sum(e.bytes for e in events if e.kind == "reduce_scatter") == 4 * psi


def _zero_redundancy_rank(ctx, cfg):
    """PyTorch's ZeRO-1: DDP for the gradients, ZeroRedundancyOptimizer shards Adam's state."""
    model = build_model(cfg.model, cfg.seed)
    ddp = DistributedDataParallel(model)
    optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=cfg.lr,
                                        foreach=True)
    return group_mean(ctx, run_steps(ctx, cfg, plain_step(ctx, cfg, ddp, optimizer), local_batch(ctx, cfg))), \
        state_of(model)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
def test_zero1_matches_zero_redundancy_optimizer(world_size):
    cfg = make_config("zero1", world_size, model="mlp", steps=3)
    losses, params = mpkit.launch(_zero_redundancy_rank, world_size, args=(cfg,), timeout=100)[0]
    ours = run_of("zero1", "mlp", "adam", world_size)
    assert max(abs(a - b) for a, b in zip(ours.losses, losses)) <= LOSS_ATOL
    assert max((ours.params[n] - t).abs().max().item() for n, t in params.items()) <= PARAM_ATOL


@pytest.mark.timeout(120)
def test_zero1_pads_uneven_shards():
    """hidden=63 gives an odd parameter count: the flat buffer is padded to a multiple of N."""
    run = run_of("zero1", "mlp", "adam", 4, hidden=63, batch_size=24)
    psi = parameter_count(ModelConfig(hidden=63))
    assert psi % 4 and run.extra[0]["padding"] == -psi % 4
    assert_matches(run, reference("mlp", "adam", hidden=63, batch_size=24))


@pytest.mark.timeout(120)
def test_fsdp_uneven_dim0_matches_single():
    run = run_of("fsdp", "mlp", "adam", 4, hidden=63, batch_size=24)
    assert_matches(run, reference("mlp", "adam", hidden=63, batch_size=24))


@pytest.mark.parametrize("strategy,options,match", [
    ("dp", {"batch_size": 30}, "world_size=4 does not divide batch_size=30"),
    ("ddp", {"batch_size": 30}, "world_size=4 does not divide batch_size=30"),
    ("zero1", {"batch_size": 30}, "world_size=4 does not divide batch_size=30"),
    ("fsdp", {"batch_size": 30}, "world_size=4 does not divide batch_size=30"),
    ("dp", {"bucket_mb": -1}, "bucket_mb=-1 must be a number of MiB >= 0"),
    ("dp", {"bucket_mb": "25"}, "bucket_mb='25' must be a number"),
    ("dp", {"bucket_mb": float("nan")}, "bucket_mb=nan must be a number"),
    ("ddp", {"bucket_mb": -0.5}, "bucket_mb=-0.5 must be a number of MiB >= 0"),
    ("dp", {"overlap": "yes"}, "overlap='yes' must be True"),
    ("zero1", {"bucket_mb": 1}, r"option\(s\) \['bucket_mb'\] do not apply to strategy='zero1'"),
])
def test_bad_options(strategy, options, match):
    with pytest.raises(ValueError, match=match):
        make_config(strategy, 4, **options)
