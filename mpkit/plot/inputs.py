"""Accept what students have at hand: a Run, a Trace, a cost-model prediction, or several runs."""
from __future__ import annotations

from collections import Counter

_TRACE_HINT = "pass a Run (mpkit.train), a Trace, or anything with a .trace (e.g. an mpkit.sim prediction)"
_RUNS_HINT = ("pass a Run (mpkit.train), what mpkit.launch returned, a list of MemoryReports, a list of Runs, "
              "or a dict {label: Run} to compare runs side by side")


def as_trace(obj, name="run_or_trace"):
    """The Trace inside ``obj`` (itself if it is one)."""
    if hasattr(obj, "events") and hasattr(obj, "ranks"):
        return obj
    trace = getattr(obj, "trace", None)
    if trace is not None and hasattr(trace, "events"):
        return trace
    raise ValueError(f"{name}: got {type(obj).__name__}; {_TRACE_HINT}")


def select_step(trace, step, name):
    """The events of one optimizer step (all of them for ``step=None``)."""
    if step is None:
        return trace
    selected = trace.filter(step=step)
    if not selected.events:
        steps = sorted({e.step for e in trace.events if e.step is not None})
        raise ValueError(f"{name} has no events of step={step!r}; pass one of {steps} or step=None")
    return selected


def _is_report(obj) -> bool:
    return hasattr(obj, "max_by_category") and hasattr(obj, "peak_total")


def reports_of(run, name="run"):
    """The per-rank MemoryReports of a Run (or of a plain list of them)."""
    if isinstance(run, (list, tuple)) and run and all(map(_is_report, run)):
        return list(run)
    memory = getattr(run, "memory", None)
    if isinstance(memory, (list, tuple)) and memory and all(map(_is_report, memory)):
        return list(memory)
    raise ValueError(f"{name}: got {type(run).__name__} without per-rank memory reports; {_RUNS_HINT}")


def _labels(runs) -> list[str]:
    """Strategy names, made unique by the options that differ (``pp schedule=1f1b``)."""
    labels = [getattr(r, "strategy", "") or f"run {i}" for i, r in enumerate(runs)]
    counts = Counter(labels)
    for i, run in enumerate(runs):
        if counts[labels[i]] > 1:
            twins = [r for r in runs if getattr(r, "strategy", None) == getattr(run, "strategy", None)]
            options = getattr(getattr(run, "config", None), "options", {}) or {}
            differ = [k for k, v in options.items()
                      if any(getattr(getattr(t, "config", None), "options", {}).get(k) != v for t in twins)]
            labels[i] = " ".join([labels[i], *(f"{k}={options[k]}" for k in differ)])
    counts = Counter(labels)
    return [f"{label} #{i}" if counts[label] > 1 else label for i, label in enumerate(labels)]


def as_runs(obj, name="run_or_runs") -> list[tuple[str, list]]:
    """[(label, per-rank MemoryReports), ...] for one run, a list of runs or a dict of runs."""
    if isinstance(obj, dict):
        if not obj:
            raise ValueError(f"{name}: the dict is empty; {_RUNS_HINT}")
        return [(str(k), reports_of(v, f"{name}[{k!r}]")) for k, v in obj.items()]
    # mpkit.launch's result: a list (fn's return values) that carries .memory, one report per rank
    launched = isinstance(obj, list) and isinstance(getattr(obj, "memory", None), list)
    if isinstance(obj, (list, tuple)) and obj and not launched and not all(map(_is_report, obj)):
        return list(zip(_labels(obj), (reports_of(r, f"{name}[{i}]") for i, r in enumerate(obj))))
    if launched:
        return [("", reports_of(obj, name))]
    return [(_labels([obj])[0] if not isinstance(obj, (list, tuple)) else "", reports_of(obj, name))]
