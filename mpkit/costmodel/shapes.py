"""A decoder-only transformer by its shape, and the published models the planner is checked on.

The cluster-scale cost model (``analytic``) prices a step from these shapes alone: each property
below is one count a price reads (weights a token is multiplied with, parameters a rank holds,
the experts expert parallelism splits). ``transformer`` turns a preset name, a size or a dict into one.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from functools import cached_property

from mpkit.simulator import formulas
from mpkit.whole import is_number


@dataclass(frozen=True)
class Transformer:
    """A decoder-only transformer by its shape. ``ffn``: MLP width (4·hidden if None);
    ``kv_heads``: key/value heads (fewer than ``heads`` = grouped-query attention);
    ``gated``: SwiGLU-style MLP (three matrices); ``bias``/``dropout``: GPT-style linear biases
    and dropout masks; ``tied``: output layer shares the embedding; ``learned_positions``: a
    position-embedding table (GPT) rather than rotary/ALiBi. ``experts`` > 1: a mixture of experts
    in every ``moe_every``-th layer's MLP, each token routed to ``top_k`` of them (a router of
    hidden x experts weights); a layer's price is the average over dense and MoE layers."""

    layers: int
    hidden: int
    heads: int
    seq_len: int = 2048
    vocab: int = 51200
    ffn: int | None = None
    kv_heads: int | None = None
    gated: bool = False
    bias: bool = True
    dropout: bool = True
    tied: bool = True
    learned_positions: bool = True
    name: str = ""
    experts: int = 1
    top_k: int = 1
    moe_every: int = 1

    def __post_init__(self):
        for key in ("layers", "hidden", "heads", "seq_len", "vocab", "experts", "top_k", "moe_every"):
            whole_number(key, getattr(self, key))
        for key in ("ffn", "kv_heads"):
            if getattr(self, key) is not None:
                whole_number(key, getattr(self, key))
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; pick hidden as a "
                             f"multiple of heads")
        if self.heads % self.kv:
            raise ValueError(f"kv_heads={self.kv} does not divide heads={self.heads}")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} is more than experts={self.experts}: a token is routed to top_k of "
                             f"the experts; choose top_k <= experts")

    @cached_property
    def ffn_hidden(self) -> int:
        return self.ffn or 4 * self.hidden

    @cached_property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @cached_property
    def kv_hidden(self) -> int:
        return self.hidden // self.heads * self.kv

    @cached_property
    def moe_share(self) -> float:
        """The share of layers whose MLP is a mixture of experts (0 for a dense model)."""
        return 1 / self.moe_every if self.experts > 1 else 0.0

    @cached_property
    def mlp_weights(self) -> int:
        """One MLP's (one expert's) weights."""
        return (3 if self.gated else 2) * self.hidden * self.ffn_hidden

    @cached_property
    def mlp_passes(self) -> float:
        """MLPs a token runs through per layer, on average: 1 dense, top_k in a MoE layer."""
        return 1 - self.moe_share + self.moe_share * self.top_k

    @cached_property
    def layer_weights(self) -> float:
        """Weights one block multiplies each token with: q, k, v, output projection and the MLP(s)
        it is routed to (top_k experts in a MoE layer; averaged over the layers)."""
        h = self.hidden
        return h * (h + 2 * self.kv_hidden) + h * h + self.mlp_passes * self.mlp_weights

    @cached_property
    def expert_parameters(self) -> float:
        """A layer's expert weights (averaged over the layers): what expert parallelism splits."""
        return self.moe_share * self.experts * self.mlp_weights

    @cached_property
    def layer_parameters(self) -> float:
        h, f = self.hidden, self.ffn_hidden
        biases = (h + 2 * self.kv_hidden + h + f * (2 if self.gated else 1) + h) if self.bias else 0
        router = self.moe_share * h * self.experts
        dense = self.layer_weights - self.mlp_passes * self.mlp_weights + (1 - self.moe_share) * self.mlp_weights
        return dense + self.expert_parameters + router + biases + 4 * h  # two LayerNorms (weight and bias)

    @cached_property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden + (self.seq_len * self.hidden if self.learned_positions else 0)

    @cached_property
    def head_parameters(self) -> int:
        """The output layer's own weights (0 when tied to the embedding) and the final LayerNorm."""
        return (0 if self.tied else self.vocab * self.hidden) + 2 * self.hidden

    @cached_property
    def parameters(self) -> int:
        return round(self.layers * self.layer_parameters + self.embedding_parameters + self.head_parameters)

    @cached_property
    def active_parameters(self) -> int:
        """The parameters one token uses: all of them for a dense model, top_k experts of each MoE layer."""
        idle = self.moe_share * (self.experts - self.top_k) * self.mlp_weights
        return round(self.parameters - self.layers * idle)

    def describe(self) -> str:
        label = f"{self.name}: " if self.name else ""
        gqa = f", {self.kv} kv heads" if self.kv != self.heads else ""
        moe = (f", {self.experts} experts top-{self.top_k}{f' every {self.moe_every} layers' if self.moe_every > 1 else ''}"
               f", {self.active_parameters / 1e9:,.1f}B active" if self.experts > 1 else "")
        return (f"{label}{self.parameters / 1e9:,.1f}B parameters ({self.layers} layers, hidden {self.hidden}, "
                f"{self.heads} heads{gqa}, seq {self.seq_len}, vocab {self.vocab}{moe})")


def whole_number(name, value) -> None:
    """A ValueError naming ``name`` unless ``value`` is a whole number >= 1 (numpy's integers too)."""
    formulas.require_whole(**{name: value})


MODELS = {
    # Brown et al. 2020, Table 2.1 (GPT-3 175B); vocabulary padded to 51,200 as Megatron-LM runs it
    "gpt3-175b": Transformer(96, 12288, 96, 2048, 51200, name="GPT-3 175B"),
    # Korthikanti et al. 2022, Table 3 and Smith et al. 2022 (MT-NLG)
    "megatron-22b": Transformer(48, 6144, 64, 2048, 51200, name="Megatron 22B"),
    "mt-nlg-530b": Transformer(105, 20480, 128, 2048, 51200, name="MT-NLG 530B"),
    "megatron-1t": Transformer(128, 25600, 160, 2048, 51200, name="Megatron 1T"),
    # Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3: SwiGLU, GQA with 8 kv heads, RoPE
    "llama3-8b": Transformer(32, 4096, 32, 8192, 128256, ffn=14336, kv_heads=8, gated=True, bias=False,
                             dropout=False, tied=False, learned_positions=False, name="Llama 3 8B"),
    "llama3-70b": Transformer(80, 8192, 64, 8192, 128256, ffn=28672, kv_heads=8, gated=True, bias=False,
                              dropout=False, tied=False, learned_positions=False, name="Llama 3 70B"),
    "llama3-405b": Transformer(126, 16384, 128, 8192, 128256, ffn=53248, kv_heads=8, gated=True, bias=False,
                               dropout=False, tied=False, learned_positions=False, name="Llama 3 405B"),
    # Jiang et al. 2024 (Mixtral of Experts), Table 1: dim 4096, 32 layers, head dim 128, hidden 14336,
    # 32 heads, 8 kv heads, context 32768, vocab 32000, 8 experts, top-2, in every layer
    "mixtral-8x7b": Transformer(32, 4096, 32, 32768, 32000, ffn=14336, kv_heads=8, gated=True, bias=False,
                                dropout=False, tied=False, learned_positions=False, experts=8, top_k=2,
                                name="Mixtral 8x7B"),
}

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMbBtT]?)\s*$")
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def transformer(model) -> Transformer:
    """A ``Transformer`` from a preset name (``MODELS``), a size (``175e9``, ``"175B"``, ``"7b"``),
    a dict of its fields, or a ``Transformer``.

    A size gets GPT-3's shape rule (Brown et al. 2020, Table 2.1: 175B is 96 layers of 12,288 =
    128·96 with 128-wide heads): hidden = 128·layers, heads = layers, layers rounded to a multiple
    of 4 so that 12·layers·hidden² comes closest to the size (7B -> 32 x 4096, 13B -> 40 x 5120)."""
    if isinstance(model, Transformer):
        return model
    if isinstance(model, dict):
        unknown = sorted(set(model) - {f.name for f in fields(Transformer)})
        if unknown:
            raise ValueError(f"model={model!r}: {', '.join(map(repr, unknown))} not a Transformer field; use "
                             f"{', '.join(f.name for f in fields(Transformer))}")
        return Transformer(**model)
    if isinstance(model, str) and model.lower() in MODELS:
        return MODELS[model.lower()]
    size = None
    if isinstance(model, str):
        match = _SIZE.match(model)
        if match:
            size = float(match.group(1)) * _SCALE[match.group(2).lower()]
    elif is_number(model):
        size = float(model)
    if size is None or not math.isfinite(size) or size < 1e6 or size > 1e15:
        raise ValueError(f"model={model!r}: pass a preset ({', '.join(MODELS)}), a parameter count between 1e6 "
                         f"and 1e15 (175e9 or '175B'), a dict of Transformer fields or a mpkit.sim.Transformer")
    layers = max(4, 4 * round((size / (12 * 128 ** 2)) ** (1 / 3) / 4))
    return Transformer(layers, 128 * layers, layers, name=f"{_size_label(size)} (GPT-3 shape)")


def _size_label(size: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}"


__all__ = ["Transformer", "MODELS", "transformer", "whole_number"]
