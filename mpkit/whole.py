"""``is_whole``: mpkit's one whole-number predicate. It lives here, torch-free, so the runtime,
``train``, ``sim.predict`` (through ``mpkit.config``, which re-exports it) and the closed-form
``sim.formulas`` (which a quiz kernel imports without torch) all ask the same question."""
from __future__ import annotations

import numbers


def is_whole(value) -> bool:
    """An integer (numpy's too) that is not a bool: ``steps=True`` is a mistake, not one step."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


__all__ = ["is_whole"]
