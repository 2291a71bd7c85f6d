"""The option checks several strategies share, each run in the caller before any rank starts: a
``ValueError`` that names the option and says what to pass. Kept here, not in one strategy that
the others import, so no strategy module imports another (``tests/test_layers.py``)."""
from __future__ import annotations

from mpkit.models import ModelConfig
from mpkit.parallel.context_parallel import ATTENTION
from mpkit.parallel.pipeline import check_every_rank_trains, check_no_tie_across_ranks
from mpkit.parallel.pipeline.schedules import placement
from mpkit.strategies.base import require_divisible
from mpkit.strategies.loop import all_stages

FLAGS = {"overlap": "True (all-reduce buckets during backward) or False (after backward)",
         "find_unused_parameters": "True (some steps leave parameters without a gradient) or False"}


def validate_batch(cfg, parts: int | None = None, name: str = "world_size") -> None:
    """Every data-parallel replica trains on an equal slice of the global batch."""
    require_divisible(cfg.batch_size, cfg.world_size if parts is None else parts, "batch_size", name,
                      "every rank trains on an equal slice of the global batch" if parts is None else
                      "every data-parallel replica trains on an equal slice of the global batch")


def check_flags(cfg, *names) -> None:
    """A ValueError for an option of ``FLAGS`` that is not a bool (``'no'`` would read as True)."""
    for name in names:
        if not isinstance(cfg.option(name), bool):
            raise ValueError(f"{name}={cfg.option(name)!r} must be {FLAGS[name]}")


def require_gpt(cfg, why: str) -> None:
    if not cfg.model.builtin or cfg.model.kind != "gpt":
        raise ValueError(f"strategy={cfg.strategy!r} runs on the built-in gpt ({why}); use model='gpt'")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate_tp_size(m: ModelConfig, t: int, name: str) -> None:
    """ValueError unless a tensor-parallel size ``t`` splits the built-in model ``m`` evenly."""
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
    for size, value, why in checks:
        if value % t:
            raise ValueError(f"tp size {name}={t} does not divide {size}={value} ({why}); "
                             f"use {name} in {_divisors(value)}")


def check_cp(m: ModelConfig, cp: int, attention: str, name: str = "world_size") -> None:
    """ValueError unless ``cp`` ranks can split the built-in gpt ``m``'s sequence (and heads, for Ulysses)."""
    if attention not in ATTENTION:
        raise ValueError(f"attention={attention!r} is unknown; use one of {', '.join(ATTENTION)}")
    if m.seq_len % (2 * cp):
        raise ValueError(f"seq_len={m.seq_len} cannot be cut into 2·{name}={2 * cp} equal chunks (the load-balanced "
                         f"causal split gives every rank two); use a seq_len that is a multiple of {2 * cp}")
    if attention == "ulysses" and m.heads % cp:
        raise ValueError(f"attention='ulysses' splits the heads over the ranks: heads={m.heads} is not divisible by "
                         f"{name}={cp}; use ring attention or a number of heads divisible by {cp}")


def check_stage_count(m: ModelConfig, stages: int, what: str) -> None:
    """ValueError when ``stages`` stages (each >= 1 layer) cannot be cut from the built-in model."""
    n = m.num_layers
    if stages > n:
        deeper = stages if m.kind == "mlp" else stages - 2  # gpt: layers blocks + embedding + head
        raise ValueError(f"{what}={stages} is more than the {n} layers of the model; use {what}<={n} "
                         f"or a deeper model (layers={deeper})")


def check_stages(cfg, count: int, what: str, schedule: str = "gpipe", ranks: int | None = None) -> None:
    """The model can be cut into ``count`` stages for ``ranks`` pipeline ranks: a built-in model
    has enough layers; a learner's model (built here, in the caller) gives every rank a layer
    with parameters and ties no weight across ranks."""
    if cfg.model.builtin:
        check_stage_count(cfg.model, count, what)
        return
    ranks = cfg.world_size if ranks is None else ranks
    stages = all_stages(cfg, count)
    layers = cfg.model.layers_of(cfg.model.build(cfg.seed))
    trained = [f"{i}: {type(layer).__name__}" for i, layer in enumerate(layers) if any(True for _ in layer.parameters())]
    # per rank, not per stage: under interleaving a rank holds stages r, r+p, ... (pipeline keeps
    # s % p), and a parameter-free stage there is fine if another of them trains
    where = placement(schedule, ranks, count // ranks)
    check_every_rank_trains(stages, ranks, f"the rule: the model's top-level layers are cut into {count} "
                            f"stages balanced by parameter count, and every rank needs a layer with parameters. "
                            f"This model has {len(trained)} ({', '.join(trained)}): use at most {len(trained)} "
                            f"stages, or put each activation inside a block with its layer, e.g. "
                            f"nn.Sequential(nn.Sequential(nn.Linear(...), nn.ReLU()), ...)", where)
    check_no_tie_across_ranks(stages, ranks, where)
