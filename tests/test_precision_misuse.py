"""Misuse of mixed precision and recomputation that used to be silently wrong (issue 46): fp16
autocast with no loss scaler, an fp16 pipeline whose ranks check overflows alone, and recomputation
over BatchNorm in training mode. Each now warns or refuses, in Korean and English."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpkit
from mpkit.errors import MpkitWarning
from mpkit.parallel import LossScaler, MixedPrecision, autocast_layers, pipeline, recompute_layers


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_fp16_autocast_without_a_loss_scaler_warns_in_both_languages_and_says_what_to_pass():
    with pytest.warns(MpkitWarning, match=r"(?s)손실 스케일러.*scaler=LossScaler\(\)") as record:
        autocast_layers([_net()], "fp16")
    assert len(record) == 1 and "bf16" in str(record[0].message)


@pytest.mark.parametrize("how", ["scaler", "mixed precision", "bf16"])
def test_fp16_autocast_with_its_scaler_or_bf16_does_not_warn(how, recwarn):
    if how == "scaler":
        autocast_layers([_net()], "fp16", scaler=LossScaler())
    elif how == "mixed precision":
        MixedPrecision("fp16", LossScaler()).wrap([_net()])
    else:
        autocast_layers([_net()], "bf16")
    assert not [w for w in recwarn if issubclass(w.category, MpkitWarning)]


def _fp16_pipeline_rank(ctx, group_given):
    torch.manual_seed(0)
    scaler = LossScaler(2.0 ** 10)
    mp = MixedPrecision("fp16", scaler)
    pipe = pipeline(_net(), split_points=[2], schedule="1f1b", micro_batches=2,
                    loss_fn=lambda out, y: scaler.scale(F.mse_loss(out, y)))
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    pipe.step(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g))
    return mp.step(opt, pipe.parameters(), **({"group": torch.distributed.group.WORLD} if group_given else {}))


@pytest.mark.timeout(90)
def test_an_fp16_pipeline_stepped_without_its_group_is_refused_and_with_it_steps():
    # each rank holds other stages' gradients: checked alone, one rank could skip a step the other takes
    # and their loss scales drift apart; the check must cover the pipeline's group
    with pytest.raises(mpkit.LaunchError, match=r"(?s)group=.*파이프라인"):
        mpkit.launch(_fp16_pipeline_rank, 2, args=(False,), timeout=60)
    assert mpkit.launch(_fp16_pipeline_rank, 2, args=(True,), timeout=60) == [True, True]


def _with_batchnorm():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))


def test_recompute_over_batchnorm_in_training_warns_that_its_statistics_update_twice():
    net = _with_batchnorm()
    with pytest.warns(MpkitWarning, match=r"(?s)BatchNorm.*두 번.*torch.utils.checkpoint.*twice per step"):
        recompute_layers([net], "full")
    net(torch.randn(8, 4)).sum().backward()
    assert net[1].num_batches_tracked.item() == 2  # what the warning says: forward, then again in backward


def test_recompute_over_batchnorm_in_eval_mode_or_without_it_does_not_warn(recwarn):
    recompute_layers([_with_batchnorm().eval()], "full")
    recompute_layers([_net()], "full")
    assert not [w for w in recwarn if issubclass(w.category, MpkitWarning)]
