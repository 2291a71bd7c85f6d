"""Per-rank parameters, gradients and Adam state of ``mp`` and ``pp``, measured by ctx.memory,
against formulas computed here from the layers each rank holds (never from a measurement).

With Ψ_r the parameters of rank r's layers and T_r their tensor count, in fp32:
parameters 4Ψ_r; Adam 8Ψ_r + 4·T_r (one float32 ``step`` per tensor); gradients 4Ψ_r at most
with one micro-batch (``mp``: the first gradient is adopted as ``.grad``, nothing is added), and
4Ψ_r + 4·(largest tensor of the rank) with several (``pp``: a micro-batch's fresh gradient sits
next to the accumulated ``.grad`` until autograd adds it in place, one tensor at a time).

The gradients here arrive through ``backward(grad_tensors)`` on every rank but the last; a
tracker that misses their hooks files them as "other" and reads 0 B (a regression that once
went unnoticed: issue 36). Every rank is checked, so that cannot happen again silently.
"""
import math

import pytest

import mpkit
from mpkit.models import build_model


def expected(run, rank, micro_batches):
    layers = build_model(run.config.model, run.config.seed).layers
    held = run.extra[rank]["layers"]  # pp: {stage: layer ids}; mp: the layer ids
    ids = [i for s in held.values() for i in s] if isinstance(held, dict) else held
    tensors = [p for i in ids for p in layers[i].parameters()]
    psi = sum(p.numel() for p in tensors)
    grads = 4 * psi + (4 * max(p.numel() for p in tensors) if micro_batches > 1 else 0)
    return {"parameters": 4 * psi, "gradients": grads, "optimizer": 8 * psi + 4 * len(tensors)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy, options", [("mp", {}), ("pp", dict(schedule="gpipe", micro_batches=4)),
                                               ("pp", dict(schedule="1f1b", micro_batches=4))])
@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_holds_its_layers_states(strategy, options, world):
    run = mpkit.train(strategy, world, steps=2, **options)
    m = options.get("micro_batches", 1)
    for rank, report in enumerate(run.memory):
        want = expected(run, rank, m)
        got = {"parameters": report.max_by_category["parameters"],
               "gradients": report.max_by_category["gradients"],
               "optimizer": report.final_by_category["optimizer"]}  # max holds the step's temporaries
        assert got == want, f"{strategy} on {world} ranks, rank {rank}"


def test_the_formula_helper_counts_a_known_stage():
    """The default mlp's first layer (Linear 32->64): Ψ = 32·64 + 64, largest tensor 32·64."""
    class Fake:
        config = type("C", (), {"model": mpkit.models.ModelConfig(), "seed": 0})
        extra = [{"layers": {0: [0]}}]
    psi = 32 * 64 + 64
    assert expected(Fake, 0, 4) == {"parameters": 4 * psi, "gradients": 4 * psi + 4 * math.prod((64, 32)),
                                    "optimizer": 8 * psi + 4 * 2}
