"""mpkit: run model-parallel and data-parallel training for real, on simulated CPU devices or GPUs.

The public names below are the contract notebooks and tests rely on (see README). Heavy
submodules (plot, sim, quiz, parallel) load on first use so ``import mpkit`` stays fast in a kernel.
"""
from importlib import import_module

from mpkit.runtime.devices import devices
from mpkit.errors import DeviceOutOfMemory, LaunchError, LaunchTimeout
from mpkit.runtime.launch import launch
# Eager, not lazy: importing the submodule ``mpkit.train`` first (``from mpkit.train import
# make_config``) would otherwise leave ``mpkit.train`` bound to the module, not the function.
from mpkit.train import Run, train

__version__ = "0.1.0"

_LAZY = {
    "STRATEGIES": ("mpkit.strategies", "STRATEGIES"),
    "plot": ("mpkit.plot", None),
    "sim": ("mpkit.sim", None),
    "quiz": ("mpkit.quiz", None),
    "models": ("mpkit.models", None),
    "parallel": ("mpkit.parallel", None),
}

__all__ = ["devices", "launch", "train", "Run", "LaunchError", "LaunchTimeout", "DeviceOutOfMemory", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'mpkit' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value
