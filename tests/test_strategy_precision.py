"""precision= and recompute= through mpkit.train: each strategy against `single` with the same
precision, on 2 and 4 ranks; an fp16 overflow skipped on every rank alike; recomputation equal to
none while it keeps fewer activations."""
import pytest
import torch
from torch import nn

import mpkit
from mpkit.models import ModelConfig, build_model

GPT = dict(model="gpt", steps=3, optimizer="sgd", lr=0.1)
# SGD, not Adam: Adam divides each update by the gradient's own size, so a gradient that is 0 in
# exact arithmetic (a key bias: softmax ignores a constant added to every key) is rounding noise of
# either sign, which Adam turns into a full lr step. With Adam, two correct bf16 runs differ by
# ~2·lr per step in such a parameter; with SGD the difference is lr times the gradient's.
#
# bf16 keeps 8 significant bits (unit roundoff 2**-9 ~ 2e-3), fp16 11 (2**-12 ~ 2.4e-4). Cutting the
# batch across ranks or micro-batches changes which partial sums are rounded, so gradients differ
# by about that share of their size (O(0.1) here), times lr 0.1, over 3 steps: ~1e-4. Measured:
# <= 1.2e-4 (losses) and 3e-5 (params) for bf16. 1e-3 leaves a margin for other summation orders;
# a strategy that skipped a step single took, or scaled a gradient twice, is off by >= 1e-2.
TOL = {"bf16": 1e-3, "fp16": 1e-3}
CASES = [("dp", 2, {}), ("dp", 4, {}), ("zero1", 2, {}), ("zero1", 4, {}),
         ("pp", 2, {"schedule": "gpipe"}), ("pp", 4, {"schedule": "1f1b"})]

_runs = {}


def trained(strategy, world, **kw):
    """``mpkit.train`` with GPT, once per configuration for the session: this file's tests and
    test_precision_strategies.py read the same fp32 twins and references (read only, never under a
    monkeypatch), so each is launched once, not once per test that compares with it."""
    key = (strategy, world, tuple(sorted(kw.items())))
    if key not in _runs:
        _runs[key] = mpkit.train(strategy, world, **GPT, **kw)
    return _runs[key]


def reference(precision, **kw):
    return trained("single", 1, precision=precision, **kw)


def _close(run, ref, tol):
    diff = run.compare_to_reference(ref)
    assert diff.loss <= tol and diff.params <= tol, diff


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy, world, options", CASES, ids=[f"{s}-{n}" for s, n, _ in CASES])
def test_bf16_matches_single_bf16(strategy, world, options):
    run = mpkit.train(strategy, world, precision="bf16", **GPT, **options)
    _close(run, reference("bf16"), TOL["bf16"])
    assert all(e["precision"] == "bf16" for e in run.extra)
    # autocast applied on this strategy's ranks: the matmuls' saved inputs are 2-byte, so fewer
    # activation bytes than the same strategy in fp32
    fp32 = trained(strategy, world, **options)
    assert max(m["activations"] for m in run.memory_by_category()) < max(
        m["activations"] for m in fp32.memory_by_category())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy, world, options", [CASES[1], CASES[3], CASES[4], CASES[5]],
                         ids=["dp-4", "zero1-4", "pp-2", "pp-4"])
def test_fp16_matches_single_fp16(strategy, world, options):
    """fp16 with the default first scale 2**16: no overflow here, the same steps as single."""
    run = mpkit.train(strategy, world, precision="fp16", **GPT, **options)
    ref = reference("fp16")
    assert ref.extra[0]["skipped_steps"] == [] and all(e["skipped_steps"] == [] for e in run.extra)
    _close(run, ref, TOL["fp16"])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy, world, options", [CASES[0], CASES[2]], ids=["dp-2", "zero1-2"])
def test_fp16_overflow_is_skipped_as_in_single(strategy, world, options):
    """A first loss scale of 2**22 overflows fp16 gradients: steps 0 and 1 are skipped (scale
    halved twice), then training goes on, on every rank as in single."""
    run = mpkit.train(strategy, world, precision="fp16", loss_scale=2.0**22, **GPT, **options)
    ref = reference("fp16", loss_scale=2.0**22)
    assert ref.extra[0]["skipped_steps"] == [0, 1]
    assert ref.extra[0]["loss_scale"] == [2.0**22, 2.0**21, 2.0**20]
    for extra in run.extra:
        assert extra["skipped_steps"] == [0, 1] and extra["loss_scale"] == ref.extra[0]["loss_scale"]
    _close(run, ref, TOL["fp16"])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy, options", [("zero1", {}), ("pp", {"schedule": "1f1b"})])
def test_fp16_overflow_every_rank_skips_alike(strategy, options):
    """Where fp16 overflows depends on how the batch is cut: 4 data-parallel ranks each take the
    mean of 8 samples (activation gradients 4x single's), 4 micro-batches sum each weight gradient
    over 8 samples in fp16 (4x smaller than single's sum over 32). So the skipped steps may differ
    from single's; what must hold is that every rank skips the same ones: zero1's ranks and pp's
    stages each see only part of the gradients, and ask each other."""
    run = mpkit.train(strategy, 4, precision="fp16", loss_scale=2.0**22, **{**GPT, "steps": 4}, **options)
    first = run.extra[0]
    assert all(e["skipped_steps"] == first["skipped_steps"] and e["loss_scale"] == first["loss_scale"]
               for e in run.extra)
    assert first["skipped_steps"][0] == 0 and len(first["skipped_steps"]) < 4  # 2**22 overflows, 2**19 does not


@pytest.mark.timeout(120)
def test_a_skipped_step_leaves_the_parameters():
    run = mpkit.train("zero1", 2, precision="fp16", loss_scale=2.0**30, **{**GPT, "steps": 1})
    start = build_model(ModelConfig(kind="gpt"), seed=0)
    assert run.extra[0]["skipped_steps"] == [0]
    assert all(torch.equal(run.params[k], p) for k, p in start.named_parameters())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy, world, options", [("single", 1, {}), CASES[0], CASES[5]],
                         ids=["single", "dp-2", "pp-4"])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_equals_none_with_fewer_activations(strategy, world, options, mode):
    """Recomputation runs the same ops again: fp32 results equal to 1e-5 (float reordering only).
    Full keeps only each layer's input: fewer activation bytes. Selective recomputes the
    attention core only, which torch's fused attention already stores as little more than its
    output (no s x s matrix): it may save almost nothing here, never more than full."""
    plain = trained(strategy, world, **options)
    run = mpkit.train(strategy, world, recompute=mode, **GPT, **options)
    assert max(abs(a - b) for a, b in zip(run.losses, plain.losses)) <= 1e-5
    assert all((run.params[k] - plain.params[k]).abs().max() <= 1e-5 for k in plain.params)
    acts = [max(m["activations"] for m in r.memory_by_category()) for r in (plain, run)]
    if mode == "full":
        assert acts[1] < 0.6 * acts[0], acts
    else:
        assert acts[1] <= acts[0], acts


def _seq():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _data(step, batch):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch, 8, generator=g)
    return x, (x[:, :4].argmax(1))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy, world", [("dp", 2), ("pp", 2)])
def test_user_sequential_bf16_with_full_recompute(strategy, world):
    kw = dict(model=_seq, data=_data, steps=3, optimizer="sgd", lr=0.1, precision="bf16")
    ref = mpkit.train("single", 1, **kw)
    run = mpkit.train(strategy, world, recompute="full", **kw)
    _close(run, ref, TOL["bf16"])  # recompute changes nothing; the rest is bf16's summation order as above
