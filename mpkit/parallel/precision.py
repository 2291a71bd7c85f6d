"""Mixed precision, as a mechanism on any ``nn.Module``: low-precision compute, fp32 master weights.

The mechanism in ~20 lines (one fp16 training step with dynamic loss scaling, ``scale`` and
``good`` carried from step to step; ``MixedPrecision`` and ``LossScaler`` below)::

    with torch.autocast("cpu", dtype=torch.float16):     # 1. matmuls in fp16, weights stay fp32
        loss = loss_fn(model(x), y)                       #    (autocast runs the loss in fp32)
    (loss * scale).backward()                             # 2. scaled: small gradients survive fp16
    grads = [p.grad for p in model.parameters()]
    for g in grads:
        g.mul_(1 / scale)                                 # 3. unscale the fp32 gradients
    found_inf = torch.tensor([float(any(not g.isfinite().all() for g in grads))])
    dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)      # 4. the ranks holding other gradients agree
    if found_inf.item():
        scale, good = scale * 0.5, 0                      # 5. an inf or NaN: skip the step, back off
    else:
        optimizer.step()                                  # 6. the step on the fp32 master weights
        good += 1
        if good == growth_interval:                       # 7. grow after growth_interval good steps
            scale, good = scale * 2.0, 0

In the code: ``MixedPrecision.wrap`` (1, per layer: ``autocast_layers``), ``backward`` (2),
``step`` = ``unscale_`` (3, 4, ``LossScaler.unscale_``) + ``LossScaler.update`` (5, 7) + the
optimizer's step (6); bf16 skips 2-5 and 7. Then the checks.

``autocast_layers(layers, "bf16")`` runs each layer's forward under ``torch.autocast`` (matmuls in
bf16 or fp16, reductions such as the loss in fp32) and hands the next layer an fp32 tensor, so a
pipeline cut between any two layers sends what the cut-free model computes. It wraps each layer's
``forward`` on the instance, as torch's own docs apply ``torch.autocast`` as a decorator on
``forward``: the parameter names and the module's hooks stay as they were (a wrapper module would
rename every parameter), and ``nn.Module.__call__`` calls the wrapped forward like the original. The parameters,
their gradients and the optimizer stay fp32 (the "master weights"): autocast only makes
short-lived low-precision copies of the weights for the matmuls.

fp16 has 5 exponent bits: small gradients underflow to 0, large ones overflow to inf. A
``LossScaler`` multiplies the loss by S before backward (gradients are S times larger, above the
underflow), divides the gradients by S before the step, and when any gradient is inf/NaN skips the
step and halves S; after ``growth_interval`` good steps in a row it doubles S (Micikevicius et
al. 2018; the same rule as ``torch.amp.GradScaler``, which the tests compare it with). bf16 has
fp32's exponent range and needs no scaler.
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn

from mpkit.config import DEFAULT_LOSS_SCALE, check_precision_name
from mpkit.errors import MpkitWarning
from mpkit.i18n import both
from mpkit.observe import active
from mpkit.parallel.checks import split_gradients_world

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # by config.PRECISIONS


class MixedPrecision:
    """One rank's precision recipe: ``forward`` under autocast (see ``autocast_layers``),
    ``backward(loss)`` (scaled for fp16), ``step(optimizer, params)`` (unscaled, or skipped on an
    overflow; returns whether it stepped). fp32: plain backward and step."""

    def __init__(self, precision: str = "bf16", scaler: LossScaler | None = None):
        check_precision(precision, scaler)
        self.precision, self.scaler = precision, scaler

    def wrap(self, layers) -> None:
        autocast_layers(layers, self.precision, self.scaler)

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale_(self, params, group=None) -> bool:
        """Gradients ready for the optimizer: True to step, False to skip (an overflow)."""
        if self.scaler is None:
            return True
        ok = self.scaler.unscale_(params, group)
        self.scaler.update(not ok)
        return ok

    def step(self, optimizer, params, group=None) -> bool:
        ok = self.unscale_(params, group)
        if ok:
            optimizer.step()
        return ok

    def report(self) -> dict:
        """What the lab shows: the recipe, each step's loss scale and the skipped steps."""
        out = {"precision": self.precision}
        if self.scaler is not None:
            out.update(loss_scale=list(self.scaler.history), skipped_steps=list(self.scaler.skipped))
        return out


class LossScaler:
    """Dynamic loss scaling: ``scale(loss)`` before backward, ``unscale_(params)`` before the step
    (False: a gradient overflowed, skip this step), then ``update(found_inf)``. ``history`` holds
    each step's scale and ``skipped`` the steps it skipped (counted from 0)."""

    def __init__(self, init_scale: float = DEFAULT_LOSS_SCALE, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError("LossScaler needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 and "
                             "growth_interval >= 1 (defaults: 2**16, 2, 0.5, 2000, as torch.amp.GradScaler)")
        self.value, self.growth, self.backoff = float(init_scale), growth_factor, backoff_factor
        self.interval = growth_interval
        self.good, self.steps, self.history, self.skipped = 0, 0, [], []

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.value

    def unscale_(self, params, group=None) -> bool:
        """Divide the gradients by the scale; True when all are finite on every rank of ``group``
        (the ranks that hold different gradients: shards or stages; None: this rank holds them all).
        A pipeline's stages with ``group=None`` are refused: each rank would decide alone."""
        params = list(params)
        world = split_gradients_world(params) if group is None else 1
        if world > 1:
            raise ValueError(both("err_fp16_pipeline_group", world=world))
        grads = _grads(params)
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.value)
        device = grads[0].device if grads else None  # nccl reduces on the GPU
        bad = torch.tensor([float(any(not torch.isfinite(g).all() for g in grads))], device=device)
        if group is not None and dist.is_initialized() and dist.get_world_size(group) > 1:
            active.comm().all_reduce(bad, op="max", group=group, name="found inf")
        return not bad.item()

    def update(self, found_inf: bool) -> None:
        self.history.append(self.value)
        if found_inf:
            self.skipped.append(self.steps)
            self.value *= self.backoff
            self.good = 0
        else:
            self.good += 1
            if self.good == self.interval:
                self.value *= self.growth
                self.good = 0
        self.steps += 1


def autocast_layers(layers, precision: str, scaler: LossScaler | None = None) -> None:
    """Make each module of ``layers`` compute in ``precision`` ("bf16" or "fp16"; "fp32": unchanged).
    In place; parameter names do not change. fp16 without ``scaler``, the ``LossScaler`` that will
    scale the loss, warns (in Korean and English): unscaled, most small gradients underflow to 0."""
    check_precision_name(precision)
    if precision == "fp16" and scaler is None:
        warnings.warn(both("warn_fp16_no_scaler"), MpkitWarning, stacklevel=2)
    dtype = DTYPES[precision]
    if dtype is None:
        return
    for layer in layers:
        layer.forward = _AutocastForward(layer, dtype)


class _AutocastForward:
    """A module's forward under autocast, its floating outputs returned as fp32."""

    def __init__(self, module: nn.Module, dtype):
        self.module, self.dtype, self.inner = module, dtype, module.forward

    def __call__(self, *args, **kwargs):
        device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
        with torch.autocast(device_type=device, dtype=self.dtype):
            out = self.inner(*args, **kwargs)
        return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def check_precision(precision, scaler=None) -> None:
    """ValueError for an unknown precision, or fp16 with no loss scaler."""
    check_precision_name(precision)
    if precision == "fp16" and scaler is None:
        raise ValueError("precision='fp16' needs dynamic loss scaling: small gradients underflow to 0 and large "
                         "ones overflow in fp16. Pass a scaler (MixedPrecision('fp16', scaler=LossScaler())), "
                         "or use precision='bf16', which has fp32's range and needs none")


def _grads(params) -> list[torch.Tensor]:
    """The gradients this rank holds: a sharded (DTensor) gradient as its local shard."""
    return [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params if p.grad is not None]


__all__ = ["DTYPES", "check_precision", "autocast_layers", "LossScaler", "MixedPrecision"]
