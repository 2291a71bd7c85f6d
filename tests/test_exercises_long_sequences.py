"""Lab 11's four exercises and lab 02's balanced_stages: their references against PyTorch's and mpkit's
own mechanisms, the figures their checkers rely on, their assignment cells, and their stubs untouched.

The checks themselves run elsewhere: every reference passes every case in test_exercises.py, and the
correct and wrong attempts of tests/exercise_attempts/ in test_exercise_attempts.py. Here:

* in one launched world of 4 ranks: the sequence-parallel pair equals torch's autograd all-gather and
  reduce-scatter (``_functional_collectives``) forward and backward; the ring equals
  ``mpkit.parallel.ring_attention`` and Ulysses ``mpkit.parallel.ulysses_attention`` (contiguous
  split) forward; the MoE layer equals ``mpkit.parallel.expert_parallel`` on the same
  ``MixtureOfExperts``; the ring's bf16 output lies within half a bf16 unit of the exact value, half
  the checker's bound;
* without a world: the checker's attention is torch's SDPA, its zigzag mpkit's load-balanced
  positions; every case of the MoE exercise drops tokens and its top-2 case depends on the slot order;
  balanced_stages' reference reaches the smallest peak (brute force on small models, ``partition`` on
  larger) and its bytes are what ``mpkit.train("mp")`` holds per rank;
* the nbgrader source notebook of the five: each solution cell needs only the setup cell's imports
  and passes its check's first case;
* each untouched stub is "not done yet" and records nothing.
"""
import itertools
import random

import pytest
import torch
import torch.nn.functional as F

import mpkit
from mpkit import exercises
from mpkit.exercises import EXERCISES, solutions
from mpkit.exercises.assignment import SETUP, write_assignment
from mpkit.exercises.attention import attention, zigzag
from mpkit.exercises.stage_split import BYTES_PER_PARAMETER, layer_parameters, reference
from mpkit.parallel import sequence_positions
from mpkit.parallel.pipeline.split import partition

NAMES = ["balanced_stages", "sequence_parallel_mappings", "ring_attention_merge", "ulysses_head_swap", "expert_parallel_moe"]


def _against_mpkit_and_torch(ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from torch import nn

    from mpkit.models import MixtureOfExperts
    from mpkit.parallel import expert_parallel, ring_attention, ulysses_attention
    n, r = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(5)
    found = {}

    # the sequence-parallel pair against torch's autograd collectives, forward and backward
    x, w, grad = torch.randn(8, 2, 3, generator=g), torch.randn(3, 3, generator=g), torch.randn(2, 2, 3, generator=g)
    results = []
    for gather, scatter in ((solutions.GatherFromSequenceParallelRegion.apply, solutions.ReduceScatterToSequenceParallelRegion.apply),
                            (lambda t: fc.all_gather_tensor_autograd(t, 0, dist.group.WORLD),
                             lambda t: fc.reduce_scatter_tensor_autograd(t, "sum", 0, dist.group.WORLD))):
        leaf = x[2 * r:2 * r + 2].clone().requires_grad_()
        out = scatter(gather(leaf) @ (w * (r + 1)))   # a rank-dependent partial sum in between
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    found["sp"] = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*results))

    # ring attention (zigzag) and Ulysses (contiguous) against mpkit's own
    q, k, v = (torch.randn(1, 4, 16, 3, generator=g) for _ in range(3))
    mine = sequence_positions(16, n, r, balanced=True)
    ours, lse = solutions.ring_attention_merge(ctx, *(t[:, :, mine] for t in (q, k, v)))
    found["ring"] = torch.allclose(ours, ring_attention(*(t[:, :, mine] for t in (q, k, v))), atol=1e-5)
    found["ring_lse"] = torch.allclose(lse.double(), attention(q, k, v)[1][:, :, mine], atol=1e-5)
    rows = slice(4 * r, 4 * r + 4)
    theirs = ulysses_attention(*(t[:, :, rows] for t in (q, k, v)), balanced=False)
    found["ulysses"] = torch.allclose(solutions.ulysses_head_swap(ctx, *(t[:, :, rows] for t in (q, k, v))), theirs,
                                      atol=1e-5)

    # bf16 ring: one rounding from fp32 statistics, within half a unit in the last place (+ fp32 noise)
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    exact = attention(qb, kb, vb)[0][:, :, mine]
    got = solutions.ring_attention_merge(ctx, *(t[:, :, mine] for t in (qb, kb, vb)))[0].double()
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0 ** -100))) - 7)
    found["bf16_ulps"] = float(((got - exact).abs() / ulp).max())

    # the MoE layer against expert_parallel on the same MixtureOfExperts
    torch.manual_seed(3)
    moe = MixtureOfExperts(6, 8, top_k=2, capacity_factor=1.0)
    tokens = torch.randn(n, 5, 6, generator=g)
    ours = solutions.ExpertParallelMoE(ctx, moe.router, nn.ModuleList(list(moe.experts)[2 * r:2 * r + 2]), 8, 2,
                                       moe.capacity(5)).forward(tokens[r])
    theirs = expert_parallel(nn.Sequential(moe))(tokens[r:r + 1])[0]
    found["moe"] = torch.allclose(ours, theirs, atol=1e-6)
    return found


@pytest.mark.timeout(120)
def test_references_equal_pytorchs_and_mpkits_own_mechanisms():
    for rank, found in enumerate(mpkit.launch(_against_mpkit_and_torch, world_size=4, timeout=90)):
        assert found.pop("bf16_ulps") <= 0.5 + 1e-3, rank
        assert all(found.values()), (rank, found)


def test_checker_attention_is_sdpa_and_its_split_is_mpkits():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 12, 5, generator=g, dtype=torch.float64) for _ in range(3))
    out, lse = attention(q, k, v)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    scores = q @ k.transpose(-1, -2) / 5 ** 0.5
    assert torch.allclose(lse, scores.masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), -torch.inf).logsumexp(-1))
    for n in (2, 3, 4):
        for r in range(n):
            assert torch.equal(zigzag(12 * n, n, r), sequence_positions(12 * n, n, r, balanced=True))


def test_every_moe_case_drops_tokens_and_the_top2_case_depends_on_the_slot_order():
    from mpkit.exercises import experts
    for case in EXERCISES["expert_parallel_moe"].cases:
        spec, n = case.params, case.world_size
        moe = experts._moe(spec["seed"], spec)
        x, _ = experts._data(spec["seed"], n, spec["tokens"])
        moe(x)
        assert moe.stats["dropped"] > 0, case.name("en")
        if spec["top_k"] == 2:   # slots handed out token by token keep another set of choices on some rank
            weights, chosen = F.softmax(moe.router(x), -1).topk(2, -1)
            cap = moe.capacity(spec["tokens"])
            assert any(_kept(c, cap, token_major=True) != _kept(c, cap, token_major=False) for c in chosen)


def _kept(chosen, capacity, token_major):
    order = (itertools.product(range(len(chosen)), range(chosen.shape[1])) if token_major else
             ((i, j) for j in range(chosen.shape[1]) for i in range(len(chosen))))
    used, kept = {}, set()
    for i, j in order:
        e = int(chosen[i, j])
        if used.get(e, 0) < capacity:
            kept.add((i, j))
        used[e] = used.get(e, 0) + 1
    return kept


def test_balanced_stages_reference_reaches_the_smallest_peak():
    rng = random.Random(0)
    for _ in range(200):
        sizes = [rng.randint(1, 50) for _ in range(rng.randint(2, 9))]
        ranks = rng.randint(1, len(sizes))
        stages, nbytes = reference(sizes, ranks, "sgd")
        assert [i for s in stages for i in s] == list(range(len(sizes))) and all(stages)
        best = min(max(sum(sizes[a:b]) for a, b in zip((0, *cuts), (*cuts, len(sizes))))
                   for cuts in itertools.combinations(range(1, len(sizes)), ranks - 1))
        assert max(nbytes) == best * BYTES_PER_PARAMETER["sgd"]
        theirs = solutions.balanced_stages(sizes, ranks, "sgd")
        assert max(theirs[1]) == max(nbytes) and theirs[1] == [sum(sizes[i] for i in s) * 8 for s in theirs[0]]
    sizes = [rng.randint(1, 10**6) for _ in range(40)]
    assert max(solutions.balanced_stages(sizes, 7, "adam")[1]) == 16 * max(sum(sizes[i] for i in g)
                                                                         for g in partition(sizes, 7))


@pytest.mark.timeout(120)
def test_balanced_stages_bytes_are_what_the_mp_run_holds_per_rank():
    config = dict(model="gpt", layers=8, hidden=128)
    run = mpkit.train("mp", world_size=4, steps=1, batch_size=4, optimizer="adam", **config)
    stages, nbytes = reference(layer_parameters(kind="gpt", layers=8, hidden=128), 4, "adam")
    assert stages == [list(e["layers"]) for e in run.extra]
    for rank, (memory, extra) in enumerate(zip(run.memory, run.extra)):
        final = memory.final_by_category   # after the step: parameters and Adam's state; gradients at their peak
        held = final["parameters"] + memory.max_by_category["gradients"] + final["optimizer"]
        step_counters = 4 * sum(1 for p in _stage_parameters(config, extra["layers"]))  # one float32 per tensor
        assert held - step_counters == nbytes[rank], rank


def _stage_parameters(config, layers):
    model = mpkit.models.build_model(mpkit.models.ModelConfig(kind=config["model"], layers=config["layers"],
                                                              hidden=config["hidden"]), 0)
    return [p for i in layers for p in model.layers[i].parameters()]


def test_assignment_cells_need_only_the_setup_imports_and_pass(tmp_path):
    import nbformat
    path = write_assignment(NAMES, tmp_path / "a.ipynb", lang="en")
    cells = nbformat.read(path, as_version=4).cells
    for name in NAMES:
        source = next(c.source for c in cells if c.metadata["nbgrader"]["grade_id"] == f"{name}-solution")
        assert "### BEGIN SOLUTION" in source and "NotImplementedError" not in source, name
        namespace = {}
        exec(SETUP, namespace)
        exec(compile(source, f"{name}-solution", "exec"), namespace)
        target = eval(EXERCISES[name].target, namespace)
        first = EXERCISES[name].judge(EXERCISES[name].cases[0], target, 30)
        assert first.passed, (name, first.message("en"))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", NAMES)
def test_untouched_stub_is_not_done_and_records_nothing(name, tmp_path):
    namespace = {}
    exec(SETUP, namespace)
    exec(EXERCISES[name].stub, namespace)
    result = exercises.check(name, eval(EXERCISES[name].target, namespace), lang="en", results_dir=tmp_path)
    assert result.not_done and not result.passed and "not done yet" in result.message
    assert not list(tmp_path.glob("*.json"))
