"""Sequence and context parallelism composed with the others on the 3d strategy's mesh: TP+SP
(with dp and with pp), dp x cp x tp on 8 ranks (ring and Ulysses), and cp x pp x tp with SP,
each equal to ``single``; bad combinations refused before any rank starts.

Tolerance: as in tests/test_strategy_tp.py — float32 rounding of split matmuls, of the shard
means averaged over dp x cp and of the ring's softmax merge (measured: losses <= 5e-7,
parameters <= 1e-8 with SGD; Adam is left out for the gpt's parameters, see that file).
"""
import pytest

import mpkit

LOSS_ATOL, PARAM_ATOL = 1e-5, 1e-6

CASES = [(4, dict(dp=2, tp=2, sp=True)), (4, dict(pp=2, tp=2, sp=True)), (8, dict(dp=2, cp=2, tp=2)),
         (8, dict(dp=2, cp=2, tp=2, attention="ulysses")), (8, dict(cp=2, pp=2, tp=2, sp=True))]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size,options", CASES, ids=lambda v: str(v))
def test_composed_equals_single(world_size, options):
    run = mpkit.train("3d", world_size=world_size, model="gpt", optimizer="sgd", steps=3, **options)
    cmp = run.compare_to_reference()
    assert cmp.loss <= LOSS_ATOL and cmp.params <= PARAM_ATOL, cmp
    groups = {e.group for e in run.trace.events}
    if options.get("cp", 1) > 1:
        assert "cp" in groups  # ring hops / all-to-alls run in the cp groups
    kinds = {e.kind for e in run.trace.events if e.group == "tp"}
    if options.get("sp"):
        assert {"all_gather", "reduce_scatter"} <= kinds


@pytest.mark.parametrize("options,message", [
    (dict(tp=2, sp="yes"), "sp='yes' must be True"),
    (dict(dp=2, sp=True), "tp=1 has none"),
    (dict(cp=2, tp=2, model="mlp"), "model='gpt'"),
    (dict(cp=4, seq_len=12), "multiple of 8"),
    (dict(cp=2, tp=2, attention="ulysses", heads=2, hidden=32), "heads/tp"),
    (dict(cp=2, dp=1), "dp\\*pp\\*cp\\*tp = 1\\*1\\*2\\*1 = 2 ranks, but world_size=4"),
])
def test_bad_combinations_fail_before_any_rank_starts(options, message):
    options = {"model": "gpt", **options}
    with pytest.raises(ValueError, match=message):
        mpkit.train("3d", world_size=4, **options)
