"""Layer 12 (ARCHITECTURE.md): ipywidgets over the cost model (``whatif``, the ``planner`` in
``planwidget``). Public names: ``mpkit.sim.whatif``, ``mpkit.sim.planner``."""
