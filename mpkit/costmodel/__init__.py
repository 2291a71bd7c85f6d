"""Layer 10 (ARCHITECTURE.md): the cost model over the strategies — ``prediction`` of a step, the
CPU model (``cpu``), ``memory`` per rank, the cpu-sim ``calibration``, and the cluster-scale planner
(``shapes`` of the transformers it prices, ``analytic``, ``plan``). Public names: ``mpkit.sim``."""
