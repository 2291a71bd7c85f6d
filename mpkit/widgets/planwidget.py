"""``mpkit.sim.planner``: the layout planner as a widget (model, hardware, GPUs, global batch,
pins of tp / ZeRO / recomputation / context and expert parallelism, and the software's sequence
parallelism, flash attention, fused kernels and CP's K/V exchange ->
the ranked table, what it assumed, and the explanation), for lab 10.

The logic lives in ``Planner`` (control values in, ``LayoutTable`` out) so tests drive it headlessly
by setting values; the widget is only its view. Input the planner refuses (GPUs that are not whole
nodes, a batch no layout divides, an unknown preset) shows the ValueError's text in the status line
and keeps the last good table.
"""
from __future__ import annotations

import html

import ipywidgets as w

from mpkit.widgets.controls import LanguageControls
from mpkit.i18n import LANG_LABELS, LANGS, t
from mpkit.costmodel.analytic import CP_ATTENTION
from mpkit.costmodel.shapes import MODELS
from mpkit.simulator.formulas import ZERO_STAGES
from mpkit.simulator.hardware import STACKS
from mpkit.simulator.hardware import GPU_PRESETS, MULTI_NODE
from mpkit.vocabulary import RECOMPUTE
from mpkit.costmodel.plan import plan

MODEL_CHOICES = (*MODELS, "7B", "13B", "70B")
HARDWARE_CHOICES = (*GPU_PRESETS, *MULTI_NODE)
PINS = {"tp": (1, 2, 4, 8, 16, 32), "zero": ZERO_STAGES, "recompute": RECOMPUTE,  # None: searched
        "cp": (1, 2, 4, 8, 16, 32), "ep": (1, 2, 4, 8, 16, 32),  # None: plan's "search"
        "stack": tuple(STACKS)}  # None: the hardware preset's fitted matmul efficiency
SWITCHES = ("sequence_parallel", "flash", "fused")  # the software's on/off assumptions (plan's keywords)


class Planner(LanguageControls):
    """Controls -> ``plan`` -> table and explanation. ``result`` is the latest good LayoutTable."""

    def __init__(self, model="gpt3-175b", hardware="Nx8xH100-ib", gpus=64, global_batch=1536, lang="ko", top=8,
                 tp=None, zero=None, recompute=None, sequence_parallel=True, flash=True, fused=True, stack=None, cp=1,
                 ep=1, attention="ring"):
        self.top = top
        pins = dict(tp=tp, zero=zero, recompute=recompute, cp=cp, ep=ep, stack=stack)
        for key, value in pins.items():
            if value is not None and (isinstance(value, bool) or value not in PINS[key]):
                raise ValueError(f"{key}={value!r}: the widget offers {', '.join(map(repr, PINS[key]))} or None "
                                 f"(searched); for other values call mpkit.sim.plan")
        if attention not in CP_ATTENTION:
            raise ValueError(f"attention={attention!r}: give one of {', '.join(map(repr, CP_ATTENTION))} (how the "
                             f"context-parallel ranks exchange keys and values)")
        self.controls = {
            "model": w.Combobox(value=str(model), options=list(MODEL_CHOICES), ensure_option=False),
            "hardware": w.Combobox(value=str(hardware), options=list(HARDWARE_CHOICES), ensure_option=False),
            "gpus": w.BoundedIntText(value=gpus, min=1, max=10**7),
            "global_batch": w.BoundedIntText(value=global_batch, min=1, max=10**8),
            **{key: w.Dropdown(options=[("auto", None), *((str(v), v) for v in PINS[key])], value=value)
               for key, value in pins.items()},
            **{key: w.Checkbox(value=bool(value))
               for key, value in zip(SWITCHES, (sequence_parallel, flash, fused))},
            "attention": w.Dropdown(options=list(CP_ATTENTION), value=attention),
            "lang": w.ToggleButtons(options=[(LANG_LABELS[code], code) for code in LANGS], value=lang),
        }
        self.status = w.HTML()
        self.table = w.HTML()
        self.explanation = w.HTML()
        self.result = None
        self._watch()

    def _label(self):
        lang = self.controls["lang"].value
        for key in ("model", "hardware", "gpus", "global_batch", *PINS, *SWITCHES, "attention"):
            self.controls[key].description = t(f"plan_w_{key}", lang)
        for key in PINS:  # "auto" reads as "search" in the chosen language (new options reset the value)
            control = self.controls[key]
            auto = "-" if key == "stack" else t("plan_w_auto", lang)
            value, control.options = control.value, [(auto, None), *control.options[1:]]
            control.value = value

    def arguments(self) -> dict:
        c = self.controls
        args = dict(model=c["model"].value.strip(), hardware=c["hardware"].value.strip(), gpus=c["gpus"].value,
                    global_batch=c["global_batch"].value, lang=c["lang"].value, top=self.top,
                    **{key: c[key].value for key in (*PINS, *SWITCHES, "attention")})
        return {**args, **{key: "search" for key in ("cp", "ep") if args[key] is None}}

    def update(self):
        """Plan from the controls and redraw; returns the LayoutTable (None if refused)."""
        lang = self.controls["lang"].value
        try:
            self.result = plan(**self.arguments())
        except ValueError as exc:
            self.status.value = f"<span style='color:#C44E52'>{html.escape(str(exc))}</span>"
            return None
        best = self.result.best
        self.status.value = html.escape(t("plan_w_status", lang, fit=len(self.result.rows),
                                          dropped=len(self.result.dropped), seconds=self.result.seconds))
        self.table.value = self.result._repr_html_()
        text = self.result.explain(lang) if best else self.result.to_text(lang)
        self.explanation.value = "<br><br>".join(html.escape(p) for p in text.split("\n\n"))
        return self.result

    @property
    def widget(self) -> w.Widget:
        c = self.controls
        return w.VBox([w.HBox([c["model"], c["hardware"]]), w.HBox([c["gpus"], c["global_batch"], c["lang"]]),
                       w.HBox([c["tp"], c["zero"], c["recompute"]]), w.HBox([c["cp"], c["ep"], c["attention"]]),
                       w.HBox([c["stack"], *(c[key] for key in SWITCHES)]),
                       self.status, self.table, self.explanation])


def planner(model="gpt3-175b", hardware="Nx8xH100-ib", gpus=64, global_batch=1536, lang="ko", top=8, *, tp=None,
            zero=None, recompute=None, sequence_parallel=True, flash=True, fused=True, stack=None, cp=1, ep=1,
            attention="ring") -> w.Widget:
    """The planner widget; the ``Planner`` behind it is ``widget.planner``. ``tp``, ``zero``,
    ``recompute``, ``cp`` and ``ep`` start pinned where given (None: searched; cp and ep are 1
    unless given), ``stack`` names the training software (None: the hardware preset's fitted matmul rate),
    ``sequence_parallel``, ``flash`` and ``fused`` (plan's keywords) on or off, ``attention`` CP's
    K/V exchange; each is a control."""
    state = Planner(model, hardware, gpus, global_batch, lang, top, tp=tp, zero=zero, recompute=recompute,
                    sequence_parallel=sequence_parallel, flash=flash, fused=fused, stack=stack, cp=cp, ep=ep,
                    attention=attention)
    box = state.widget
    box.planner = state
    return box
