"""When no layout fits, the planner's advice names only what the caller pinned (what was searched
already failed) plus more GPUs or offload: review 2 F19, 175B on 8 GPUs was told to 'allow ZeRO-3'."""
from mpkit.sim import plan


def test_nothing_pinned_leaves_more_gpus_or_offload():
    table = plan("gpt3-175b", "8xH100-nvlink", gpus=8, global_batch=64)   # 16Ψ/8 = 350 GB per GPU
    assert table.best is None
    text = str(table)
    assert "No layout fits: add GPUs, or offload to CPU/NVMe (ZeRO-Offload/Infinity)" in text
    assert "allow ZeRO-3 (" not in text and "smaller micro_batch" not in text
    assert "(ZeRO-3 and full recomputation were already searched)" in text
    assert "GPU를 늘리거나" in table.to_text("ko") and "이미 찾아보았습니다" in table.to_text("ko")


def test_the_pins_that_could_be_relaxed_are_named():
    table = plan("7B", "8xH100-nvlink", gpus=8, global_batch=64, dp=8, zero=0, recompute="none", micro_batch=8)
    text = str(table)
    assert table.best is None
    for advice in ("add GPUs", "pin a smaller micro_batch", "allow ZeRO-3 (", "allow full recomputation ("):
        assert advice in text, advice
    assert "already searched" not in text
