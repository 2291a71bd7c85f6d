"""``mpkit.parallel.parallelize`` on a learner's own model with a plan (issue 42): an ``nn.Sequential``
with a frozen layer, a tensor-parallel pair whose column layer sits in another pipeline stage than
its row layer (the column slice crosses the stage boundary), AdamW with two parameter groups (weight
decay on matrices only) and torch's default ``zero_grad()``, on 8 ranks as dp x pp x tp with
replicas, ZeRO-1 and FSDP, in both rank orders; and dp x tp with FSDP without a pipeline. Each is
compared with the same model, data and optimizer on one device, written as a learner would.

All layouts share one launched world (each builds its own mesh). Tolerance: data and tensor
parallelism add the same numbers in another order (the shard means averaged over dp, the row
layer's partial sums over tp), so values differ in the last float32 bits; after 3 AdamW steps at lr
1e-2 that stays below 1e-5, as in tests/parallel_models.py (measured: ~1e-7).
"""
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpkit
from mpkit.parallel import Layout, Plan, build_mesh, parallelize
from parallel_models import plain_loop

ATOL = 1e-5
STEPS, BATCH, LR = 3, 8, 1e-2
TP_PLAN = {"0": "column", "2": "row"}
PLAN = dict(loss=F.cross_entropy, tp=TP_PLAN, split_points=(2,), micro_batches=2)  # stages: 0-1 | 2-5
CASES = {  # name: (layout, plan options)
    "dp x pp x tp, replicas": (Layout(dp=2, pp=2, tp=2), PLAN),
    "dp x pp x tp, ZeRO-1, PP outermost": (Layout(dp=2, pp=2, tp=2, order="megatron"), dict(PLAN, dp="zero1")),
    "dp x pp x tp, FSDP": (Layout(dp=2, pp=2, tp=2), dict(PLAN, dp="fsdp")),
    "dp x tp, FSDP, no pipeline": (Layout(dp=4, tp=2), dict(loss=F.cross_entropy, tp=TP_PLAN, dp="fsdp")),
}


def learner_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8), nn.Linear(8, 8).requires_grad_(False),
                         nn.ReLU(), nn.Linear(8, 4))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 8, generator=g), torch.randint(0, 4, (BATCH,), generator=g)


def decay_groups(named):
    """Weight decay on matrices only, the frozen layer left out: what training scripts do."""
    trained = [p for p in named.values() if p.requires_grad]
    return [{"params": [p for p in trained if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in trained if p.ndim < 2], "weight_decay": 0.0}]


def train_each(ctx, cases):
    out = []
    for layout, options in cases:
        par = parallelize(learner_net(), build_mesh(layout), Plan(**options))
        par.build_optimizer(torch.optim.AdamW, param_groups=decay_groups, lr=LR)
        losses = [par.step(*batch(k)) for k in range(STEPS)]
        if par.holds_last_stage:
            losses = par.mean_losses(losses)
        params = par.full_parameters()  # every rank takes part
        out.append((losses if par.holds_last_stage and par.reports else None, params if par.reports else {}))
    return out


@functools.cache
def single():
    model = learner_net()
    opt = torch.optim.AdamW(decay_groups(dict(model.named_parameters())), lr=LR)
    losses = plain_loop(model, opt, batch, STEPS)
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


@functools.cache
def runs():
    return mpkit.launch(train_each, world_size=8, args=(list(CASES.values()),), timeout=200)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(CASES))
def test_a_learners_model_with_a_plan_equals_one_device(name):
    i = list(CASES).index(name)
    per_rank = [r[i] for r in runs()]
    losses = next(l for l, _ in per_rank if l is not None)
    params = {}
    for _, p in per_rank:
        for k, t in p.items():
            params.setdefault(k, t)
    want_losses, want_params = single()
    assert max(abs(a - b) for a, b in zip(losses, want_losses)) <= ATOL, (losses, want_losses)
    assert set(params) == set(want_params)
    for k, t in want_params.items():
        assert torch.allclose(params[k], t, rtol=0, atol=ATOL), k
    assert torch.equal(params["3.weight"], want_params["3.weight"])  # frozen: never stepped


def tied_across_stages(ctx):
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, nn.Linear(4, 4), nn.Tanh(), head)
    try:
        parallelize(model, build_mesh(Layout(pp=2)), Plan(loss=F.cross_entropy, split_points=(2,)))
    except ValueError as exc:
        return str(exc)
    return "no error"


def unplanned(ctx, options):
    try:
        parallelize(learner_net(), build_mesh(Layout(tp=2)), Plan(loss=F.cross_entropy, **options))
    except (ValueError, TypeError) as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
def test_misuse_is_a_clear_error_on_every_rank():
    for reply in mpkit.launch(tied_across_stages, world_size=2, timeout=60):
        assert "(tied weights), and the two stages are on different ranks" in reply, reply
    for options, message in [({}, "tp=2 splits the layers the plan names, and plan.tp names none"),
                             (dict(tp={"0": "column"}), "plan splits 0 by columns but no layer by rows"),
                             (dict(tp=TP_PLAN, dp="zero3"), "dp='zero3' is unknown"),
                             (dict(tp=TP_PLAN, sp=True), "sp=True makes each block a sequence-parallel region")]:
        for reply in mpkit.launch(unplanned, world_size=2, args=(options,), timeout=60):
            assert message in reply, (options, reply)
