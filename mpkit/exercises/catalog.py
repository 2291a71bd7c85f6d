"""Every exercise, in teaching order: the lab that teaches it, its stub, hints and cases."""
from __future__ import annotations

from mpkit.exercises import (checkpoint, collectives, data_parallel, layout, model_parallel, pipeline, tensor_parallel,
                             zero)

EXERCISES = {ex.name: ex for module in (data_parallel, model_parallel, tensor_parallel, pipeline, collectives, zero, layout,
                                        checkpoint) for ex in module.EXERCISES}


def get(name: str):
    if name not in EXERCISES:
        raise ValueError(f"exercise {name!r} is unknown; use one of: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def by_lab(lab: str) -> list:
    """The exercises lab ``lab`` ("01", "05", ...) carries, in order."""
    return [ex for ex in EXERCISES.values() if ex.lab == lab]
