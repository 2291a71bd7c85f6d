"""``mpkit.parallel`` used wrongly inside ``mpkit.launch`` fails loudly, naming the fix (issue 36):
each case trained something other than what the user wrote, or died with a raw gloo abort.

And the one misuse that is not one: ``DataParallel(overlap=True, find_unused_parameters=True)``
with several buckets on ranks that use different branches (what that option is for) equals the
single-device run. Tolerance as in parallel_models.py: the same per-rank gradients summed in
another order, float32 rounding only (measured ~1e-7 after 5 AdamW steps); 1e-5.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpkit
from mpkit.parallel import DataParallel, ShardedOptimizer

ATOL = 1e-5
STEPS = 5


class TwoLayers(nn.Module):
    """Two layers of one shape; ``swapped`` registers them in the other order (same forward)."""

    def __init__(self, swapped=False):
        super().__init__()
        if swapped:
            self.b = nn.Linear(4, 4)
            self.a = nn.Linear(4, 4)
        else:
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _reordered(ctx):
    torch.manual_seed(0)
    DataParallel(TwoLayers(swapped=ctx.rank == 1))


@pytest.mark.timeout(60)
def test_layers_registered_in_another_order_are_refused():
    with pytest.raises(mpkit.LaunchError, match=r"parameter tensor 0 is 'b.weight' on group rank 1 but 'a.weight' "
                                                r"on group rank 0 .*registered their layers in another order"):
        mpkit.launch(_reordered, 2, timeout=30)


def _one_step(ctx, overlap, finish_calls):
    torch.manual_seed(0)
    model = TwoLayers()
    dp = DataParallel(model, overlap=overlap)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dp(torch.randn(2, 4)).sum().backward()
    for _ in range(finish_calls):
        dp.finish_gradient_synchronization()
    opt.step()
    return True


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overlap", [True, False])
def test_step_without_finishing_the_synchronisation_is_refused(overlap):
    with pytest.raises(mpkit.LaunchError, match=r"optimizer.step\(\) before "
                                                r"DataParallel.finish_gradient_synchronization\(\)"):
        mpkit.launch(_one_step, 2, args=(overlap, 0), timeout=30)


@pytest.mark.timeout(60)
def test_finishing_twice_says_so_and_does_not_blame_unused_parameters():
    with pytest.raises(mpkit.LaunchError, match=r"called twice after one backward") as info:
        mpkit.launch(_one_step, 2, args=(True, 2), timeout=30)
    assert "find_unused_parameters" not in str(info.value)
    assert mpkit.launch(_one_step, 2, args=(True, 1), timeout=30) == [True, True]  # once is right


class Branches(nn.Module):
    """A shared trunk and two heads; each call uses one head."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.left = nn.Linear(8, 4)
        self.right = nn.Linear(8, 4)

    def forward(self, x, right: bool):
        return (self.right if right else self.left)(torch.tanh(self.trunk(x)))


def _branch_batch(step, world):
    g = torch.Generator().manual_seed(step)
    return torch.randn(2 * world, 8, generator=g), torch.randint(0, 4, (2 * world,), generator=g)


def _branch_loss(model, x, y, rank):
    return F.cross_entropy(model(x, right=rank % 2 == 1), y)


def _branches_rank(ctx, overlap, bucket_mb):
    torch.manual_seed(ctx.rank)  # DataParallel broadcasts rank 0's weights
    model = Branches()
    dp = DataParallel(model, bucket_mb=bucket_mb, overlap=overlap, find_unused_parameters=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        x, y = (t.tensor_split(ctx.world_size)[ctx.rank] for t in _branch_batch(step, ctx.world_size))
        _branch_loss(dp, x, y, ctx.rank).backward()
        dp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, len(dp.buckets)


def _branches_single(world):
    """One device: the mean over the ranks' slices of each slice's loss through its rank's head."""
    torch.manual_seed(0)
    model = Branches()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        xs, ys = (t.tensor_split(world) for t in _branch_batch(step, world))
        loss = sum(_branch_loss(model, x, y, r) for r, (x, y) in enumerate(zip(xs, ys))) / world
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.state_dict()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("overlap, bucket_mb", [(True, 0), (True, 1e-4), (False, 0)])
def test_ranks_using_different_branches_equal_single(world, overlap, bucket_mb):
    out = mpkit.launch(_branches_rank, world, args=(overlap, bucket_mb), timeout=90)
    reference = _branches_single(world)
    for rank, (params, buckets) in enumerate(out):
        assert buckets > 1
        for name, want in reference.items():
            torch.testing.assert_close(params[name], want, atol=ATOL, rtol=0, msg=f"rank {rank} {name}")


def _sharded_unequal(ctx, same_shapes):
    torch.manual_seed(ctx.rank)
    model = nn.Linear(4, 4 if same_shapes or ctx.rank == 0 else 3)
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, average_gradients=True, lr=1e-2)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("same_shapes, message", [
    (False, r"ShardedOptimizer\(average_gradients=True\): the replicas differ: parameter 'group 0 param 0'"),
    (True, r"the replicas start from different values .*broadcast_parameters")])
def test_sharded_optimizer_on_differing_replicas_says_broadcast(same_shapes, message, capfd):
    with pytest.raises(mpkit.LaunchError, match=message):
        mpkit.launch(_sharded_unequal, 2, args=(same_shapes,), timeout=30)
    assert "gloo" not in capfd.readouterr().err  # no C++ abort on the caller's stderr


# ---- long sequences and experts used wrongly (issue 46): each case once aborted the process in
# gloo (SIGABRT: messages of different sizes) or trained something else silently; now every rank
# raises, naming the ranks and their values. One world runs every case in turn (each raises on
# every rank alike, so the world carries on to the next).

def _sp_block():
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))


def _long_sequence_misuse(ctx):
    from mpkit.models import MixtureOfExperts
    from mpkit.parallel import (expert_parallel, gather_from_sequence_parallel_region, ring_attention,
                                sequence_parallel, ulysses_attention)
    from mpkit.parallel.sequence_parallel import all_reduce_sequence_parallel_gradients
    r = ctx.rank
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 8, 8, generator=g)

    def sp_step(reduce):
        block = sequence_parallel(_sp_block(), {"1": "column", "3": "row"}, seq_dim=1)
        opt = torch.optim.SGD(block.parameters(), lr=0.1)
        block(torch.randn(2, 4, 8, generator=g)).sum().backward()
        if reduce:
            all_reduce_sequence_parallel_gradients(block)
        opt.step()

    def moe(experts, seed):
        torch.manual_seed(seed)
        return expert_parallel(MixtureOfExperts(8, experts, 1, 1.0))

    cases = {
        "ring: another sequence length": lambda: ring_attention(q[:, :, :8 if r == 0 else 6], q[:, :, :8 if r == 0 else 6],
                                                                q[:, :, :8 if r == 0 else 6]),
        "ring: balanced on one rank only": lambda: ring_attention(q, q, q, balanced=r == 0),
        "ulysses: another head count": lambda: ulysses_attention(q[:, :4 - 2 * r], q[:, :4 - 2 * r], q[:, :4 - 2 * r]),
        "sequence parallel: another sequence length": lambda: sequence_parallel(
            _sp_block(), {"1": "column", "3": "row"}, seq_dim=1)(torch.randn(2, 4 if r == 0 else 2, 8)),
        "sequence parallel: a gather of another length": lambda: gather_from_sequence_parallel_region(
            torch.randn(4 if r == 0 else 2, 8)),
        "sequence parallel: a step without the sum": lambda: sp_step(reduce=False),
        "sequence parallel: a step with the sum": lambda: sp_step(reduce=True),
        "experts: another count": lambda: moe(4 if r == 0 else 8, 0),
        "experts: another seed": lambda: moe(4, r),
    }
    replies = {}
    for name, make in cases.items():
        try:
            make()
            replies[name] = "accepted"
        except (ValueError, RuntimeError) as exc:
            replies[name] = f"{type(exc).__name__}: {exc}"
    return replies


LONG_CASES = {
    "ring: another sequence length": "the ranks disagree on the local sequence length: group rank 0 has 8, group rank 1 "
                                     "has 6",
    "ring: balanced on one rank only": "the ranks disagree on the split: group rank 0 has 'zigzag', group rank 1 has "
                                       "'contiguous'",
    "ulysses: another head count": "the ranks disagree on the number of query heads: group rank 0 has 4, group rank 1 "
                                   "has 2",
    "sequence parallel: another sequence length": "sequence_parallel region input: the ranks disagree on the size of "
                                                  "dimension 1: group rank 0 has 4, group rank 1 has 2",
    "sequence parallel: a gather of another length": "gather_from_sequence_parallel_region: the ranks disagree on the "
                                                     "size of dimension 0: group rank 0 has 4, group rank 1 has 2",
    "sequence parallel: a step without the sum": "RuntimeError: optimizer.step() before "
                                                 "all_reduce_sequence_parallel_gradients",
    "sequence parallel: a step with the sum": "accepted",
    "experts: another count": "the ranks disagree on the number of experts (all layers together): group rank 0 has 4, "
                              "group rank 1 has 8",
    "experts: another seed": "the replicas hold different values (group rank 1 differs from group rank 0)",
}


@pytest.fixture(scope="module")
def long_sequence_replies():
    return mpkit.launch(_long_sequence_misuse, 2, timeout=90)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(LONG_CASES))
def test_long_sequence_and_expert_misuse_is_refused_on_every_rank(long_sequence_replies, case, capfd):
    for rank, replies in enumerate(long_sequence_replies):
        assert LONG_CASES[case] in replies[case], (rank, replies[case])
    assert "gloo" not in capfd.readouterr().err  # no C++ abort on the caller's stderr
