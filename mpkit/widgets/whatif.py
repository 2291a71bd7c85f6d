"""``mpkit.sim.whatif``: sliders over the cost model, redrawing the predicted timeline and memory.

The logic lives in ``WhatIf`` (values in, ``Prediction`` out) so tests drive it headlessly by
setting slider values; the widget is only its view. A combination the strategy refuses (say,
micro-batches that do not divide the batch) shows the ValueError's text in the status line and
keeps the last good picture. Labels, status line and plots are in Korean or English (``lang``, a
control like the planner's).
"""
from __future__ import annotations

import html

import ipywidgets as w
from IPython.display import display

from mpkit import plot
from mpkit.i18n import LANG_LABELS, LANGS, check_lang, t
from mpkit.simulator.hardware import PRESETS
from mpkit.simulator.machines import get_hardware
from mpkit.costmodel.prediction import predict


class WhatIf:
    """Controls -> ``predict`` -> plots. ``prediction`` is the latest good one; ``status`` its text."""

    def __init__(self, strategy="pp", hardware="cpu-sim", model="mlp", batch_size=32, draw=True, lang="ko", **options):
        self.strategy, self.model, self.batch_size, self.options = strategy, model, batch_size, options
        self.draw = draw
        base = get_hardware(hardware)
        self.controls = {
            "world_size": w.IntSlider(value=4, min=1, max=16),
            "micro_batches": w.IntSlider(value=options.pop("micro_batches", 4), min=1, max=32,
                                         disabled=strategy != "pp"),
            "bandwidth": w.FloatLogSlider(value=base.p2p.bandwidth / 1e9, base=10, min=-1, max=3, step=0.05),
            "hidden": w.IntSlider(value=options.pop("hidden", 64), min=16, max=1024, step=16),
            "layers": w.IntSlider(value=options.pop("layers", 4), min=1, max=32),
            "hardware": w.Dropdown(options=list(PRESETS), value=hardware if isinstance(hardware, str) else "cpu-sim"),
            "lang": w.ToggleButtons(options=[(LANG_LABELS[code], code) for code in LANGS], value=check_lang(lang)),
        }
        self.status = w.HTML()
        self.output = w.Output()
        self.prediction = None
        self._label()
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self.update()

    @property
    def lang(self) -> str:
        return self.controls["lang"].value

    def _label(self):
        for key in ("world_size", "micro_batches", "bandwidth", "hidden", "layers", "hardware"):
            self.controls[key].description = t(f"whatif_{key}", self.lang)

    def _changed(self, change):
        if change["owner"] is self.controls["lang"]:
            self._label()
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
            self.status.value = (f"<span style='color:#C44E52'>"
                                 f"{html.escape(t('whatif_refused', self.lang, error=exc))}</span>")
            return None
        p = self.prediction
        self.status.value = html.escape(t("whatif_status", self.lang, step=p.step_time * 1e3,
                                          **{part: p.breakdown[part] * 1e3 for part in ("compute", "comm", "bubble")}))
        if self.draw:
            self._redraw()
        return p

    def _redraw(self):
        self.output.clear_output(wait=True)
        with self.output:  # shown here, in the widget, each time the controls change
            for fig in (plot.timeline(self.prediction, lang=self.lang), plot.memory(self.prediction, lang=self.lang)):
                display(fig)

    @property
    def widget(self) -> w.Widget:
        c = self.controls
        return w.VBox([w.HBox([c["hardware"], c["world_size"], c["micro_batches"]]),
                       w.HBox([c["bandwidth"], c["hidden"], c["layers"]]), c["lang"], self.status, self.output])


def whatif(strategy="pp", hardware="cpu-sim", model="mlp", batch_size=32, lang="ko", **options) -> w.Widget:
    """The what-if widget for ``strategy`` in Korean or English (``lang``, also a control, as the
    planner's); the ``WhatIf`` behind it is ``widget.whatif``."""
    state = WhatIf(strategy, hardware, model, batch_size, lang=lang, **options)
    box = state.widget
    box.whatif = state
    return box
