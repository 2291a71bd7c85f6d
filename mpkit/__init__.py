"""mpkit: run model-parallel and data-parallel training for real, on simulated CPU devices or GPUs.

The public names below are the contract notebooks and tests rely on (see README and
ARCHITECTURE.md). Everything but the error types loads on first use, so ``import mpkit`` and
``from mpkit import quiz`` do not import torch (an nbgrader kernel grading a quiz never needs it).
"""
from mpkit.lazy import lazy_getattr

from mpkit.errors import DeviceOutOfMemory, LaunchError, LaunchTimeout, MpkitWarning

__version__ = "0.1.0"

_LAZY = {
    "devices": ("mpkit.runtime.devices", "devices"),
    "launch": ("mpkit.runtime.launch", "launch"),
    "train": ("mpkit.capstone", "train"),  # mpkit.training.train, plus use= (the capstone: your own pieces)
    "Run": ("mpkit.training", "Run"),
    "STRATEGIES": ("mpkit.strategies", "STRATEGIES"),
    "plot": ("mpkit.plot", None),
    "sim": ("mpkit.sim", None),
    "quiz": ("mpkit.quiz", None),
    "models": ("mpkit.models", None),
    "parallel": ("mpkit.parallel", None),
}

__all__ = ["LaunchError", "LaunchTimeout", "DeviceOutOfMemory", "MpkitWarning", *_LAZY]


__getattr__ = lazy_getattr('mpkit', _LAZY, globals())
