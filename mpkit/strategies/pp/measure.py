"""The pipeline bubble measured from the trace, the way the formula counts it."""
from mpkit.observe.trace import Trace


def step_bubble(trace: Trace, step: int) -> float:
    """Share of rank-time not in forward/backward over one step's window (first forward to
    last backward on any rank). The optimizer is left out: (p-1)/(m+p-1) counts only the
    fill and drain of forwards and backwards."""
    events = [e for e in trace.events if e.step == step and e.kind in ("forward", "backward")]
    return Trace(events=events, enabled=False).bubble_share()
