"""Every combination on one mesh (issue 42): DP, CP, PP, TP and EP (and ZeRO-1 or FSDP over dp x cp)
composed by ``mpkit.parallel.parallelize`` under the ``3d`` strategy, in both published rank orders,
each equal to the single-device run after 2 steps.

The 8-rank combinations share one launched world (each builds its own mesh and trains in turn;
``three_d.run_rank`` is what ``mpkit.train("3d", ...)`` runs on every rank), so the whole set costs
one start-up; the 16-rank 2x2x2x2 layout of Llama 3 (Dubey et al. 2024, §3.3.2: [TP, CP, PP, DP]
innermost first, the planner's default order) runs through ``mpkit.train`` as a learner would.

Tolerance, as in tests/test_strategy_3d*.py: SGD keeps every difference at float32 rounding level
(split matmuls, the shard means averaged over dp x cp, the ring's softmax merge, the experts'
gradients summed over their ep group in another order), so losses agree to 1e-5 and parameters to
1e-6 (measured: losses <= 5e-7, parameters <= 2e-8). Adam would turn rounding noise into steps of
~0.1·lr (tests/test_strategy_tp.py).
"""
import functools

import pytest

import mpkit
from mpkit.strategies import get_strategy, make_config

LOSS_ATOL, PARAM_ATOL = 1e-5, 1e-6
GPT = dict(model="gpt", hidden=16, heads=2, layers=2, seq_len=8, vocab=16)  # 4 layers: embedding, 2 blocks, head
RUN = dict(steps=2, batch_size=8, optimizer="sgd")
EIGHT = {  # name: 3d options on 8 ranks
    "dp x cp x pp": dict(dp=2, cp=2, pp=2),
    "dp x cp x pp, PP outermost": dict(dp=2, cp=2, pp=2, order="megatron"),
    "pp x cp x tp, PP outermost": dict(cp=2, pp=2, tp=2, order="pp-dp-cp-tp"),
    "dp x ep x tp": dict(dp=4, tp=2, ep=2, experts=4),
    "dp x ep x tp, PP outermost, 1f1b over pp": dict(dp=2, pp=2, tp=2, ep=2, experts=4, order="megatron"),
    "fsdp x pp x tp": dict(dp=2, pp=2, tp=2, fsdp=True),
    "fsdp x cp x tp, ulysses": dict(dp=2, cp=2, tp=2, fsdp=True, attention="ulysses", heads=4),
    "zero1 x cp x pp, PP outermost": dict(dp=2, cp=2, pp=2, zero=True, order="megatron"),
    "dp x cp x tp with sp, no pipeline": dict(dp=2, cp=2, tp=2, sp=True, micro_batches=1),
}
SIZES = ("hidden", "heads", "layers", "seq_len", "vocab", "experts")


def config(world_size, options):
    return make_config("3d", world_size, **{**GPT, **RUN, **options})


def train_each(ctx, cfgs):
    """Every config in turn on this rank of one world: its RankOutput and the groups it talked in."""
    out = []
    for cfg in cfgs:
        start = len(ctx.trace.events)
        result = get_strategy("3d").run_rank(ctx, cfg)
        out.append((result, {e.group for e in ctx.trace.events[start:] if e.category == "comm" and e.step is not None}))
    return out


@functools.cache
def single(**sizes):
    return mpkit.train("single", 1, **{**GPT, **RUN, **sizes})


def merged(outputs):
    """A Run's view of the ranks' outputs: the first losses reported, each parameter from the lowest rank."""
    losses = next(o.losses for o in outputs if o.losses is not None)
    params = {}
    for o in outputs:
        for name, tensor in o.params.items():
            params.setdefault(name, tensor)
    return losses, params


@functools.cache
def eight():
    cfgs = [config(8, options) for options in EIGHT.values()]
    return mpkit.launch(train_each, world_size=8, args=(cfgs,), timeout=400)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", list(EIGHT))
def test_every_combination_on_eight_ranks_equals_single(name):
    i = list(EIGHT).index(name)
    options = EIGHT[name]
    outputs = [per_rank[i][0] for per_rank in eight()]
    losses, params = merged(outputs)
    ref = single(**{k: v for k, v in options.items() if k in SIZES})
    assert len(losses) == 2 and max(abs(a - b) for a, b in zip(losses, ref.losses)) <= LOSS_ATOL, (losses, ref.losses)
    assert set(params) == set(ref.params)
    worst = max((params[k] - t).abs().max().item() for k, t in ref.params.items())
    assert worst <= PARAM_ATOL, worst
    layout = config(8, options)  # the run's grid, as Run.mesh reads it
    grid = get_strategy("3d").mesh(layout)
    for rank, per_rank in enumerate(eight()):
        assert per_rank[i][0].extra["coords"] == grid.coords(rank)
    talked = set().union(*(per_rank[i][1] for per_rank in eight()))
    sizes = {d: getattr(grid, d) for d in ("dp", "pp", "cp", "tp", "ep")}
    want = {d for d in ("pp", "cp", "tp", "ep") if sizes[d] > 1}  # every dimension talks in its own named group
    want.add("dp_cp" if sizes["dp"] > 1 and sizes["cp"] > 1 else "dp" if sizes["dp"] > 1 else "cp")
    if sizes["ep"] > 1 and sizes["dp"] > sizes["ep"]:
        want.add("edp")  # the experts' gradients, averaged over the ranks holding the same experts
    assert want <= talked, (want, talked)


@pytest.mark.timeout(300)
def test_llama3_four_d_layout_on_sixteen_ranks_in_the_planners_order():
    run = mpkit.train("3d", 16, dp=2, pp=2, cp=2, tp=2, timeout=240, **GPT, **RUN)
    cmp = run.compare_to_reference(single())
    assert cmp.loss <= LOSS_ATOL and cmp.params <= PARAM_ATOL, cmp
    mesh = run.mesh
    assert str(mesh) == "dp=2 x pp=2 x cp=2 x tp=2"
    # Llama 3's Figure 5: GPU0 shares TP with GPU1, CP with GPU2, PP with GPU4, DP with GPU8
    assert [mesh.group_of(0, d) for d in ("tp", "cp", "pp", "dp")] == [[0, 1], [0, 2], [0, 4], [0, 8]]
    groups = {e.group for e in run.trace.filter(step=1).events if e.category == "comm"}
    assert groups == {"tp", "cp", "pp", "dp_cp"}, groups
    assert [e["coords"] for e in run.extra] == [mesh.coords(r) for r in range(16)]


@pytest.mark.parametrize("options", [dict(dp=4, fsdp=True), dict(dp=4, ep=2, experts=4), dict(dp=2, cp=2)], ids=str)
def test_the_cost_model_refuses_what_it_does_not_price(options):
    from mpkit.sim import predict

    with pytest.raises(ValueError, match="the cost model prices 3d without cp and sp, ep or fsdp"):
        predict("3d", hardware="8xH100-nvlink", world_size=4, **GPT, **options)
