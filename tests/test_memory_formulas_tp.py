"""Tensor parallel memory on the gpt model, measured by ctx.memory, against formulas computed
here from the model's shapes (never from the measurement).

Parameters: replicated tensors stay whole, sharded ones shrink by t, so per rank
4·(Ψ_replicated + Ψ_sharded/t) bytes in fp32; gradients the same; Adam 2x that plus one 4-byte
``step`` tensor per parameter tensor (CPU Adam without capturable/fused keeps a float32 scalar).

Activations: Korthikanti et al. 2022 count, per transformer layer in fp16 with dropout,
s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes. Their 24/t is what tensor parallel shards: Q and K (4),
V (2), the attention output that feeds the output projection (2), GeLU's input (8) and output
(8): 12 values of s·b·h. Their 10 is replicated: two LayerNorm inputs (4), the inputs of the
QKV and first MLP matmuls (4), and two dropout masks of 1 byte each (2). 5·a·s²·b is the softmax
output (2), its dropout mask (1) and the dropout output (2), sharded by heads.

Our block has no dropout and runs attention through PyTorch's CPU flash kernel, which saves only
the log-sum-exp (a·s·b values) instead of the s×s scores; its output is already laid out as
(b, s, heads, head_dim), so the projection's input is a view of it, not a copy. LayerNorm also
keeps mean and rstd (2·s·b each). In fp32 the same bookkeeping gives, per layer,

    4 · (s·b·h·(4 + 12/t) + s·b·(4 + a/t)) bytes

i.e. exactly Korthikanti's dropout-free terms (8 + 24/t bytes per s·b·h element in fp16)
doubled for fp32, with the attention-score term replaced by the flash kernel's.

What we compare: the activations alive at the end of forward (what backward will read), for 2
layers minus 1 layer, so embedding, head, logits and the batch drop out.
"""
import re

import pytest

import mpkit
from mpkit.models import ModelConfig, build_model
from mpkit.observe.memory import CATEGORIES

SHARDED = re.compile(r"attn\.qkv\.(weight|bias)$|attn\.proj\.weight$|mlp\.up\.(weight|bias)$|mlp\.down\.weight$")
FP32 = 4


def expected_parameter_bytes(cfg: ModelConfig, t: int) -> int:
    replicated = sharded = 0
    for name, p in build_model(cfg).named_parameters():
        if SHARDED.search(name):
            sharded += p.numel()
        else:
            replicated += p.numel()
    assert sharded % t == 0
    return FP32 * (replicated + sharded // t)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("t", [2, 4])
def test_parameters_gradients_and_adam_state_per_rank(t):
    cfg = ModelConfig(kind="gpt")
    run = mpkit.train("tp", world_size=t, model="gpt", steps=3)
    params = expected_parameter_bytes(cfg, t)
    tensors = len(list(build_model(cfg).parameters()))  # sharding keeps every tensor, smaller
    for report in run.memory:
        assert report.max_by_category["parameters"] == params
        assert report.max_by_category["gradients"] == params
        assert report.final_by_category["optimizer"] == 2 * params + 4 * tensors
    assert params < expected_parameter_bytes(cfg, 1)


def activations_at_end_of_forward(run) -> int:
    """Activation bytes at the last sample of each forward span, minimum over ranks and steps.

    Minimum: gloo's worker thread drops its reference to an all-reduced buffer a moment after
    the call returns, so a sample can still count one such buffer that is already garbage; this
    only ever adds, and the minimum is what the model itself keeps."""
    column = CATEGORIES.index("activations")
    values = []
    for report in run.memory:
        for event in run.trace.of_rank(report.rank):
            if event.kind == "forward":
                end = event.end + run.trace.t0
                values.append([v[column] for t, v in report.samples if t <= end][-1])
    return min(values)


def per_layer_formula(cfg: ModelConfig, batch: int, t: int) -> float:
    s, b, h, a = cfg.seq_len, batch, cfg.hidden, cfg.heads
    return FP32 * (s * b * h * (4 + 12 / t) + s * b * (4 + a / t))


@pytest.mark.timeout(120)
def test_activations_per_layer_follow_the_korthikanti_analogue():
    batch = 32
    measured = {}
    for t in (1, 2, 4):
        one, two = (activations_at_end_of_forward(mpkit.train("tp", world_size=t, model="gpt", layers=layers,
                                                              steps=3, batch_size=batch)) for layers in (1, 2))
        measured[t] = two - one
    cfg = ModelConfig(kind="gpt")
    for t, value in measured.items():
        assert value == pytest.approx(per_layer_formula(cfg, batch, t), rel=0.10), (t, measured)
    # the sharded share alone: what t ranks save against one, (1 - 1/t) of the sharded bytes
    s, b, h, a = cfg.seq_len, batch, cfg.hidden, cfg.heads
    sharded = FP32 * (12 * s * b * h + a * s * b)
    for t in (2, 4):
        assert measured[1] - measured[t] == pytest.approx(sharded * (1 - 1 / t), rel=0.10), (t, measured)
