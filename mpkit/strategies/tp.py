"""Tensor parallel (Megatron-LM, tp size = world_size): every rank holds a slice of every big
matrix and all ranks work on the same batch at the same time.

gpt: in each block, attention's qkv is column-parallel BY HEADS (rank r computes q, k, v of its
heads only; attention is independent per head, so no communication inside) and proj is
row-parallel; the MLP's up is column-parallel (GeLU is elementwise) and down row-parallel. That
is 2 all-reduces per block forward (g after proj and down) and 2 backward (f before qkv and up).

Embeddings, LayerNorms, the head and the row-parallel biases are replicated. Their gradients
agree on all ranks without any gradient all-reduce: they see identical inputs (every g ends
with the full, summed activation) and identical output gradients (every f sums the partial
input gradients), so every rank computes the same gradient and takes the same Adam step.

mlp: consecutive DenseReLU layers pair up as column -> row (ReLU between is elementwise); with an
odd number of layers the last one (the classifier) stays replicated.

Every rank builds the full model from the seed and keeps its slice, so the weights equal the
single-device model's exactly; ``params`` gathers the slices back into the single layout.
"""
from __future__ import annotations

from mpkit.models import Block, build_model
from mpkit.strategies.common import RankOutput, make_optimizer, train_full_batch
from mpkit.strategies.tp_layers import ColumnParallelLinear, RowParallelLinear, contiguous_split, head_split

OPTIONS = {}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate(cfg):
    m, t = cfg.model, cfg.world_size
    if m.kind == "gpt":
        # heads % t implies the other two for this model (hidden = heads·head_dim), but each is a
        # separate requirement of the split, so each gets its own message.
        checks = [("heads", m.heads, "attention is split by whole heads"),
                  ("hidden", m.hidden, "proj's input features are split"),
                  ("4*hidden", 4 * m.hidden, "the MLP's 4·hidden features are split")]
    elif m.layers >= 2:
        checks = [("hidden", m.hidden, "each column/row pair splits the hidden features")]
    else:
        checks = []
    for name, value, why in checks:
        if value % t:
            raise ValueError(f"tp size world_size={t} does not divide {name}={value} ({why}); "
                             f"use world_size in {_divisors(value)}")


def parallelize(model, rank: int, world_size: int, comm) -> dict:
    """Replace the model's big Linears by this rank's column/row slices, in place.
    Returns {dotted module name: sharded layer}."""
    cfg, layers, sharded = model.cfg, model.layers, {}

    def swap(parent, attr, cls, indices, name):
        sharded[name] = cls(getattr(parent, attr), indices, rank, comm, name)
        setattr(parent, attr, sharded[name])

    if cfg.kind == "gpt":
        h = cfg.hidden
        for i, block in enumerate(layers):
            if isinstance(block, Block):
                swap(block.attn, "qkv", ColumnParallelLinear, head_split(h, world_size), f"layers.{i}.attn.qkv")
                swap(block.attn, "proj", RowParallelLinear, contiguous_split(h, world_size), f"layers.{i}.attn.proj")
                block.attn.heads //= world_size  # its forward now views the local qkv as its own heads
                swap(block.mlp, "up", ColumnParallelLinear, contiguous_split(4 * h, world_size), f"layers.{i}.mlp.up")
                swap(block.mlp, "down", RowParallelLinear, contiguous_split(4 * h, world_size), f"layers.{i}.mlp.down")
    else:
        for i in range(0, len(layers) - 1, 2):
            split = contiguous_split(layers[i].fc.out_features, world_size)
            swap(layers[i], "fc", ColumnParallelLinear, split, f"layers.{i}.fc")
            swap(layers[i + 1], "fc", RowParallelLinear, split, f"layers.{i + 1}.fc")
    return sharded


def full_params(model, sharded) -> dict:
    """{single-model name: full tensor}; sharded tensors are all-gathered (every rank calls this)."""
    out = {}
    for name, param in model.named_parameters():
        module_name, _, param_name = name.rpartition(".")
        layer = sharded.get(module_name)
        out[name] = layer.gather(param_name) if layer is not None else param.detach().clone()
    return out


def all_reduce_counts(events, step=0) -> dict:
    """All-reduces of one step by direction, from this rank's trace (f: backward, g: forward)."""
    names = [e.name for e in events if e.kind == "all_reduce" and e.step == step]
    return {"forward": sum(n.startswith("g forward") for n in names),
            "backward": sum(n.startswith("f backward") for n in names)}


def run_rank(ctx, cfg):
    model = build_model(cfg.model, cfg.seed)
    sharded = parallelize(model, ctx.rank, ctx.world_size, ctx.comm)
    model = model.to(ctx.device)
    losses = train_full_batch(ctx, cfg, model, make_optimizer(model.parameters(), cfg))
    return RankOutput(losses=losses, params=full_params(model, sharded), extra={
        "parameters_per_rank": sum(p.numel() for p in model.parameters()),
        "sharded_layers": list(sharded),
        "all_reduces_per_step": all_reduce_counts(ctx.trace.events),
    })
