"""``mpkit.sim.whatif``: sliders over the cost model, redrawing the predicted timeline and memory.

The logic lives in ``WhatIf`` (values in, ``Prediction`` out) so tests drive it headlessly by
setting slider values; the widget is only its view. A combination the strategy refuses (say,
micro-batches that do not divide the batch) shows the ValueError's text in the status line and
keeps the last good picture.
"""
from __future__ import annotations

import ipywidgets as w
from IPython.display import display

from mpkit import plot
from mpkit.simulator.hardware import PRESETS
from mpkit.simulator.machines import get_hardware
from mpkit.costmodel.prediction import predict


class WhatIf:
    """Controls -> ``predict`` -> plots. ``prediction`` is the latest good one; ``status`` its text."""

    def __init__(self, strategy="pp", hardware="cpu-sim", model="mlp", batch_size=32, draw=True, **options):
        self.strategy, self.model, self.batch_size, self.options = strategy, model, batch_size, options
        self.draw = draw
        base = get_hardware(hardware)
        self.controls = {
            "world_size": w.IntSlider(value=4, min=1, max=16, description="world size"),
            "micro_batches": w.IntSlider(value=options.pop("micro_batches", 4), min=1, max=32,
                                         description="micro-batches", disabled=strategy != "pp"),
            "bandwidth": w.FloatLogSlider(value=base.p2p.bandwidth / 1e9, base=10, min=-1, max=3, step=0.05,
                                          description="GB/s"),
            "hidden": w.IntSlider(value=options.pop("hidden", 64), min=16, max=1024, step=16, description="hidden"),
            "layers": w.IntSlider(value=options.pop("layers", 4), min=1, max=32, description="layers"),
            "hardware": w.Dropdown(options=list(PRESETS), value=hardware if isinstance(hardware, str) else "cpu-sim",
                                   description="hardware"),
        }
        self.status = w.HTML()
        self.output = w.Output()
        self.prediction = None
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self.update()

    def _changed(self, change):
        if change["owner"] is self.controls["hardware"]:  # a new machine starts at its own bandwidth
            bw = self.controls["bandwidth"]
            bw.unobserve(self._changed, names="value")
            bw.value = get_hardware(change["new"]).p2p.bandwidth / 1e9
            bw.observe(self._changed, names="value")
        self.update()

    def arguments(self) -> dict:
        c = self.controls
        options = dict(self.options, hidden=c["hidden"].value, layers=c["layers"].value)
        if self.strategy == "pp":
            options["micro_batches"] = c["micro_batches"].value
        hw = get_hardware(c["hardware"].value).with_bandwidth(c["bandwidth"].value)
        return dict(strategy=self.strategy, hardware=hw, world_size=c["world_size"].value, model=self.model,
                    batch_size=self.batch_size, **options)

    def update(self):
        """Recompute from the controls; redraw if drawing. Returns the prediction (or None)."""
        try:
            self.prediction = predict(**self.arguments())
        except ValueError as exc:
            self.status.value = f"<span style='color:#C44E52'>{exc}</span>"
            return None
        p = self.prediction
        self.status.value = (f"step {p.step_time * 1e3:.3f} ms — compute {p.breakdown['compute'] * 1e3:.3f}, "
                             f"comm {p.breakdown['comm'] * 1e3:.3f}, bubble {p.breakdown['bubble'] * 1e3:.3f} ms")
        if self.draw:
            self._redraw()
        return p

    def _redraw(self):
        self.output.clear_output(wait=True)
        with self.output:
            # mpkit.plot returns plain Figures (not pyplot's), which plt.show() does not know about
            for fig in (plot.timeline(self.prediction), plot.memory(self.prediction)):
                display(fig)

    @property
    def widget(self) -> w.Widget:
        c = self.controls
        return w.VBox([w.HBox([c["hardware"], c["world_size"], c["micro_batches"]]),
                       w.HBox([c["bandwidth"], c["hidden"], c["layers"]]), self.status, self.output])


def whatif(strategy="pp", hardware="cpu-sim", model="mlp", batch_size=32, **options) -> w.Widget:
    """The what-if widget for ``strategy``; the ``WhatIf`` behind it is ``widget.whatif``."""
    state = WhatIf(strategy, hardware, model, batch_size, **options)
    box = state.widget
    box.whatif = state
    return box
