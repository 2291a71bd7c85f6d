"""``mpkit.sim.checkpoint_interval``: how often to checkpoint, as sliders (lab 12).

The save time δ, the mean time between failures M, the restart time R and a chosen interval τ in;
the expected waste (Daly 2006), the work a failure loses on average (τ/2) and Young's and Daly's
optima out, with ``mpkit.plot.checkpoint_interval`` redrawn. The numbers live in
``IntervalChoice`` (values in, numbers out), which tests drive headlessly; the widget is its view.
Defaults: a 2-minute save and Llama 3 405B's failure rate (419 unexpected interruptions in 54 days:
one every 3.1 hours, ``sim.formulas.mtbf_of``).
"""
from __future__ import annotations

import html

import ipywidgets as w
from IPython.display import display

from mpkit.widgets.controls import LanguageControls
from mpkit.i18n import LANG_LABELS, LANGS, check_lang, t
from mpkit.plot.checkpoints import checkpoint_interval as draw_interval, duration
from mpkit.simulator.formulas import daly_interval, mtbf_of, waste_fraction, young_interval

LLAMA3_MTBF_HOURS = mtbf_of(419, 54) / 3600


class IntervalChoice(LanguageControls):
    """Controls (δ in s, M in h, R and τ in min) -> the numbers the status line shows."""

    def __init__(self, checkpoint=120.0, mtbf_hours=LLAMA3_MTBF_HOURS, restart_minutes=10.0, interval_minutes=None,
                 lang="ko", draw=True):
        check_lang(lang)
        self.draw = draw
        young = young_interval(checkpoint, mtbf_hours * 3600) / 60
        self.controls = {
            "checkpoint": w.FloatLogSlider(value=checkpoint, base=10, min=0, max=3.5, step=0.05),
            "mtbf": w.FloatLogSlider(value=mtbf_hours, base=10, min=-1, max=3, step=0.05),
            "restart": w.FloatSlider(value=restart_minutes, min=0, max=60, step=1),
            "interval": w.FloatLogSlider(value=interval_minutes or young, base=10, min=-0.5, max=3.5, step=0.02),
            "lang": w.ToggleButtons(options=[(LANG_LABELS[code], code) for code in LANGS], value=lang),
        }
        self.status = w.HTML()
        self.output = w.Output()
        self.numbers = {}
        self._watch()

    def _label(self):
        lang = self.controls["lang"].value
        for key in ("checkpoint", "mtbf", "restart", "interval"):
            self.controls[key].description = t(f"ckpt_w_{key}", lang)

    def seconds(self) -> dict:
        c = self.controls
        return {"checkpoint": c["checkpoint"].value, "mtbf": c["mtbf"].value * 3600,
                "restart": c["restart"].value * 60, "interval": c["interval"].value * 60}

    def update(self) -> dict:
        """The numbers for the current controls (seconds and fractions); redraws if drawing."""
        s = self.seconds()
        young, daly = young_interval(s["checkpoint"], s["mtbf"]), daly_interval(s["checkpoint"], s["mtbf"])
        self.numbers = {**s, "young": young, "daly": daly, "lost_per_failure": s["interval"] / 2,
                        "waste": waste_fraction(s["interval"], s["checkpoint"], s["mtbf"], s["restart"]),
                        "best_waste": waste_fraction(daly, s["checkpoint"], s["mtbf"], s["restart"])}
        n, lang = self.numbers, self.controls["lang"].value
        self.status.value = html.escape(t("ckpt_w_status", lang, interval=duration(n["interval"]), waste=n["waste"],
                                          lost=duration(n["lost_per_failure"]), restart=duration(n["restart"]),
                                          young=duration(young), daly=duration(daly), best=n["best_waste"]))
        if self.draw:
            self.output.clear_output(wait=True)
            with self.output:
                display(draw_interval(s["checkpoint"], s["mtbf"], s["restart"], s["interval"], lang))
        return self.numbers

    @property
    def widget(self) -> w.Widget:
        c = self.controls
        return w.VBox([w.HBox([c["checkpoint"], c["mtbf"]]), w.HBox([c["restart"], c["interval"], c["lang"]]),
                       self.status, self.output])


def checkpoint_interval(checkpoint=120.0, mtbf_hours=LLAMA3_MTBF_HOURS, restart_minutes=10.0, interval_minutes=None,
                        lang="ko") -> w.Widget:
    """The checkpoint-interval widget; the ``IntervalChoice`` behind it is ``widget.choice``."""
    state = IntervalChoice(checkpoint, mtbf_hours, restart_minutes, interval_minutes, lang)
    box = state.widget
    box.choice = state
    return box
