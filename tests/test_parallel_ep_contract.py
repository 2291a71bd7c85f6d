"""Expert parallelism on a learner's own MoE layer (issue 45): any layer with a ``router`` and an
``experts`` ModuleList, written differently from ``mpkit.models.MixtureOfExperts`` (its own router
class with a bias and a temperature, SwiGLU-style experts, a loop over experts with index_add,
Mixtral's renormalised top-k), inside a larger model, trained for a few SGD steps on 2 and 4
ranks: dropless it equals the same model trained on one device on the whole batch (losses,
every parameter). This checks the 1/N too: each rank's loss is the mean over its tokens, so
without ``synchronize_expert_gradients``' division the experts' gradients would be N times too large (SGD,
not Adam: Adam's update hardly changes when a gradient is scaled).
With a capacity the learner's layer has no single-device twin (it drops nothing); there the
reference is ``models.capacity_mixture`` on one device with the layer's own router and experts,
the rule ``MixtureOfExperts`` uses, and the dropped tokens are counted.

Tolerance: the same per-token matmuls; the expert gradients sum the ranks' rows in another order,
so float32 rounding only (measured <= 1e-7 after 3 steps); a token sent to the wrong expert, or a
factor N on the experts' gradients, moves the weights by O(1e-3) or more.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpkit
from mpkit.models import capacity_mixture, capacity_slots
from mpkit.parallel import expert_load, expert_parallel, full_expert_parameters, synchronize_expert_gradients
from mpkit.parallel.expert_parallel import ExpertParallelMoE

ATOL = 1e-5
H, E, STEPS, BATCH, SEQ = 8, 4, 3, 8, 6


class TemperatureRouter(nn.Module):
    def __init__(self, hidden, experts):
        super().__init__()
        self.gate = nn.Linear(hidden, experts)
        self.temperature = 0.7

    def forward(self, x):
        return self.gate(x) / self.temperature


class SwiGLU(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.w1, self.w3, self.w2 = nn.Linear(hidden, 2 * hidden), nn.Linear(hidden, 2 * hidden), nn.Linear(2 * hidden, hidden)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LearnerMoE(nn.Module):
    """What a learner writes: route, then a loop over the experts with index_add."""

    def __init__(self, hidden=H, experts=E, top_k=2, norm_topk_prob=True):
        super().__init__()
        self.router = TemperatureRouter(hidden, experts)
        self.experts = nn.ModuleList(SwiGLU(hidden) for _ in range(experts))
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = torch.softmax(self.router(flat), -1).topk(self.top_k, -1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, choice = (chosen == e).nonzero(as_tuple=True)
            if len(token):
                out = out.index_add(0, token, weights[token, choice, None] * expert(flat[token]))
        return out.view_as(x)


class Net(nn.Module):
    def __init__(self, **moe):
        super().__init__()
        self.inp, self.moe, self.out = nn.Linear(H, H), LearnerMoE(**moe), nn.Linear(H, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        return self.out(h + self.moe(h))


def make_net(**moe):
    torch.manual_seed(0)
    return Net(**moe)


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, SEQ, H, generator=g), torch.randint(0, 3, (BATCH, SEQ), generator=g)


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, 3), y.reshape(-1))  # the mean over this rank's tokens


def train(model, opt, step_fn):
    losses = []
    for step in range(STEPS):
        losses.append(step_fn(model, opt, *batch(step)))
    return losses


def single(**moe):
    model = make_net(**moe)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, opt, x, y):
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()
    return train(model, opt, step), {n: p.detach() for n, p in model.named_parameters()}


def _expert_parallel_rank(ctx, moe):
    model = expert_parallel(make_net(**moe), dropless=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n, r = ctx.world_size, ctx.rank

    def step(model, opt, x, y):
        loss = loss_of(model, x.tensor_split(n)[r], y.tensor_split(n)[r])
        loss.backward()
        synchronize_expert_gradients(model)  # experts / N, the rest averaged
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        return mean.item() / n
    losses = train(model, opt, step)
    return losses, full_expert_parameters(model), isinstance(model.moe, ExpertParallelMoE), len(model.moe.experts)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("moe", [dict(), dict(top_k=1, norm_topk_prob=False)], ids=["mixtral-top2", "switch-top1"])
def test_learners_moe_dropless_trains_as_on_one_device(world_size, moe):
    want_losses, want = single(**moe)
    for losses, params, wrapped, kept in mpkit.launch(_expert_parallel_rank, world_size, args=(moe,), timeout=100):
        assert wrapped and kept == E // world_size
        assert max(abs(a - b) for a, b in zip(losses, want_losses)) <= ATOL
        assert params.keys() == want.keys()  # the same names: the router and experts were adopted
        for name, p in want.items():
            assert (params[name] - p).abs().max() <= ATOL, name


def _capacity_rank(ctx):
    layer = expert_parallel(make_net().moe, capacity_factor=1.0)
    x, _ = batch(0)
    mine = x.tensor_split(ctx.world_size)[ctx.rank]
    with torch.no_grad():
        return layer(mine), expert_load(layer)[0]


@pytest.mark.timeout(60)
def test_learners_moe_with_a_capacity_drops_as_the_capacity_rule_says():
    layer, (x, _) = make_net().moe, batch(0)
    cap = capacity_slots(SEQ, 2, E, 1.0)
    with torch.no_grad():
        want, stats = capacity_mixture(x, layer.router(x), lambda b: torch.stack([f(b[e]) for e, f in
                                                                               enumerate(layer.experts)]), 2, cap,
                                       normalize=True)
    outs = mpkit.launch(_capacity_rank, 2, timeout=50)
    assert (torch.cat([o[0] for o in outs]) - want).abs().max() <= ATOL
    assert sum(o[1]["dropped"] for o in outs) == stats["dropped"] > 0
    assert torch.equal(sum(o[1]["load"] for o in outs), stats["load"])


def _refused(ctx):
    from parallel_models import raised

    class WithShared(LearnerMoE):
        def __init__(self):
            super().__init__()
            self.shared = nn.Linear(H, H)  # a shared expert inside the layer: the EP forward would leave it out

    torch.manual_seed(0)
    return {"shared": raised(lambda: expert_parallel(WithShared())),
            "none": raised(lambda: expert_parallel(nn.Linear(2, 2))),
            "both": raised(lambda: expert_parallel(LearnerMoE(), dropless=True, capacity_factor=1.0))}


@pytest.mark.timeout(60)
def test_layers_outside_the_contract_are_refused():
    for replies in mpkit.launch(_refused, 2, timeout=50):
        assert "holds shared besides its router and experts" in replies["shared"]
        assert "has no mixture-of-experts layer" in replies["none"]
        assert "pass one of them" in replies["both"]
