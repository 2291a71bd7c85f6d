"""mpkit: run model-parallel and data-parallel training for real, on simulated CPU devices or GPUs.

The public names below are the contract notebooks and tests rely on (see README). Heavy
submodules (plot, sim, quiz) load on first use so ``import mpkit`` stays fast in a kernel.
"""
from importlib import import_module

from mpkit.runtime.devices import devices
from mpkit.runtime.errors import DeviceOutOfMemory, LaunchError, LaunchTimeout
from mpkit.runtime.launch import launch

__version__ = "0.1.0"

_LAZY = {
    "train": ("mpkit.train", "train"),
    "Run": ("mpkit.train", "Run"),
    "STRATEGIES": ("mpkit.strategies", "STRATEGIES"),
    "plot": ("mpkit.plot", None),
    "sim": ("mpkit.sim", None),
    "quiz": ("mpkit.quiz", None),
    "models": ("mpkit.models", None),
}

__all__ = ["devices", "launch", "LaunchError", "LaunchTimeout", "DeviceOutOfMemory", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'mpkit' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value
