"""``is_whole`` and ``is_number``: mpkit's one whole-number and one real-number predicate. They
live here, torch-free, so the runtime, ``train`` and ``sim.predict`` (through ``mpkit.config``, which
re-exports them), the planner's model sizes (``costmodel.analytic``) and the closed-form ``sim.formulas``
(which a quiz kernel imports without torch) all ask the same question."""
from __future__ import annotations

import numbers


def is_whole(value) -> bool:
    """An integer (numpy's too) that is not a bool: ``steps=True`` is a mistake, not one step."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A real number, numpy's included (np.int64 and np.float32 are no int or float), not a bool:
    ``lr=True`` is a mistake, not a learning rate of 1."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


__all__ = ["is_whole", "is_number"]
