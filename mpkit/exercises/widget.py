"""The exercise panel in a lab: a Check button and three hint levels, Korean or English.

Feedback goes into widget values (an HTML's value), never through ``print`` inside an Output, so
nbval's output comparison stays meaningful. ``get_fn`` is called at each click, so the panel
checks whatever the learner's cell defines now.
"""
from __future__ import annotations

import html

import ipywidgets as widgets

from mpkit.exercises.catalog import get
from mpkit.exercises.checker import check
from mpkit.i18n import check_lang

LABELS = {"check": {"ko": "확인", "en": "Check"}, "hint": {"ko": "힌트", "en": "Hint"},
          "levels": {"ko": ("방향", "공식", "구조"), "en": ("nudge", "formula", "structure")}}


def _pre(text: str) -> str:
    return f"<pre style='white-space: pre-wrap'>{html.escape(text)}</pre>"


def show(name: str, get_fn, lang: str = "ko") -> widgets.VBox:
    """A panel for exercise ``name``: Check runs ``check(name, get_fn())``; Hint 1-3 reveal the hints."""
    lang = check_lang(lang)
    exercise = get(name)
    if not callable(get_fn):
        raise TypeError(f"get_fn: pass a function that returns your {exercise.uses}, e.g. lambda: {exercise.target}")
    feedback = widgets.HTML(value="")
    check_button = widgets.Button(description=LABELS["check"][lang], button_style="primary")
    hint_buttons = [widgets.Button(description=f"{LABELS['hint'][lang]} {i + 1}: {LABELS['levels'][lang][i]}")
                    for i in range(3)]

    def on_check(_):
        feedback.value = _pre("…")
        feedback.value = _pre(check(name, get_fn(), lang=lang).message)

    def on_hint(level):
        def show_hint(_):
            feedback.value = _pre("\n\n".join(f"{i + 1}. {exercise.hints[i](lang)}" for i in range(level + 1)))
        return show_hint

    check_button.on_click(on_check)
    for level, button in enumerate(hint_buttons):
        button.on_click(on_hint(level))
    title = widgets.HTML(value=f"<b>{html.escape(exercise.title(lang))}</b>")
    return widgets.VBox([title, widgets.HBox([check_button, *hint_buttons]), feedback])
