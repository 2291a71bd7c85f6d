"""Expert parallelism (``mpkit.parallel.expert_parallel``): a mixture-of-experts layer with its
experts spread over 2 and 4 ranks equals the same layer on one device — outputs, input gradients,
every expert's and the router's gradients — with and without dropped tokens; it talks in two
all-to-alls each way; the per-expert load and the dropped count are the single-device layer's;
bad sizes are refused. torch has no MoE layer, so the reference is ``mpkit.models.MixtureOfExperts``
on one device, itself checked against a plain per-token loop.

Tolerance: each token's expert output is the same matmul on either side; only the weighted sum
of a token's k experts and the sums of gradients over tokens are added in another order, so
values differ in the last float32 bits (measured <= 1e-6); a token routed to a wrong expert or
dropped wrongly changes them at O(0.1).
"""
import pytest
import torch
import torch.distributed as dist

import mpkit
from mpkit.models import MixtureOfExperts
from mpkit.parallel import expert_load, expert_parallel, expert_parameters, full_expert_parameters
from mpkit.parallel.expert_parallel import check_expert_split

ATOL = 1e-5
HIDDEN, SEQ, BATCH = 8, 12, 8


def layer_and_data(experts=4, top_k=2, capacity_factor=1.0):
    torch.manual_seed(0)
    moe = MixtureOfExperts(HIDDEN, experts, top_k, capacity_factor)
    g = torch.Generator().manual_seed(1)
    return moe, torch.randn(BATCH, SEQ, HIDDEN, generator=g), torch.randn(BATCH, SEQ, HIDDEN, generator=g)


def one_device(**kw):
    moe, x, dy = layer_and_data(**kw)
    x.requires_grad_()
    y = moe(x)
    y.backward(dy)
    return moe, x, y


def spread(ctx, kw):
    moe, x, dy = layer_and_data(**kw)
    moe = expert_parallel(moe)
    n, r = ctx.world_size, ctx.rank
    x = x.tensor_split(n)[r].requires_grad_()  # each rank its own sequences, as in data parallelism
    ctx.set_step(0)
    y = moe(x)
    y.backward(dy.tensor_split(n)[r])
    ctx.set_step(None)
    experts, rest = expert_parameters(moe)
    for p in rest:  # the router saw only this rank's tokens: sum its gradient over the ranks
        dist.all_reduce(p.grad)
    for p in experts + rest:  # the gradients go through full_expert_parameters' gather under their names
        p.data = p.grad
    events = [e.name for e in ctx.trace.events if e.step == 0 and e.kind == "all_to_all"]
    return y.detach(), x.grad, full_expert_parameters(moe), expert_load(moe)[0], events


CASES = [dict(experts=4, top_k=2, capacity_factor=1.0), dict(experts=4, top_k=1, capacity_factor=4.0),
         dict(experts=8, top_k=2, capacity_factor=0.5)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("kw", CASES, ids=["top2-cap1", "top1-nodrop", "e8-top2-cap0.5"])
def test_equals_the_layer_on_one_device(kw, world_size):
    moe, x, y = one_device(**kw)
    grads = {n: p.grad for n, p in moe.named_parameters()}
    outs = mpkit.launch(spread, world_size, args=(kw,))
    got_y = torch.cat([o[0] for o in outs])
    got_dx = torch.cat([o[1] for o in outs])
    assert (got_y - y).abs().max() <= ATOL
    assert (got_dx - x.grad).abs().max() <= ATOL
    for out in outs:
        assert out[2].keys() == grads.keys()
        for name, g in grads.items():
            assert (out[2][name] - g).abs().max() <= ATOL, name
    # the load and the drops add up to the one-device layer's (each rank counts its own tokens)
    assert torch.equal(sum(o[3]["load"] for o in outs), moe.stats["load"])
    assert torch.equal(sum(o[3]["kept"] for o in outs), moe.stats["kept"])
    assert sum(o[3]["dropped"] for o in outs) == moe.stats["dropped"]
    assert moe.stats["dropped"] == 0 if kw["capacity_factor"] == 4.0 else moe.stats["dropped"] > 0


@pytest.mark.timeout(120)
def test_dispatch_and_combine_are_all_to_alls():
    for out in mpkit.launch(spread, 4, args=(CASES[0],)):
        assert sorted(out[4]) == sorted(["moe dispatch forward", "moe combine forward",
                                         "moe combine backward", "moe dispatch backward"])


def test_the_layer_is_a_per_token_mixture():
    # the reference itself, against a loop over tokens: each kept (token, expert) adds prob · expert(x)
    moe, x, _ = layer_and_data(experts=4, top_k=2, capacity_factor=1.0)
    y = moe(x)
    probs = torch.softmax(moe.router(x), -1)
    top_p, top_e = probs.topk(2, -1)
    cap, expected = moe.capacity(SEQ), torch.zeros_like(x)
    for g in range(BATCH):
        filled = [0] * 4
        for choice in range(2):  # first choices before second ones, earlier tokens first
            for t in range(SEQ):
                e = int(top_e[g, t, choice])
                if filled[e] < cap:
                    filled[e] += 1
                    expected[g, t] += top_p[g, t, choice] * moe.experts[e](x[g, t])
    assert (y - expected).abs().max() <= ATOL
    assert moe.stats["dropped"] == int(moe.stats["load"].sum() - moe.stats["kept"].sum()) > 0


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="multiple of 4"):
        check_expert_split(6, 4)
    with pytest.raises(ValueError, match="top_k=3 is larger than experts=2"):
        mpkit.models.ModelConfig(kind="gpt", experts=2, top_k=3)
    with pytest.raises(ValueError, match="model='gpt'"):
        mpkit.models.ModelConfig(kind="mlp", experts=2)


# ---- the "ep" strategy: mpkit.train("ep", ...) ----
# Losses: the ranks' shard means averaged against one mean (measured <= 3e-7); parameters with SGD
# (measured <= 1e-8); Adam on the gpt through the losses (see tests/test_strategy_tp.py).
LOSS_ATOL, PARAM_ATOL = 1e-5, 1e-6


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 4])
def test_train_ep_equals_single(world_size):
    run = mpkit.train("ep", world_size=world_size, model="gpt", optimizer="sgd", steps=3, experts=4, top_k=2,
                      capacity_factor=1.0)
    cmp = run.compare_to_reference()
    assert cmp.loss <= LOSS_ATOL and cmp.params <= PARAM_ATOL, cmp
    loads = [extra["expert_load"][0] for extra in run.extra]  # step 0, every rank, every block
    assert sum(block["dropped"] for rank in loads for block in rank) > 0  # capacity 1.0 drops some
    assert {e.kind for e in run.trace.events} >= {"all_to_all"}


@pytest.mark.timeout(180)
def test_train_ep_adam_losses_equal_single():
    run = mpkit.train("ep", world_size=2, model="gpt", steps=3, experts=2)
    assert run.compare_to_reference().loss <= LOSS_ATOL


def test_train_ep_bad_inputs_fail_before_any_rank_starts():
    with pytest.raises(ValueError, match="experts=6 cannot be spread evenly over ep=4"):
        mpkit.train("ep", world_size=4, model="gpt", experts=6)
    with pytest.raises(ValueError, match="top_k=3 is larger than experts=2"):
        mpkit.train("ep", world_size=2, model="gpt", experts=2, top_k=3)
    with pytest.raises(ValueError, match="pass experts="):
        mpkit.train("ep", world_size=2, model="gpt")


def in_subgroups(ctx):
    """Two expert-parallel groups of 2 in a world of 4, ranks {0, 2} and {1, 3}, each on half the batch."""
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = groups[ctx.rank % 2]
    moe, x, _ = layer_and_data(**CASES[0])
    moe = expert_parallel(moe, group)
    half = x.tensor_split(2)[ctx.rank % 2]
    return moe(half.tensor_split(2)[ctx.rank // 2]).detach()


@pytest.mark.timeout(120)
def test_any_process_group():
    moe, x, y = one_device(**CASES[0])
    outs = mpkit.launch(in_subgroups, 4)
    for g in range(2):  # group g holds half g of the batch, its ranks the two quarters
        got = torch.cat([outs[g], outs[g + 2]])
        assert (got - y.detach().tensor_split(2)[g]).abs().max() <= ATOL
