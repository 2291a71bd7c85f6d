"""Layer-wise model parallel (``mp``): parity with ``single``, the split, the trace that shows
only one device computing at a time, and the same split with PyTorch's RPC framework."""
from functools import lru_cache

import pytest

import mpkit
from mpkit.crosscheck import rpc_model_parallel
from mpkit.models import ModelConfig, build_model

# mp runs exactly the single model's ops on the whole batch, just on different processes:
# same op order, so results are identical; atol=1e-6 leaves room for float32 reduction order
# on another machine (values ~1).
ATOL = 1e-6


@lru_cache(maxsize=None)
def run(model, world_size):
    return mpkit.train("mp", world_size, model=model, steps=3)


@lru_cache(maxsize=None)
def reference(model):
    return mpkit.train("single", 1, model=model, steps=3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_matches_single(model, world_size):
    r, ref = run(model, world_size), reference(model)
    assert len(r.losses) == 3
    assert max(abs(a - b) for a, b in zip(r.losses, ref.losses)) <= ATOL
    assert set(r.params) == set(ref.params)
    for name, tensor in ref.params.items():
        assert (r.params[name] - tensor).abs().max().item() <= ATOL, name


@pytest.mark.timeout(120)
def test_each_rank_keeps_only_its_layers_balanced_by_parameters():
    r = run("gpt", 4)
    # gpt: [embedding, block x4, head]; the light embedding and head join a block each
    assert [e["layers"] for e in r.extra] == [[0, 1], [2], [3], [4, 5]]
    layers = build_model(ModelConfig(kind="gpt")).layers
    for rank, extra in enumerate(r.extra):
        count = sum(p.numel() for i in extra["layers"] for p in layers[i].parameters())
        assert extra["parameters"] == count
        assert r.memory[rank].final_by_category["parameters"] == 4 * count  # fp32, nothing else kept
    assert [e["layers"] for e in run("mlp", 2).extra] == [[0, 1], [2, 3]]  # 6272 vs 4680 parameters


@pytest.mark.timeout(120)
def test_only_one_device_computes_at_a_time_the_others_wait_in_recv():
    r = run("mlp", 4)
    for step in range(3):
        spans = sorted((e.start, e.end, e.rank) for e in r.trace.events
                       if e.step == step and e.kind in ("forward", "backward"))
        assert len(spans) == 2 * 4
        for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
            assert start >= end  # no two ranks' compute overlaps
        # forward goes 0,1,2,3 and backward 3,2,1,0
        assert [rank for *_, rank in spans] == [0, 1, 2, 3, 3, 2, 1, 0]
    recvs = r.trace.filter(kind="recv")
    assert {e.rank for e in recvs.events} == {0, 1, 2, 3}
    # every rank but the one computing is idle: at least (p-1)/p of compute rank-time is bubble
    fb = r.trace.filter(kind="forward").events + r.trace.filter(kind="backward").events
    busy = sum(e.duration for e in fb)
    window = max(e.end for e in fb) - min(e.start for e in fb)
    assert 1 - busy / (4 * window) >= 3 / 4


def test_more_ranks_than_layers_is_refused():
    with pytest.raises(ValueError, match=r"world_size=5 is more than the 4 layers of the model; "
                                         r"use world_size<=4 or a deeper model \(layers=5\)"):
        mpkit.train("mp", 5)
    with pytest.raises(ValueError, match=r"more than the 6 layers .* \(layers=5\)"):
        mpkit.train("mp", 7, model="gpt")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model, optimizer, world_size", [("mlp", "adam", 2), ("gpt", "sgd", 4)])
def test_rpc_model_parallel_matches_mp(model, optimizer, world_size):
    """rpc_sync from stage to stage, dist_autograd and DistributedOptimizer (the seed's "rpc
    implements model parallelism") against our mp: the same ops in the same order, and Adam or
    SGD applied per parameter by the functional optimizers, so within ATOL of each other."""
    ours = mpkit.train("mp", world_size, model=model, optimizer=optimizer, steps=3)
    driver, *others = rpc_model_parallel.train(world_size, model=model, optimizer=optimizer, steps=3, timeout=90)
    assert all(out.losses is None and not out.params for out in others)  # they only answered calls
    assert driver.losses == pytest.approx(ours.losses, abs=ATOL) and len(driver.losses) == 3
    assert sorted(driver.params) == sorted(ours.params)  # every stage's parameters, fetched from its owner
    assert max((driver.params[name] - t).abs().max().item() for name, t in ours.params.items()) <= ATOL
