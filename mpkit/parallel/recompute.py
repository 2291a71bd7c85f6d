"""Recomputation (activation checkpointing): keep fewer activations in forward, recompute them in
backward, with ``torch.utils.checkpoint`` (non-reentrant).

The mechanism in ~5 lines (``"full"`` on a model that is its ``blocks`` in order; the code below
adds ``"selective"``, ``checkpoint``'s ``context_fn``, and does it in place on any layers)::

    def forward(x):
        for block in blocks:                              # keep each block's input only: backward
            x = checkpoint(block, x, use_reentrant=False)  # runs block(x) again, then its backward
        return x

In the code: ``recompute_layers(layers, mode)`` wraps each layer's forward (``"full"``) or each
attention core (``"selective"``, ``selective_targets``) in ``_Checkpointed``, on the instance:
``torch.utils.checkpoint`` wraps a function, and wrapping the bound ``forward`` (or the attention
core, a method, which no module wrapper could reach) keeps every parameter name, as torch's
composable ``checkpoint(module)`` does in place.

``"full"``: each layer keeps only its input; its whole forward runs again during backward (about
one extra forward per step). ``"selective"`` (Korthikanti et al. 2022): only the attention core,
whose activations grow with the sequence length squared but cost few FLOPs to redo, is
recomputed; the matmuls' inputs stay. On a user's model the attention core is each
``nn.MultiheadAttention``.

Recomputing runs a forward twice, so whatever a forward changes besides its output changes twice:
BatchNorm in training mode updates its running statistics in the forward and again in the
recomputation (``torch.utils.checkpoint`` does the same; it restores only the random state, so
dropout masks match). ``recompute_layers`` warns when it wraps such a layer.
"""
from __future__ import annotations

import warnings

from torch import nn
from torch.utils.checkpoint import checkpoint

from mpkit.config import check_recompute
from mpkit.errors import MpkitWarning
from mpkit.i18n import both
from mpkit.models import SelfAttention

# BatchNorm in every form torch makes public (the lazy ones become these once built)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def recompute_layers(layers, mode: str | None, context_fn=None) -> None:
    """Checkpoint each module of ``layers`` (``"full"``) or each attention core inside them
    (``"selective"``), in place; parameter names do not change. None: unchanged. ``context_fn``:
    ``checkpoint``'s (the contexts of the forward and of its recomputation)."""
    check_recompute(mode)
    if mode == "full":
        for index, layer in enumerate(layers):
            _warn_if_batchnorm_trains(layer, index)
            layer.forward = _Checkpointed(layer.forward, context_fn)
    elif mode == "selective":
        for index, (module, name) in enumerate(selective_targets(layers)):
            _warn_if_batchnorm_trains(module, index)
            setattr(module, name, _Checkpointed(getattr(module, name), context_fn))


def _warn_if_batchnorm_trains(module: nn.Module, index: int) -> None:
    """A warning (Korean and English) when ``module`` holds BatchNorm that tracks running statistics in
    training mode: recomputation would update them twice per step."""
    if any(isinstance(m, _BATCH_NORMS) and m.training and m.track_running_stats for m in module.modules()):
        warnings.warn(both("warn_recompute_batchnorm", layer=f"{index} ({type(module).__name__})"), MpkitWarning,
                      stacklevel=3)


def selective_targets(layers) -> list:
    """``attention_cores(layers)``, or a ValueError saying what to use when there is none."""
    cores = attention_cores(layers)
    if not cores:
        raise ValueError("recompute='selective' recomputes the attention core, and this model has none "
                         "(no attention layer); use recompute='full', or model='gpt'")
    return cores


def attention_cores(layers) -> list:
    """(module, method name) of every attention core inside ``layers``."""
    found = []
    for layer in layers:
        for m in layer.modules():
            if isinstance(m, SelfAttention):
                found.append((m, "core"))
            elif isinstance(m, nn.MultiheadAttention):
                found.append((m, "forward"))
    return found


class _Checkpointed:
    """``fn`` run under ``checkpoint``: its intermediate activations are recomputed in backward."""

    def __init__(self, fn, context_fn=None):
        self.fn, self.context = fn, {} if context_fn is None else {"context_fn": context_fn}

    def __call__(self, *args, **kwargs):
        return checkpoint(self.fn, *args, use_reentrant=False, **self.context, **kwargs)


__all__ = ["check_recompute", "recompute_layers", "attention_cores", "selective_targets"]
