"""``mpkit.sim``: the cost model's public face — the names users import, and nothing else.
Closed-form formulas, hardware presets (``cpu-sim`` measured here by ``calibrate()``, GPU machines
from datasheets), ``predict`` — step time, breakdown, per-rank memory and a predicted timeline that
``mpkit.plot`` draws like a measured one — and ``plan``, which ranks the dp x pp x tp layouts of a
large transformer on a GPU cluster. ``whatif``, ``planner`` and ``checkpoint_interval`` are the widgets.

The code lives in one folder per layer (ARCHITECTURE.md): ``mpkit.simulator`` (the discrete-event
engine, formulas, machines), ``mpkit.pricing`` (op counts and prices), ``mpkit.costmodel``
(prediction, CPU model, memory, calibration, planner) and ``mpkit.widgets``. This package holds no
module of its own, so no submodule can shadow a public name (``plan`` was once both). Names load on
first use, so importing ``mpkit.sim`` imports none of them.
"""
from mpkit.lazy import lazy_getattr

_LAZY = {
    "formulas": ("mpkit.simulator.formulas", None),
    "Hardware": ("mpkit.simulator.hardware", "Hardware"),
    "Link": ("mpkit.simulator.hardware", "Link"),
    "PRESETS": ("mpkit.simulator.hardware", "PRESETS"),
    "GPU_PRESETS": ("mpkit.simulator.hardware", "GPU_PRESETS"),
    "MULTI_NODE": ("mpkit.simulator.hardware", "MULTI_NODE"),
    "get_hardware": ("mpkit.simulator.machines", "get_hardware"),
    "predict": ("mpkit.costmodel.prediction", "predict"),
    "Prediction": ("mpkit.costmodel.prediction", "Prediction"),
    "PredictedMemory": ("mpkit.costmodel.memory", "PredictedMemory"),
    "calibrate": ("mpkit.costmodel.calibration", "calibrate"),
    "plan": ("mpkit.costmodel.plan", "plan"),
    "LayoutTable": ("mpkit.costmodel.plan", "LayoutTable"),
    "Transformer": ("mpkit.costmodel.shapes", "Transformer"),
    "MODELS": ("mpkit.costmodel.shapes", "MODELS"),
    "whatif": ("mpkit.widgets.whatif", "whatif"),
    "planner": ("mpkit.widgets.planwidget", "planner"),
    "checkpoint_interval": ("mpkit.widgets.checkpoint_interval", "checkpoint_interval"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr('mpkit.sim', _LAZY, globals())

