"""What the widgets with a language toggle share: any control's change updates the widget, and the
language toggle relabels the controls first (``Planner``, ``IntervalChoice``)."""
from __future__ import annotations


class LanguageControls:
    """For a widget with ``self.controls`` (one of them ``"lang"``), ``_label()`` and ``update()``."""

    def _watch(self) -> None:
        """Label the controls, follow every change, and compute the first result."""
        self._label()
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self.update()

    def _changed(self, change) -> None:
        if change["owner"] is self.controls["lang"]:
            self._label()
        self.update()
