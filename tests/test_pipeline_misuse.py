"""``mpkit.parallel.pipeline`` used wrongly fails loudly, naming the rank (or the stage) and the fix.

Each case trained something other than what the user wrote, or failed with torch's raw error only,
before the construction handshake (one all-gather of each rank's schedule, micro_batches and
split_points) and the stage shape check."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpkit


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 5))


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 6, generator=g), torch.randint(0, 5, (8,), generator=g)


def _build(ctx, model_fn, per_rank):
    """``per_rank(rank)``: the pipeline() keyword arguments this rank passes; one training step."""
    from mpkit.parallel import pipeline

    pipe = pipeline(model_fn(), loss_fn=F.cross_entropy, **per_rank(ctx.rank))
    return pipe.step(*batch())


def split_points_differ(rank):
    return {"split_points": [2] if rank == 0 else [4]}


def micro_batches_differ(rank):
    return {"split_points": [2], "micro_batches": 4 if rank == 0 else 2}


def schedule_differs(rank):
    return {"split_points": [2], "schedule": "1f1b" if rank == 0 else "gpipe"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("per_rank,message", [
    (split_points_differ, "rank 1 has split_points=[4] but rank 0 has split_points=[2]; pass the same split_points"),
    (micro_batches_differ, "rank 1 has micro_batches=2 but rank 0 has micro_batches=4; pass the same micro_batches"),
    (schedule_differs, "rank 1 has schedule='gpipe' but rank 0 has schedule='1f1b'; pass the same schedule"),
])
def test_ranks_that_disagree_are_named_with_the_fix(per_rank, message):
    # before: differing split_points returned a loss (rank 0 trained layers 0-1, rank 1 layers 4
    # only: layers 2-3 were in nobody's stage); differing micro_batches failed on the loss's batch size
    with pytest.raises(mpkit.LaunchError, match=message.replace("[", r"\[").replace("]", r"\]")):
        mpkit.launch(_build, 2, args=(net, per_rank), timeout=40)


def misfit():
    """Stage 1 starts with a Linear expecting 12 features; stage 0 gives 16."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(12, 5))


def misfit_middle():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(12, 16), nn.Linear(16, 5))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("model_fn,world_size,split,stage", [(misfit, 2, [2], "stage 1 (layers [2]: Linear)"),
                                                           (misfit_middle, 4, [1, 2, 3], "stage 2 (layers [2]: Linear)")])
def test_a_stage_that_cannot_take_the_previous_output_is_named(model_fn, world_size, split, stage):
    # before: only torch's "mat1 and mat2 shapes cannot be multiplied", no stage named
    def per_rank(rank):
        return {"split_points": split}
    with pytest.raises(mpkit.LaunchError) as info:
        mpkit.launch(_build, world_size, args=(model_fn, per_rank), timeout=40)
    text = str(info.value)
    assert f"{stage} cannot take stage {int(stage.split()[1]) - 1}'s output" in text
    assert "shape (2, 16) per micro-batch" in text and "split_points" in text
