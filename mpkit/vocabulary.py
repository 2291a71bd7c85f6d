"""The names a user picks a pipeline schedule and a recomputation mode by, each defined once.

Torch-free, so the run's checks (``config``, ``parallel.pipeline``), the closed-form formulas
(``simulator.formulas``) and the planner (``costmodel``) read the same tuples; each says which of
the names it implements and refuses the others by name.
"""
from __future__ import annotations

# Pipeline schedules: every one runs (``mpkit.parallel.pipeline.schedules``) and is priced by playing its lists.
SCHEDULES = ("gpipe", "1f1b", "interleaved", "looped_bfs", "interleaved_zb", "zbv", "dualpipev")
# The first three also have a closed-form bubble and in-flight memory (Narayanan et al. 2021): the formulas and
# the cluster-scale planner take these.
CLOSED_FORM_SCHEDULES = SCHEDULES[:3]

# Activation recomputation: "none"; "selective" (the attention scores, Korthikanti et al. 2022); "full" (every
# layer's forward again); "op", torchtitan's op-level selective checkpointing (torchtitan/models/llama3/infra/
# parallelize.py, _save_list: keeps the attention kernel's output and every other matmul's output, recomputes the
# rest in backward), which only the planner prices (searched only when pinned). A run also takes None for "none".
RECOMPUTE = ("none", "selective", "full", "op")

__all__ = ["SCHEDULES", "CLOSED_FORM_SCHEDULES", "RECOMPUTE"]
