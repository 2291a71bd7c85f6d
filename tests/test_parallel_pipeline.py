"""``mpkit.parallel.pipeline`` on a learner's ``nn.Sequential``: parity with one device for several
schedules and splits, a frozen first stage, and bad input. Models and tolerance: ``parallel_models``."""
import torch
import torch.nn.functional as F
from torch import nn

import pytest

import mpkit
from parallel_models import assert_every_rank_raises, ATOL, deep_net, raised, regression_batch, single_deep, state, train_deep


def _pipeline_rank(ctx, schedule, split_points):
    from mpkit.parallel import pipeline

    pipe = pipeline(deep_net(), split_points=split_points, schedule=schedule, micro_batches=4,
                    loss_fn=F.cross_entropy)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(3):
        x, y = regression_batch(step)
        losses.append(pipe.step(x, y))
        opt.step()
        opt.zero_grad()
    params = {f"{i}.{n}": p.detach().clone() for s in pipe.stages.values()
              for i, layer in zip(s.layer_ids, s) for n, p in layer.named_parameters()}
    return losses, params, sorted(pipe.stages)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size,schedule,split_points", [(2, "1f1b", None), (2, "gpipe", [3]),
                                                              (4, "1f1b", [1, 3, 5]), (2, "interleaved", None)])
def test_pipeline_on_a_user_sequential(world_size, schedule, split_points):
    # micro-batch losses are averaged (loss/m per micro-batch, gradients accumulated): the same
    # math as the whole batch at once, summed in another order — float32 noise under 1e-5
    ref_losses, ref_state = single_deep()
    out = mpkit.launch(_pipeline_rank, world_size, args=(schedule, split_points), timeout=100)
    last = [losses for losses, _, _ in out if losses[0] is not None]
    assert len(last) == 1 and max(abs(a - b) for a, b in zip(last[0], ref_losses)) <= ATOL
    params = {k: v for _, p, _ in out for k, v in p.items()}
    assert set(params) == set(ref_state)
    assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)
    if split_points:
        assert out[0][2] == [0]


def frozen_input_net():
    """deep_net with its input layer frozen, as a fine-tuned model's embedding or backbone."""
    model = deep_net()
    model[0].requires_grad_(False)
    return model


def _frozen_first_stage_rank(ctx):
    from mpkit.parallel import pipeline

    pipe = pipeline(frozen_input_net(), split_points=[1], schedule="1f1b", micro_batches=4, loss_fn=F.cross_entropy)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2, weight_decay=0.1)  # rank 0's are all frozen: skipped
    losses = []
    for step in range(3):
        losses.append(pipe.step(*regression_batch(step)))
        opt.step()
        opt.zero_grad()
    return losses, {f"{i}.{n}": p.detach().clone() for s in pipe.stages.values()
                    for i, layer in zip(s.layer_ids, s) for n, p in layer.named_parameters()}


@pytest.mark.timeout(120)
def test_pipeline_with_a_frozen_first_stage_matches_single_device():
    # the first stage computes no gradient at all: its backward has nothing to do (autograd
    # refuses a backward through an output that needs none), the other stages train as usual
    model = frozen_input_net()
    ref_losses, ref_state = train_deep(model), state(model)
    out = mpkit.launch(_frozen_first_stage_rank, 2, timeout=100)
    assert out[0][0] == [None] * 3 and max(abs(a - b) for a, b in zip(out[1][0], ref_losses)) <= ATOL
    params = {**out[0][1], **out[1][1]}
    assert set(params) == set(ref_state) and torch.equal(params["0.weight"], ref_state["0.weight"])
    assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)


def tied_sequential():
    """An embedding whose weight the output layer reuses, as language models tie them."""
    torch.manual_seed(0)
    emb = nn.Embedding(16, 8)
    head = nn.Linear(8, 16, bias=False)
    head.weight = emb.weight
    return nn.Sequential(emb, nn.Linear(8, 8), nn.Tanh(), head)


def _bad_input_rank(ctx, case):
    from mpkit.parallel import pipeline

    cases = {
        "too many stages": lambda: pipeline(nn.Sequential(nn.Linear(4, 4)), loss_fn=F.mse_loss),
        "tied across stages": lambda: pipeline(tied_sequential(), split_points=[2], loss_fn=F.cross_entropy),
        "rank without parameters": lambda: pipeline(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4),
                                                                  nn.Flatten()),
                                                    schedule="interleaved", micro_batches=2, loss_fn=F.mse_loss),
    }
    return raised(cases[case])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,message", [
    ("too many stages", "has 1 layers, fewer than the 2 stages of world_size=2"),
    # each rank would train its own copy of the tied weight on its own stage's gradient only
    ("tied across stages", "parameter '0.weight' of stage 0 is shared with '3.weight' of stage 1 (tied weights)"),
    # as mpkit.train("pp") checks it: per rank, so interleaving may give a rank a parameter-free stage
    ("rank without parameters", "rank 1 would hold only stages 1 (layers [1]: ReLU) and 3 (layers [3]: Flatten), "
                                "none of which has parameters"),
])
def test_bad_input_is_a_clear_error(case, message):
    assert_every_rank_raises(_bad_input_rank, case, message)
