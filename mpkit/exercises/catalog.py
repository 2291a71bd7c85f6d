"""Every exercise, in teaching order: the lab that teaches it, its stub, hints and cases."""
from __future__ import annotations

from mpkit.exercises import (accumulation, checkpointing, collectives, data_parallel, faults, fsdp, halving_doubling,
                             layout, long_sequences, loss_scaling, model_parallel, pipeline, pipeline_bubble, stage_split,
                             tensor_parallel, zero)

MODULES = (data_parallel, model_parallel, stage_split, tensor_parallel, pipeline, pipeline_bubble, collectives,
           halving_doubling, zero, fsdp, accumulation, loss_scaling, checkpointing, layout, long_sequences, faults)
EXERCISES = {ex.name: ex for module in MODULES for ex in module.EXERCISES}


def get(name: str):
    if name not in EXERCISES:
        raise ValueError(f"exercise {name!r} is unknown; use one of: {', '.join(EXERCISES)}")
    return EXERCISES[name]


def by_lab(lab: str) -> list:
    """The exercises lab ``lab`` ("01", "05", ...) carries, in order."""
    return [ex for ex in EXERCISES.values() if ex.lab == lab]
