"""Per-rank parameter / gradient / optimizer bytes of the data-parallel family on the gpt, measured
by ctx.memory, against the fp32 formulas (params 4Ψ, grads 4Ψ, Adam 8Ψ) computed here from the
model's sizes — never from a measurement.

Which reading: parameters and gradients are steady between steps, so ``final_by_category`` (when
tracking ended) is the state a device holds. The optimizer also uses ``final``: its ``max``
includes the temporaries of ``optimizer.step`` (foreach intermediates, allocated inside the step,
labelled Optstate). Where gradients are freed after the step (ddp, set_to_none) ``final`` is 0
and ``max`` is what backward held. Step counters: torch's Adam keeps one float32 scalar ``step``
tensor per parameter tensor it steps, 4 bytes each.
"""
import math

import pytest

from mpkit.models import parameter_count
from test_strategy_dp import run_of

GPT = dict(vocab=64, seq_len=16, hidden=64, layers=4)


def gpt_shapes(vocab, seq_len, hidden, layers):
    """(dim 0, elements per dim-0 row) of every gpt parameter, in model order."""
    h = hidden
    block = [(h, 1), (h, 1), (3 * h, h), (3 * h, 1), (h, h), (h, 1), (h, 1), (h, 1),
             (4 * h, h), (4 * h, 1), (h, 4 * h), (h, 1)]
    return [(vocab, h), (seq_len, h), *block * layers, (h, 1), (h, 1), (vocab, h), (vocab, 1)]


def psi(**sizes):
    return sum(rows * cols for rows, cols in gpt_shapes(**sizes))


def tensors(**sizes):
    return len(gpt_shapes(**sizes))


def test_formula_helpers_agree_with_the_closed_form():
    h, v, s, L = 64, 64, 16, 4  # Ψ = V·h + S·h + L·(12h² + 13h) + 2h + h·V + V
    assert psi(**GPT) == v * h + s * h + L * (12 * h * h + 13 * h) + 2 * h + h * v + v == 209_344
    assert tensors(**GPT) == 12 * L + 6


def memory(run, rank=0):
    return run.memory[rank].final_by_category, run.memory[rank].max_by_category


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["dp", "ddp"])
def test_full_replicas(strategy):
    """dp/ddp: every rank holds everything: params 4Ψ, grads 4Ψ, Adam 8Ψ + 4 bytes per tensor."""
    run = run_of(strategy, "gpt", "adam", 4)
    n, t = psi(**GPT), tensors(**GPT)
    for rank in range(4):
        final, peak = memory(run, rank)
        assert final["parameters"] == 4 * n
        assert final["optimizer"] == 8 * n + 4 * t
        if strategy == "dp":
            # the grads are views of dp's buckets and stay between steps. (``max`` is higher: the
            # tracker also labels each incoming gradient as one until autograd adds it in place.)
            assert final["gradients"] == 4 * n
        else:
            assert final["gradients"] == 0 and peak["gradients"] == 4 * n


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
def test_zero1_shards_only_the_optimizer(world_size):
    """zero1: Adam state for ceil(Ψ/N) elements (8Ψ/N: N divides Ψ here) and one step counter
    (one flat tensor per rank); params and grads stay full, plus this rank's reduced gradient
    slice (4Ψ/N) that the reduce-scatter writes and Adam reads."""
    run = run_of("zero1", "gpt", "adam", world_size)
    n = psi(**GPT)
    assert n % world_size == 0
    for rank in range(world_size):
        final, _ = memory(run, rank)
        assert final["parameters"] == 4 * n
        assert final["gradients"] == 4 * n + 4 * n // world_size
        assert final["optimizer"] == 8 * n // world_size + 4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_communication_buffers_are_not_activations(model):
    """gloo's reduce-scatter copies its 4Ψ-byte input after backward, when anything new would be
    labelled an activation; made inside ctx.comm it is "other", so zero1's activations are dp's
    (same model, same local batch: the mlp's copy was larger than its activations) and zero1's
    "other" holds the copy."""
    zero1, dp = run_of("zero1", model, "adam", 2), run_of("dp", model, "adam", 2)
    param_bytes = 4 * parameter_count(zero1.config.model)
    for rank in range(2):
        _, z = memory(zero1, rank)
        _, d = memory(dp, rank)
        assert z["activations"] == d["activations"] and z["other"] >= param_bytes
        if model == "mlp":  # the copy outweighs the mlp's activations: mislabelled, it would show
            assert d["activations"] < param_bytes


def fsdp_expected(world_size, rank, **sizes):
    """FSDP2 shards dim 0 in chunks of c = ceil(d0/N) rows: every rank's parameter storage is c
    rows (padded), rank r's real rows are min(c, d0 - r·c) (>= 0), which Adam's state mirrors."""
    params = optimizer = 0
    for rows, cols in gpt_shapes(**sizes):
        c = math.ceil(rows / world_size)
        params += 4 * c * cols
        optimizer += 8 * max(0, min(c, rows - rank * c)) * cols
    return params, optimizer + 4 * len(gpt_shapes(**sizes))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp_shards_everything(world_size):
    run = run_of("fsdp", "gpt", "adam", world_size)
    n, t = psi(**GPT), tensors(**GPT)
    for rank in range(world_size):
        final, _ = memory(run, rank)
        assert fsdp_expected(world_size, rank, **GPT) == (4 * n // world_size, 8 * n // world_size + 4 * t)
        assert final["parameters"] == 4 * n // world_size
        assert final["optimizer"] == 8 * n // world_size + 4 * t


@pytest.mark.timeout(120)
def test_fsdp_pads_uneven_dim0():
    """vocab 65, seq_len 15 over 4 ranks: embeddings and the output layer do not split evenly."""
    sizes = {**GPT, "vocab": 65, "seq_len": 15}
    run = run_of("fsdp", "gpt", "adam", 4, vocab=65, seq_len=15)
    n = psi(**sizes)
    per_rank = [memory(run, rank)[0] for rank in range(4)]
    for rank, final in enumerate(per_rank):
        params, optimizer = fsdp_expected(4, rank, **sizes)
        assert final["parameters"] == params
        assert final["optimizer"] == optimizer
    assert per_rank[0]["parameters"] * 4 > 4 * n  # the padding is real memory
    assert sum(f["optimizer"] for f in per_rank) == 8 * n + 4 * 4 * tensors(**sizes)  # no padding in Adam
