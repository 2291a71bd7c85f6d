"""``mpkit.sim``: the cost model. Closed-form formulas, hardware presets (``cpu-sim`` measured
here, GPU machines from datasheets), and ``predict`` — step time, breakdown, per-rank memory and
a predicted timeline that ``mpkit.plot`` draws like a measured one. ``whatif`` is the widget."""
from mpkit.sim import formulas
from mpkit.sim.hardware import GPU_PRESETS, PRESETS, Hardware, Link, get_hardware
from mpkit.sim.predict import Prediction, predict


def whatif(*args, **kwargs):
    """The interactive what-if widget (imports ipywidgets only when called)."""
    from mpkit.sim.whatif import whatif as _whatif

    return _whatif(*args, **kwargs)


__all__ = ["formulas", "Hardware", "Link", "PRESETS", "GPU_PRESETS", "get_hardware", "predict", "Prediction",
           "whatif"]
