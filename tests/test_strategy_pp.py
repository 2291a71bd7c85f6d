"""Pipeline parallel (``pp``): parity with ``single`` for every schedule, the same results as
``torch.distributed.pipelining`` on the same split, the trace, and bad options."""
from functools import lru_cache

import pytest

import mpkit
from mpkit.crosscheck import pipelining as torch_pipelining
from mpkit.parallel.pipeline.schedules import COMPUTE, schedule
from mpkit.strategies import make_config

# Micro-batching changes only float32 summation order (per-micro-batch means / m, gradients
# accumulated over micro-batches): ~1e-7 relative on losses ~2-4 and weights ~0.1-1.
# 1e-5 leaves an order of magnitude. The gpt runs use SGD: Adam's first step moves a weight by
# ~lr·g/(|g|+eps) whatever g's size, so weights whose true gradient is 0 (the attention key bias:
# softmax ignores a per-query constant) turn float noise into ~1e-4 differences.
ATOL = 1e-5
OPTIMIZER = {"mlp": "adam", "gpt": "sgd"}
CASES = [("gpipe", {}), ("1f1b", {}), ("interleaved", {"virtual_stages": 2})]


def model_sizes(model, schedule_name):
    # interleaved needs world_size*2 stages: 8 mlp layers / gpt 6 blocks + embedding + head
    if schedule_name == "interleaved":
        return {"layers": 8 if model == "mlp" else 6}
    return {}


@lru_cache(maxsize=None)
def run(model, world_size, name, micro_batches=4, optimizer=None, layer_ms=0.0):
    return mpkit.train("pp", world_size, model=model, steps=3, schedule=name, micro_batches=micro_batches,
                       optimizer=optimizer or OPTIMIZER[model], layer_ms=layer_ms, **model_sizes(model, name))


def assert_close(losses, params, ref_losses, ref_params, atol):
    assert len(losses) == len(ref_losses) == 3
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= atol
    assert set(params) == set(ref_params)
    for name, tensor in ref_params.items():
        assert (params[name] - tensor).abs().max().item() <= atol, name


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_matches_single(model, world_size, name):
    r = run(model, world_size, name)
    ref = r.reference()
    assert_close(r.losses, r.params, ref.losses, ref.params, ATOL)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model,optimizer", [("mlp", "adam"), ("gpt", "adam")])
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_same_as_torch_distributed_pipelining(model, optimizer, world_size, name):
    ours = run(model, world_size, name, optimizer=optimizer)
    cfg = make_config("pp", world_size, model=model, steps=3, schedule=name, micro_batches=4, optimizer=optimizer)
    outputs = mpkit.launch(torch_pipelining.run_rank, world_size, args=(cfg,), timeout=90, memory=False)
    losses = next(o.losses for o in outputs if o.losses is not None)
    params = {k: v for o in outputs for k, v in o.params.items()}
    # same stages, same per-micro-batch ops: gradients agree to float32 rounding (Adam included,
    # as both sum the same micro-batch gradients); torch averages the m losses in another order.
    assert_close(losses, params, ours.losses, ours.params, 1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_trace_follows_the_program(name):
    r = run("mlp", 4, name)
    v = 2 if name == "interleaved" else 1
    programs = schedule(name, 4, 4, v)
    for rank in range(4):
        for step in range(3):
            done = [(e.kind, e.micro_batch, e.stage) for e in r.trace.of_rank(rank)
                    if e.step == step and e.kind in ("forward", "backward")]
            planned = [(type(i).__name__.lower(), i.mb, i.stage) for i in programs[rank] if isinstance(i, COMPUTE)]
            assert done == planned
    hidden = r.config.model.hidden
    sends = r.trace.filter(kind="send").events
    assert sends and all(e.bytes == (32 // 4) * hidden * 4 for e in sends)  # one micro-batch's activation
    assert all(e.micro_batch is not None and e.stage is not None for e in sends)
    assert r.extra[0]["stages"] == ([0, 4] if v == 2 else [0])
    assert r.losses and all(x is None for x in (o.losses for o in r.outputs[:-1]))


def overlapping_compute(trace, step):
    """Pairs of forward/backward spans of different ranks that overlap in time."""
    spans = [e for e in trace.events if e.step == step and e.kind in ("forward", "backward")]
    return [(a, b) for a in spans for b in spans
            if a.rank < b.rank and a.start < b.end and b.start < a.end]


@pytest.mark.timeout(120)
def test_micro_batches_let_ranks_compute_at_once():
    # m=1 is layer-wise MP: one rank computes at a time, bubble >= (p-1)/p; with m=8 the next
    # micro-batch's forward runs while the following rank works on the previous one. (How big
    # the bubble gets is timing; benchmarks/pp.py measures it on balanced stages.)
    # layer_ms=5 gives each rank's (one-layer) stage 5 ms of slept device time per forward: rank 0
    # runs 8 forwards back to back for >= 40 ms while rank 1 may start micro-batch 0 after 5 ms, so
    # m=8 shows no overlap only if rank 1 woke > 35 ms late; a blocked receive under load wakes in
    # 0.6-3.2 ms (BENCHMARKS.md). Without it a forward takes ~0.1 ms and one wake-up hides it all.
    one, eight = (run("mlp", 4, "gpipe", micro_batches=m, layer_ms=5.0) for m in (1, 8))
    assert one.losses == pytest.approx(eight.losses, abs=ATOL)
    assert overlapping_compute(one.trace, 2) == []
    assert one.trace.pipeline_bubble(2) >= 0.75
    assert overlapping_compute(eight.trace, 2)


@pytest.mark.parametrize("options,match", [
    ({"schedule": "zb"}, "schedule='zb' is unknown; use one of 'gpipe', '1f1b', 'interleaved'"),
    ({"micro_batches": 3}, "micro_batches=3 does not divide batch_size=32"),
    ({"micro_batches": 0}, "micro_batches=0: pass a whole number >= 1"),
    ({"schedule": "interleaved", "micro_batches": 6}, "micro_batches to be a multiple of world_size=4"),
    ({"schedule": "interleaved", "virtual_stages": 1}, "virtual_stages=1"),
    ({"schedule": "interleaved"}, r"world_size\*virtual_stages=4\*2: stages=8 is more than the 4 layers"),
    ({"layers": 3}, "stages=4 is more than the 3 layers of the model; use stages<=3 or a deeper model"),
])
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        make_config("pp", 4, **options)


# ---- a learner's model with a parameter-free layer, interleaved ------------------------------

def relu_stage_net():
    """Four layers, so 2 ranks x 2 virtual stages give one each: stage 1 is the ReLU alone, on
    rank 1, which also holds stage 3 (the output layer)."""
    from torch import nn
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.Linear(16, 5))


def whole_rank_without_parameters_net():
    """Rank 1 of 2 would hold stage 1 (ReLU) and stage 3 (Flatten): no parameter at all."""
    from torch import nn
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 5), nn.Flatten())


def regression_data(step, batch_size):
    import torch
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(batch_size, 6, generator=g), torch.randint(0, 5, (batch_size,), generator=g)


@pytest.mark.timeout(200)
def test_interleaved_trains_a_parameter_free_stage_on_a_rank_with_other_stages():
    import torch.nn.functional as F
    # was refused per stage ("stage 1 would hold only layers [1] (ReLU)"), though rank 1 also holds
    # stage 3 and has something to train. Micro-batching changes only float32 summation order
    # (per-micro-batch means / m, gradients accumulated): ATOL (1e-5) as for the built-in models.
    r = mpkit.train("pp", 2, model=relu_stage_net, data=regression_data, loss=F.cross_entropy, steps=3,
                    batch_size=8, optimizer="adam", schedule="interleaved", virtual_stages=2, micro_batches=2)
    assert r.extra[1]["stages"] == [1, 3] and r.extra[1]["layers"] == {1: [1], 3: [3]}
    ref = r.reference()
    assert_close(r.losses, r.params, ref.losses, ref.params, ATOL)


@pytest.mark.timeout(30)
def test_a_rank_whose_stages_hold_no_parameters_is_refused():
    with pytest.raises(ValueError, match=r"rank 1 would hold only stages 1 \(layers \[1\]: ReLU\) and 3 \(layers "
                                         r"\[3\]: Flatten\), none of which has parameters, so it would have nothing "
                                         r"to train; the rule: .*This model has 2 \(0: Linear, 2: Linear\): use "
                                         r"at most 2 stages"):
        make_config("pp", 2, model=whole_rank_without_parameters_net, data=regression_data,
                    schedule="interleaved", virtual_stages=2, micro_batches=2, batch_size=8)
