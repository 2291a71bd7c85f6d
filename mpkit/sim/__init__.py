"""``mpkit.sim``: the cost model. Closed-form formulas, hardware presets (``cpu-sim`` measured
here by ``calibrate()``, GPU machines from datasheets), ``predict`` — step time, breakdown,
per-rank memory and a predicted timeline that ``mpkit.plot`` draws like a measured one — and
``plan``, which ranks the dp x pp x tp layouts of a large transformer on a GPU cluster.
``whatif`` and ``planner`` are the widgets.

The package holds two layers: the simulator and its prices (``engine``, ``formulas``,
``hardware``, ``profile``, ``pricing``), which the strategies build their programs with, and
the front end (``prediction``, ``cpu``, ``calibration``, ``analytic``, ``plan``, ``whatif``,
``planwidget``), which reads the strategies. Names load on first use, so importing the
simulator does not import the front end.
"""
import sys
from types import ModuleType

from mpkit.lazy import lazy_getattr

_LAZY = {
    "formulas": ("mpkit.sim.formulas", None),
    "Hardware": ("mpkit.sim.hardware", "Hardware"),
    "Link": ("mpkit.sim.hardware", "Link"),
    "PRESETS": ("mpkit.sim.hardware", "PRESETS"),
    "GPU_PRESETS": ("mpkit.sim.hardware", "GPU_PRESETS"),
    "MULTI_NODE": ("mpkit.sim.hardware", "MULTI_NODE"),
    "get_hardware": ("mpkit.sim.machines", "get_hardware"),
    "predict": ("mpkit.sim.prediction", "predict"),
    "Prediction": ("mpkit.sim.prediction", "Prediction"),
    "PredictedMemory": ("mpkit.sim.memory", "PredictedMemory"),
    "calibrate": ("mpkit.sim.calibration", "calibrate"),
    "plan": ("mpkit.sim.plan", "plan"),
    "LayoutTable": ("mpkit.sim.plan", "LayoutTable"),
    "Transformer": ("mpkit.sim.analytic", "Transformer"),
    "MODELS": ("mpkit.sim.analytic", "MODELS"),
    "whatif": ("mpkit.sim.whatif", "whatif"),
    "planner": ("mpkit.sim.planwidget", "planner"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr('mpkit.sim', _LAZY, globals())


class _Package(ModuleType):
    """``mpkit.sim`` itself. Python binds a submodule to its package's attribute of the same name
    when the submodule is first imported, so importing ``mpkit.sim.plan`` (the module: the planner
    widget does) used to turn ``mpkit.sim.plan`` from the function into the module ('module' object
    is not callable). A submodule bound under a name the table gives a function keeps the function."""

    def __setattr__(self, name, value):
        source, attr = _LAZY.get(name, (None, None))
        if attr is not None and isinstance(value, ModuleType) and value.__name__ == source:
            value = getattr(value, attr)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
