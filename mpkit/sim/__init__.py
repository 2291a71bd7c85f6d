"""``mpkit.sim``: the cost model. Closed-form formulas, hardware presets (``cpu-sim`` measured
here, GPU machines from datasheets), ``predict`` — step time, breakdown, per-rank memory and
a predicted timeline that ``mpkit.plot`` draws like a measured one — and ``plan``, which ranks
the dp x pp x tp layouts of a large transformer on a GPU cluster. ``whatif`` and ``planner`` are
the widgets."""
from mpkit.sim import formulas
from mpkit.sim.analytic import MODELS, Transformer
from mpkit.sim.hardware import GPU_PRESETS, MULTI_NODE, PRESETS, Hardware, Link, get_hardware
from mpkit.sim.plan import LayoutTable, plan
from mpkit.sim.predict import Prediction, predict


def whatif(*args, **kwargs):
    """The interactive what-if widget (imports ipywidgets only when called)."""
    from mpkit.sim.whatif import whatif as _whatif

    return _whatif(*args, **kwargs)


def planner(*args, **kwargs):
    """The layout-planner widget (imports ipywidgets only when called)."""
    from mpkit.sim.planwidget import planner as _planner

    return _planner(*args, **kwargs)


__all__ = ["formulas", "Hardware", "Link", "PRESETS", "GPU_PRESETS", "MULTI_NODE", "get_hardware", "predict",
           "Prediction", "plan", "LayoutTable", "Transformer", "MODELS", "whatif", "planner"]
