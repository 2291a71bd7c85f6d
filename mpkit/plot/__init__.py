"""``mpkit.plot``: timelines, memory bars/curves and bytes-on-the-wire charts from a run's own logs.

Every function takes ``lang="en"`` or ``lang="ko"`` and returns a matplotlib Figure, which a notebook
shows whether or not it is the cell's value, once (``style.new_figure``).
"""
from mpkit.plot.bubble import bubble
from mpkit.plot.breakdown import breakdown
from mpkit.plot.checkpoints import checkpoint_interval, restarts
from mpkit.plot.collectives import collectives
from mpkit.plot.comm import comm
from mpkit.i18n import LANGS
from mpkit.plot.memory import memory
from mpkit.plot.memory_time import memory_over_time
from mpkit.plot.side_by_side import timelines
from mpkit.plot.staleness import staleness
from mpkit.plot.style import save
from mpkit.plot.timeline import timeline

__all__ = ["timeline", "memory", "memory_over_time", "comm", "bubble", "breakdown", "timelines", "staleness", "collectives",
           "checkpoint_interval", "restarts", "save", "LANGS"]
