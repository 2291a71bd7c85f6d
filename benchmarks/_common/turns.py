"""Side-by-side timing on a noisy machine: the compared measurements take turns, so load that comes
and goes hits them alike and their ratio is the cost of what differs between them."""
from __future__ import annotations

import statistics
from typing import Callable


def medians_taking_turns(measurements: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """{label: median of ``rounds`` results of ``measurements[label]()``}. Every round calls each once,
    in the given order on even rounds and reversed on odd ones, so none always runs first."""
    results = {label: [] for label in measurements}
    for r in range(rounds):
        labels = list(measurements)[:: 1 if r % 2 == 0 else -1]
        for label in labels:
            results[label].append(measurements[label]())
    return {label: statistics.median(values) for label, values in results.items()}
