"""An out-of-memory report files dp's gradient buckets as gradients even when the device fills
before the first backward (issue 36: lab 02's report for dp read "gradients 0 B", the buckets
counted as "other", because they exist from DataParallel's construction on)."""
import pytest
import torch
from torch import nn

import mpkit
from mpkit.models import ModelConfig, parameter_count
from mpkit.observe.memory import human
from mpkit.parallel import DataParallel


def _buckets_before_backward(ctx):
    with ctx.memory.track():
        model = nn.Linear(64, 64)
        dp = DataParallel(model)
        before = ctx.memory.current()
    with ctx.memory.track(model):  # a later track (the training loop's) keeps them gradients
        after = ctx.memory.current()
    return before["gradients"], after["gradients"], sum(b.nbytes for b in dp.buckets)


@pytest.mark.timeout(60)
def test_buckets_count_as_gradients_from_construction():
    for before, after, buckets in mpkit.launch(_buckets_before_backward, 2, timeout=30):
        assert before == after == buckets == 4 * (64 * 64 + 64)


@pytest.mark.timeout(120)
def test_lab_02_dp_report_names_the_gradients():
    """Lab 02's case: a GPT of 8 blocks on 16 MiB devices; dp fails in its first step."""
    psi = parameter_count(ModelConfig(kind="gpt", layers=8, hidden=128))
    with pytest.raises(mpkit.DeviceOutOfMemory) as err:
        mpkit.train("dp", 2, model="gpt", layers=8, hidden=128, batch_size=8, steps=3, device_memory="16MiB")
    assert f"parameters {human(4 * psi)}, gradients {human(4 * psi)}" in str(err.value)
