"""``mpkit.parallel.ShardedOptimizer`` (ZeRO-1): parity with one device, checkpoints that resume
exactly, clipping of the averaged gradient, parameters without a gradient, and bad input.
Models and tolerance: ``parallel_models``."""
import torch
import torch.nn.functional as F
from torch import nn

import pytest

import mpkit
from mpkit.parallel import DataParallel, ShardedOptimizer
from parallel_models import (assert_every_rank_raises, ATOL, STEPS, assert_matches_single, batch, data_parallel_rank, deep_net, half_and_full,
                             make_net, param_groups, raised, regression_batch, shard, state, with_buffer)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 4])
def test_sharded_optimizer_matches_single_device(world_size):
    out = mpkit.launch(data_parallel_rank, world_size, args=(25.0, True, True), timeout=150)
    assert_matches_single(out, world_size)


def _resume_rank(ctx, stop_at):
    """Train ``stop_at`` steps, save model + optimizer, rebuild both from scratch, load, finish."""
    def fresh():
        model = make_net(seed=ctx.rank)
        dp = DataParallel(model, find_unused_parameters=True)
        return model, dp, ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2)

    model, dp, opt = fresh()
    losses = []
    for step in range(STEPS):
        if step == stop_at:
            saved = (state(model), opt.state_dict())
            model, dp, opt = fresh()
            model.load_state_dict(saved[0])
            opt.load_state_dict(saved[1])
        x, y = batch(step)
        loss = F.cross_entropy(dp(shard(x, ctx.rank, 2)), shard(y, ctx.rank, 2))
        loss.backward()
        dp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return state(model)


@pytest.mark.timeout(120)
def test_sharded_optimizer_state_dict_resumes_exactly():
    straight = mpkit.launch(_resume_rank, 2, args=(None,), timeout=100)
    resumed = mpkit.launch(_resume_rank, 2, args=(2,), timeout=100)
    for a, b in zip(straight, resumed):
        assert all(torch.equal(a[k], b[k]) for k in a)  # the same run, bit for bit


def _layout_mismatch_rank(ctx):
    model = make_net()
    saved = ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2).state_dict()
    other = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)  # one group, not two
    try:
        other.load_state_dict(saved)
    except ValueError as exc:
        return str(exc)
    return "loaded"


@pytest.mark.timeout(60)
def test_state_dict_of_another_layout_is_refused():
    assert all("saved for layout" in msg for msg in mpkit.launch(_layout_mismatch_rank, 2, timeout=50))


def sharded_start(model, with_module):
    """ZeRO-1 without DataParallel: the replicas start from rank 0's values."""
    opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    opt.broadcast_parameters(model if with_module else None)


def _clipped_rank(ctx, average_gradients):
    model = deep_net()
    dp = None if average_gradients else DataParallel(model)
    opt = ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2, average_gradients=average_gradients)
    norms = []
    for step in range(STEPS):
        x, y = regression_batch(step)
        F.cross_entropy((dp or model)(shard(x, ctx.rank, 2)), shard(y, ctx.rank, 2)).backward()
        if dp is not None:
            dp.finish_gradient_synchronization()
        norms.append(opt.clip_grad_norm_(0.05).item())
        opt.step()
        opt.zero_grad()
    return norms, state(model)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("average_gradients", [True, False])
def test_sharded_optimizer_clips_the_averaged_gradient(average_gradients):
    # torch's clip_grad_norm_ on the model after backward would see each rank's own gradient when
    # the optimizer averages them itself: the clip must act on the average, as on one device
    model = deep_net()
    opt = torch.optim.AdamW(param_groups(model), lr=1e-2)
    ref_norms = []
    for step in range(STEPS):
        x, y = regression_batch(step)
        F.cross_entropy(model(x), y).backward()
        ref_norms.append(nn.utils.clip_grad_norm_(model.parameters(), 0.05).item())
        opt.step()
        opt.zero_grad()
    assert min(ref_norms) > 0.05  # every step is clipped
    for norms, params in mpkit.launch(_clipped_rank, 2, args=(average_gradients,), timeout=100):
        assert max(abs(a - b) for a, b in zip(norms, ref_norms)) <= ATOL
        assert all((params[k] - v).abs().max().item() <= ATOL for k, v in state(model).items())


def _unused_branch_rank(ctx):
    model = make_net()
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, average_gradients=True, lr=1e-2)
    opt.name_parameters(model)
    x, y = batch(0)
    F.cross_entropy(model(shard(x, ctx.rank, 2)), shard(y, ctx.rank, 2)).backward()
    try:
        opt.step()
    except RuntimeError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.timeout(60)
def test_sharded_optimizer_averaging_itself_names_a_parameter_without_gradient():
    # average_gradients=True reduce-scatters every trainable gradient: Net's unused branch has none
    # (its .grad is only the flat buffer's view, which no backward reached), which must be an error
    # naming it, not a silent AdamW step on a zero gradient that one device would have skipped
    for reply in mpkit.launch(_unused_branch_rank, 2, timeout=50):
        assert reply.startswith("parameter(s) 'unused.weight', 'unused.bias' have no gradient this step"), reply
        assert "find_unused_parameters=True" in reply


def _regained_gradients_rank(ctx):
    import warnings

    from mpkit.errors import MpkitWarning

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(8)))  # 16 parameters, 8 in each rank's slice
    opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    opt.name_parameters(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count every warning raised, not once per message
        for step in range(6):
            if step % 2 == 0:  # steps 1, 3, 5 have no gradients; 2 and 4 bring all 16 back
                model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    return [str(w.message) for w in caught if issubclass(w.category, MpkitWarning)]


@pytest.mark.timeout(60)
def test_sharded_optimizer_warns_about_bias_correction_once():
    # every parameter of a slice regaining its gradient (twice) used to warn once per parameter
    # name and step: 8 per rank per step. One warning per optimizer says how many and names a few.
    for messages in mpkit.launch(_regained_gradients_rank, 2, timeout=50):
        assert len(messages) == 1, messages
        assert messages[0].startswith("8 parameter(s) of this rank's slice ("), messages
        assert "and 5 more) have a gradient again" in messages[0] and "bias correction" in messages[0]


def _bad_input_rank(ctx, case):
    frozen = nn.Linear(4, 4).requires_grad_(False)
    cases = {
        "no trainable zero": lambda: ShardedOptimizer(frozen.parameters(), torch.optim.AdamW, lr=1e-3),
        "lbfgs": lambda: ShardedOptimizer(nn.Linear(4, 4).parameters(), torch.optim.LBFGS),
        "mixed dtypes": lambda: ShardedOptimizer(half_and_full().parameters(), torch.optim.SGD, lr=0.1),
        "sharded replicas": lambda: sharded_start(nn.Linear(4, 4 + 4 * ctx.rank), with_module=False),
        "sharded replica order": lambda: sharded_start(nn.Sequential(nn.Linear(4, 2 + 2 * ctx.rank),
                                                                     nn.Linear(4, 4 - 2 * ctx.rank)),
                                                       with_module=True),
        "sharded buffers": lambda: sharded_start(with_buffer(ctx.rank), with_module=True),
        "sharded order, flat": lambda: sharded_start(nn.Sequential(nn.Linear(4, 2 + 2 * ctx.rank),
                                                                   nn.Linear(4, 4 - 2 * ctx.rank)),
                                                     with_module=False),
    }
    return raised(cases[case])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,message", [
    ("no trainable zero", "no trainable parameters"),
    ("lbfgs", "LBFGS updates a tensor as a whole"),
    # one flat buffer per group: the bf16 parameters would silently become fp32
    ("mixed dtypes", "parameter group 0 mixes dtypes (bfloat16, float32)"),
    # ShardedOptimizer.broadcast_parameters broadcasts flat buffers (or the module coalesced): the
    # same silent crossing of parameter boundaries, the same check
    ("sharded replicas", "ShardedOptimizer.broadcast_parameters: the replicas differ: parameter 'group 0 param 0' "
                         "has shape (8, 4), dtype float32 on group rank 1"),
    ("sharded replica order", "ShardedOptimizer.broadcast_parameters: the replicas differ: parameter '0.weight' has "
                              "shape (4, 4), dtype float32 on group rank 1, but shape (2, 4)"),
    ("sharded buffers", "ShardedOptimizer.broadcast_parameters: the replicas differ: parameter 'buffer seen'"),
    # the same total size in another order: equal flat buffers, so only the check tells
    ("sharded order, flat", "ShardedOptimizer.broadcast_parameters: the replicas differ: parameter 'group 0 param 0' "
                            "has shape (4, 4), dtype float32 on group rank 1, but shape (2, 4)"),
])
def test_bad_input_is_a_clear_error(case, message):
    assert_every_rank_raises(_bad_input_rank, case, message)
