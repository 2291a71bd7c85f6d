"""mpkit: run model-parallel and data-parallel training for real, on simulated CPU devices or GPUs.

The public names below are the contract notebooks and tests rely on (see README and
ARCHITECTURE.md). Everything but the error types loads on first use, so ``import mpkit`` and
``from mpkit import quiz`` do not import torch (an nbgrader kernel grading a quiz never needs it).
"""
from importlib import import_module

from mpkit.errors import DeviceOutOfMemory, LaunchError, LaunchTimeout

__version__ = "0.1.0"

_LAZY = {
    "devices": ("mpkit.runtime.devices", "devices"),
    "launch": ("mpkit.runtime.launch", "launch"),
    "train": ("mpkit.training", "train"),
    "Run": ("mpkit.training", "Run"),
    "STRATEGIES": ("mpkit.strategies", "STRATEGIES"),
    "plot": ("mpkit.plot", None),
    "sim": ("mpkit.sim", None),
    "quiz": ("mpkit.quiz", None),
    "models": ("mpkit.models", None),
    "parallel": ("mpkit.parallel", None),
}

__all__ = ["LaunchError", "LaunchTimeout", "DeviceOutOfMemory", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'mpkit' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value
