"""Layer 4 (ARCHITECTURE.md): the one discrete-event simulator of per-rank instruction lists
(``engine``), the closed-form formulas, and machines with their prices (``hardware``, ``machines``).
Torch-free, below the runtime, so the mechanisms and the planner share it. Public names: ``mpkit.sim``."""
