"""Every exercise, in teaching order: the lab that teaches it, its stub, hints and cases."""
from __future__ import annotations

from mpkit.exercises import (collectives, data_parallel, layout, long_sequences, model_parallel, pipeline, stage_split,
                             tensor_parallel, zero)

MODULES = (data_parallel, model_parallel, stage_split, tensor_parallel, pipeline, collectives, zero, layout, long_sequences)
EXERCISES = {ex.name: ex for module in MODULES for ex in module.EXERCISES}


def get(name: str):
    if name not in EXERCISES:
        raise ValueError(f"exercise {name!r} is unknown; use one of: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def by_lab(lab: str) -> list:
    """The exercises lab ``lab`` ("01", "05", ...) carries, in order."""
    return [ex for ex in EXERCISES.values() if ex.lab == lab]
