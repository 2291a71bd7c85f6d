"""The parallel plans of mpkit's built-in models: the data ``parallelize`` reads to split them.

A plan names modules of the whole model (``fnmatch`` patterns): which ``nn.Linear`` layers tensor
parallelism splits by column or row (Megatron's plan), which modules are the sequence-parallel
regions (``blocks``), which hold the attention core context parallelism swaps
(``attention_modules``), where the sequence enters (``sequence_start``: its output is the
[batch, seq, hidden] activation) and where it leaves (``sequence_end``: its input is gathered back
for sequence parallelism). A learner's own model brings the same names for its own modules.

gpt: in each block, attention's ``qkv`` is column-parallel BY HEADS (rank r computes q, k, v of
its heads only; attention is independent per head) and ``proj`` row-parallel; the MLP's ``up`` is
column-parallel (GeLU is elementwise) and ``down`` row-parallel; in a mixture of experts each
expert's ``up``/``down`` the same (Megatron's expert tensor parallelism equal to tp), the router
replicated. That is 2 all-reduces per block forward and 2 backward. Embeddings, LayerNorms, the
head and the row-parallel biases stay replicated.

mlp: consecutive DenseReLU layers pair up as column -> row (ReLU between is elementwise); with an
odd number of layers the last one (the classifier) stays replicated.
"""
from __future__ import annotations

from mpkit.models import ModelConfig
from mpkit.parallel.tensor_parallel import Split, head_split, tensor_parallel


def megatron_plan(cfg: ModelConfig, tp: int) -> dict:
    """The tensor-parallel plan of a built-in model split over ``tp`` ranks: {layer pattern: split}."""
    if cfg.kind == "gpt":
        mlp = ("layers.*.mlp.experts.*.up", "layers.*.mlp.experts.*.down") if cfg.experts else (
            "layers.*.mlp.up", "layers.*.mlp.down")
        return {"layers.*.attn.qkv": Split("column", tuple(head_split(cfg.hidden, tp))),
                "layers.*.attn.proj": "row", mlp[0]: "column", mlp[1]: "row"}
    plan = {}
    for i in range(0, cfg.layers - 1, 2):
        plan[f"layers.{i}.fc"], plan[f"layers.{i + 1}.fc"] = "column", "row"
    return plan


def builtin_structure(cfg: ModelConfig, tp: int) -> dict:
    """The ``Plan`` fields that name a built-in model's modules (see the module docstring)."""
    plan = megatron_plan(cfg, tp) if tp > 1 else {}
    if cfg.kind != "gpt":
        return {"tp": plan}
    last = cfg.num_layers - 1  # layers: embedding, the blocks, the head
    return {"tp": plan, "blocks": tuple(f"layers.{i}" for i in range(1, last)), "attention_modules": ("layers.*.attn",),
            "sequence_start": "layers.0", "sequence_end": f"layers.{last}"}


def split_builtin(model, rank: int, tp: int, group=None):
    """Swap a built-in model's big Linears for rank ``rank``'s slices of ``tp``, in place (what the
    cost model profiles, with ``rank=0`` and no group). Returns ``model``."""
    plan = megatron_plan(model.cfg, tp)
    if plan:
        tensor_parallel(model, plan, group, rank=rank, world_size=tp)
    return model


__all__ = ["megatron_plan", "builtin_structure", "split_builtin"]
