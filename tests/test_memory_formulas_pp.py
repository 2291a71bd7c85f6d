"""Per-rank memory of pipeline parallel on the gpt model, against formulas computed here.

- parameters: exactly the fp32 bytes of the rank's layers, 4Ψ_r (counted on a fresh model).
- Adam state at the end of a step: exp_avg + exp_avg_sq = 8Ψ_r, plus one fp32 ``step`` counter
  per parameter tensor (torch keeps it as a 0-dim float32 tensor when not capturable): 4·T_r.
- activations: a stage keeps what its forward saved for backward until that micro-batch's
  backward. Each micro-batch costs the same A_r, so the peak is (micro-batches in flight)·A_r
  plus a small constant (this step's input batch, one received buffer): GPipe holds all m, 1F1B
  at most p - r (its warm-up depth). Predicted 1F1B/GPipe = min(m, p-r)/m.
"""
import pytest

import mpkit
from mpkit.models import ModelConfig, build_model

P, M = 4, 8
SPLIT = [[0, 1], [2], [3], [4, 5]]  # [embedding, block0 | block1 | block2 | block3, head]


@pytest.fixture(scope="module")
def runs():
    return {name: mpkit.train("pp", P, model="gpt", steps=3, batch_size=32, schedule=name, micro_batches=M)
            for name in ("gpipe", "1f1b")}


@pytest.mark.timeout(120)
def test_parameters_and_adam_state_are_exactly_the_stage_s_layers(runs):
    layers = build_model(ModelConfig(kind="gpt")).layers
    for r in runs.values():
        assert [sorted(l for ls in e["layers"].values() for l in ls) for e in r.extra] == SPLIT
        for rank, ids in enumerate(SPLIT):
            tensors = [p for i in ids for p in layers[i].parameters()]
            psi = sum(p.numel() for p in tensors)
            final = r.memory[rank].final_by_category
            assert final["parameters"] == 4 * psi
            assert final["optimizer"] == 2 * 4 * psi + 4 * len(tensors)
            assert r.memory[rank].max_by_category["parameters"] == 4 * psi  # the rest was never kept


@pytest.mark.timeout(120)
def test_1f1b_keeps_fewer_activations_than_gpipe_as_predicted(runs):
    gpipe = [m.max_by_category["activations"] for m in runs["gpipe"].memory]
    one_f = [m.max_by_category["activations"] for m in runs["1f1b"].memory]
    assert one_f[0] < gpipe[0]
    for rank in range(P):
        predicted = min(M, P - rank) / M
        assert one_f[rank] / gpipe[rank] == pytest.approx(predicted, rel=0.10), rank
