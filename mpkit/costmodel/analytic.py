"""One training step of a large transformer on a GPU cluster, in closed form.

``predict`` profiles the lab's real models op by op, which no 175-billion-parameter model allows;
this module prices a step from the shapes alone, the way Megatron-LM's papers reason about it
(Narayanan et al. 2021; Korthikanti et al. 2022), so ``mpkit.sim.plan`` can compare thousands of
layouts in a fraction of a second. Per rank and micro-batch of its pipeline stage:

- matmuls: 2 FLOPs per weight per token forward, twice that backward, at ``hw.flops × hw.mfu``;
  the attention scores, 4·s·h per token, the same way, or under a causal flash-attention kernel
  half of them (2.5 times that backward: it recomputes the scores) at ``hw.flops × hw.attention``;
- memory-bound ops (LayerNorm, GeLU, dropout, residual adds, unfused softmax) by the bytes they
  read and write, at ``hw.mem_bw``: one kernel each where the software fuses them, one per PyTorch
  op where it runs eagerly (``Setup.fused``, ``memory_bound_bytes``);
- tensor parallel: 2 all-reduces (or reduce-scatter + all-gather under sequence parallelism) of
  the layer's activations forward, 2 backward, 2 more when full recomputation reruns the
  forward, on the link the TP group spans; never hidden (Megatron-LM issues them between
  dependent matmuls);
- pipeline: (m-1)·t_slowest + Σ t_stage for 1F1B, the fill/drain shrunk v-fold by the
  interleaved schedule; one activation per micro-batch and chunk hop each way, on the link
  between the two stages, not hidden;
- data parallel: the gradient all-reduce (ZeRO-1: reduce-scatter + all-gather) after the last
  micro-batch, hidden behind that micro-batch's backward when ``overlap_dp`` (DDP buckets,
  Megatron-core's overlap_grad_reduce) and exposed otherwise (Megatron-LM 2021); ZeRO-2
  reduce-scatters gradients every micro-batch behind its backward, ZeRO-3 also all-gathers the
  weights behind forward and again behind backward (FSDP's prefetch);
- the Adam step: memory-bound, 28 bytes read and written per parameter a rank updates;
- context parallel (``layout.cp``): each rank holds s/cp of every sequence's tokens, so matmuls,
  memory-bound ops, activations and the TP/PP messages shrink cp-fold, while each rank's queries
  still meet all s keys: its causal attention is 1/cp of the whole, the same on every rank (the
  load-balanced split into 2·cp chunks, Dubey et al. 2024 §3.3.2). ``attention="ring"`` passes
  the K/V blocks cp-1 times per layer forward and twice that backward (K/V and their gradients),
  hidden behind the attention kernels where they are longer (Liu et al. 2023, ring attention);
  ``"all-gather"`` (Llama 3's CP) all-gathers K/V forward and reduce-scatters their gradients
  backward, exposed; ``"ulysses"`` (Jacobs et al. 2023) swaps sequence for head shards with four
  all-to-alls forward and four backward, exposed. Gradients are reduced over the dp·cp ranks;
- expert parallel (``layout.ep``, mixture-of-experts models): the experts are split over ep
  data-parallel ranks; each MoE layer dispatches and combines its tokens with an all-to-all
  forward (tokens·hidden·top_k bytes each) and again backward, exposed.

Memory of the fullest rank: model states by ZeRO stage (``formulas.zero_memory``, 16 bytes per
parameter unsharded), ZeRO-3's gathered layers, and activations per layer (Korthikanti et al.
2022, with and without sequence parallelism and recomputation) times the micro-batches the
schedule keeps in flight (``formulas.inflight_activations``; where the layers do not divide evenly
the end stages get one fewer, as Llama 3's), plus the fp32 logits; a layout fits
within ``USABLE_MEMORY`` of the device.

Which link a group talks over comes from ``mpkit.parallel.Layout``: the rank grid the
real 3D run uses (TP innermost), cut into nodes of ``hw.devices_per_node``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from functools import cached_property, lru_cache

from mpkit.i18n import t
from mpkit.layout import Layout
from mpkit.simulator import formulas
from mpkit.simulator.hardware import FP8_MATMUL_SPEEDUP, USABLE_MEMORY, Hardware, gpu_family
from mpkit.whole import is_number

BYTES = 2  # bf16 activations, gradients and the weights the matmuls read
ADAM_BYTES = 28  # per parameter: read fp32 master, m, v (12) + bf16 grad (2); write master, m, v + bf16 weight (14)
CP_ATTENTION = ("ring", "all-gather", "ulysses")  # how context-parallel ranks exchange keys and values


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


# ---- per token, per layer ----------------------------------------------------------------------

def activation_bytes(model: Transformer, t: int, sequence_parallel: bool, recompute: str, flash: bool) -> float:
    """Activation bytes one layer keeps per token for backward on one rank of a TP group of t:
    Korthikanti et al. 2022 (Table 2) term by term, for any MLP width, GQA, SwiGLU and with or
    without dropout; equal to ``formulas.activation_memory_per_layer`` / (s·b) for a GPT block.
    Replicated unless sequence parallel: both LayerNorm inputs (4h), dropout masks (2h), the
    attention and MLP inputs (4h); split t ways: q, k, v, the projection input, the MLP's
    intermediate tensors; the attention scores (softmax output, its dropout mask and output:
    5·a·s bytes) unless flash attention or selective recomputation never stores them."""
    h, f, a, s = model.hidden, model.ffn_hidden, model.heads, model.seq_len
    if recompute == "full":
        return 2 * h / (t if sequence_parallel else 1)
    if recompute == "op":  # the block's input, the attention output and the odd-numbered matmuls' outputs
        kept = sum(width for width, _ in _matmuls(model, t)[0::2])
        return 2 * h / (t if sequence_parallel else 1) + 2 * h / t + 2 * kept
    masks = 2 * h if model.dropout else 0
    replicated = 4 * h + masks + 4 * h
    split = 2 * h + 4 * model.kv_hidden + 2 * h + ((4 * f if model.gated else 2 * f) + 2 * f) * model.mlp_passes
    scores = 0 if (flash or recompute == "selective") else a * s * (5 if model.dropout else 2)
    return (replicated / (t if sequence_parallel else 1)) + (split + scores) / t


def _matmuls(model: Transformer, t: int) -> list[tuple[float, float]]:
    """(output width on one rank, weights on one rank) of a block's matmuls in forward order: q, k,
    v, the attention projection, the MLP's (w1, w3, w2 gated; fc1, fc2 otherwise). Column-parallel
    outputs are split t ways; a row-parallel matmul's output is full width (a partial sum)."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_hidden
    mlp = [(f / t, h * f / t), (f / t, h * f / t), (h, f * h / t)] if model.gated else [(f / t, h * f / t),
                                                                                       (h, f * h / t)]
    return [(h / t, h * h / t), (kv / t, h * kv / t), (kv / t, h * kv / t), (h, h * h / t), *mlp]


def memory_bound_bytes(model: Transformer, t: int, sequence_parallel: bool, flash: bool,
                       fused: bool = True) -> tuple[float, float]:
    """Bytes the non-matmul ops of one layer read and write per token forward, on one rank:
    (replicated-unless-sequence-parallel part, attention part). Backward moves about twice as many
    (each op reads its saved input and the incoming gradient and writes the outgoing one).

    ``fused`` (each norm and activation one kernel: Megatron/Transformer Engine, torch.compile, or
    a library LayerNorm): two LayerNorms (read + write h: 8h), two bias-dropout-residual adds (read
    x and the residual, write the sum and a 1-byte mask: 7h each), the MLP activation (bias-GeLU
    reads and writes f: 4f; SwiGLU reads 2f, writes f: 6f). Not fused (a Llama block written in
    PyTorch ops and run eagerly, one kernel per op, as torchtitan's model without torch.compile):
    each RMSNorm up-casts to fp32, squares, averages, multiplies and casts back before the weight
    (36h), the rotary embedding does the same to q and k (20 bytes per element), SwiGLU is SiLU
    then a product (10f), grouped-query attention copies k and v out to every head, and the
    attention output is transposed back (4h). Without flash attention, the fused
    scale-mask-softmax and its dropout over the a·s scores of every token (read + write, 2 bytes
    each, plus the mask: 9·a·s)."""
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_hidden
    adds = 2 * ((7 if model.dropout else 6) * h)
    if fused:
        norms, act, heads = 2 * 4 * h, (6 if model.gated else 4) * f, 0.0
    else:
        norms, act = 2 * 36 * h, (10 if model.gated else 4) * f
        rotary = 0 if model.learned_positions else 20 * (h + kv)
        heads = rotary + 2 * (2 * kv + 2 * h) * (kv < h) + 4 * h
    local = (norms + adds) / (t if sequence_parallel else 1) + (act * model.mlp_passes + heads) / t
    attention = 0.0 if flash else model.heads * model.seq_len * (9 if model.dropout else 4) / t
    return local, attention


# ---- one layout ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setup:
    """Everything about a layout besides the model and the machine.

    ``layout``: dp x pp x tp; ``micro_batch``: sequences per micro-batch; ``zero``: ZeRO stage
    over the data-parallel group; ``recompute``: "none", "selective" (attention scores only,
    Korthikanti et al. 2022) or "full" (every layer's forward again); ``schedule``/``virtual``:
    pipeline schedule and model chunks per rank (interleaved only); ``sequence_parallel``:
    Megatron's sequence parallelism inside the TP group; ``flash``: fused causal attention that
    never stores the scores; ``overlap_dp``: data-parallel gradient traffic hidden behind the
    last backward. ``shard``: hybrid sharding (HSDP) when it is less than dp: the ZeRO stage shards
    over groups of ``shard`` neighbouring DP ranks, and those groups' replicas all-reduce their
    gradient shards once per step (0: over the whole DP group). ``reshard_after_forward``
    (ZeRO-3 only, FSDP2's option of that name): False keeps each micro-batch's gathered weights
    from forward to backward, so backward gathers nothing, for a whole stage of bf16 weights held.
    ``fp8``: the blocks' matmuls in FP8, ``FP8_MATMUL_SPEEDUP`` times faster (Hopper only).
    ``attention``: how context parallel ranks exchange keys and values when ``layout.cp`` > 1:
    "ring", "all-gather" or "ulysses" (``CP_ATTENTION``). ``fused``: each norm and activation runs
    as one kernel (False: one kernel per PyTorch op, see ``memory_bound_bytes``)."""

    layout: Layout
    micro_batch: int = 1
    zero: int = 0
    recompute: str = "none"
    schedule: str = "1f1b"
    virtual: int = 1
    sequence_parallel: bool = True
    flash: bool = True
    overlap_dp: bool = True
    shard: int = 0
    reshard_after_forward: bool = True
    fp8: bool = False
    attention: str = "ring"
    fused: bool = True

    def describe(self, micro_batches: int, lang: str = "en") -> str:
        sched = "" if self.layout.pp == 1 else (
            f", {self.schedule}" + (f" v={self.virtual}" if self.schedule == "interleaved" else ""))
        order = t("plan_pp_outermost", lang) if self.layout.order == "pp-dp-tp" else ""
        hybrid = t("plan_hsdp", lang, shard=self.shard) if 0 < self.shard < self.layout.dp else ""
        hybrid += t("plan_keep_params", lang) if self.zero == 3 and not self.reshard_after_forward else ""
        hybrid += ", FP8" if self.fp8 else ""
        hybrid += t("plan_cp_setup", lang, cp=self.layout.cp, kind=self.attention) if self.layout.cp > 1 else ""
        hybrid += t("plan_ep_setup", lang, ep=self.layout.ep) if self.layout.ep > 1 else ""
        return t("plan_setup", lang, dp=self.layout.dp, pp=self.layout.pp, tp=self.layout.tp, m=micro_batches,
                 b=self.micro_batch, schedule=sched, zero=self.zero, recompute=self.recompute) + hybrid + order


@dataclass
class Estimate:
    """One step of one layout: seconds by part, bytes per GPU by category, and why it cannot run.

    ``time``: compute (matmuls + memory-bound ops, recomputation included), tp (exposed TP
    collectives), pp (exposed pipeline hops), bubble (pipeline fill and drain), dp (exposed
    data-parallel / ZeRO traffic), optimizer. ``memory``: parameters, gradients, optimizer,
    activations, on the fullest rank. ``links``: which link each group talks over."""

    model: Transformer
    hardware: Hardware
    setup: Setup
    global_batch: int
    micro_batches: int
    time: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)
    comm_bytes: dict = field(default_factory=dict)

    @property
    def step_time(self) -> float:
        return sum(self.time.values())

    @property
    def memory_total(self) -> float:
        return sum(self.memory.values())

    @property
    def capacity(self) -> float:
        return self.hardware.usable_memory

    @property
    def fits(self) -> bool:
        return self.memory_total <= self.capacity

    @property
    def tokens_per_second(self) -> float:
        return self.global_batch * self.model.seq_len / self.step_time

    @property
    def model_flops_per_token(self) -> float:
        """6 per parameter a token uses (2 forward, 4 backward; the routed experts only in a MoE
        layer) + the attention scores, 12·L·s·h (PaLM's count,
        Chowdhery et al. 2022, App. B): what the model needs, however it is run."""
        return 6 * self.model.active_parameters + 12 * self.model.layers * self.model.seq_len * self.model.hidden

    @property
    def hardware_flops_per_token(self) -> float:
        """The model FLOPs plus what recomputation runs again: full recomputation repeats every
        layer's forward (2 per layer weight + 4·s·h of scores), selective recomputation the scores
        only (Korthikanti et al. 2022, §6: the split into MFU and HFU). Narayanan et al. 2021 count
        these (their 96·B·s·l·h² assumes full recomputation), so their "52 % of peak" is an HFU."""
        m = self.model
        scores = 4 * m.layers * m.seq_len * m.hidden
        again = sum(weights for _, weights in _matmuls(m, 1)[1::2])  # "op": the even-numbered matmuls
        extra = {"full": 2 * m.layers * m.layer_weights + scores, "selective": scores,
                 "op": 2 * m.layers * again}.get(self.setup.recompute, 0)
        return self.model_flops_per_token + extra

    def _utilisation(self, flops_per_token) -> float:
        return flops_per_token * self.tokens_per_second / (self.setup.layout.world_size * self.hardware.flops)

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: ``model_flops_per_token`` per second per GPU over peak, the
        utilisation papers quote since PaLM. Like theirs it counts every parameter (the embedding
        lookup too) and the whole score matrix, where causal flash attention computes half: on a
        machine running at its peak it can read a few % over 100%."""
        return self._utilisation(self.model_flops_per_token)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: ``hardware_flops_per_token`` (recomputation counted) over
        peak; equal to ``mfu`` without recomputation, above it with."""
        return self._utilisation(self.hardware_flops_per_token)

    @property
    def bubble_share(self) -> float:
        return self.time.get("bubble", 0.0) / self.step_time

    def over_memory(self, lang: str = "en") -> str:
        """Why it does not fit ('' when it does), with the bytes by category."""
        if self.fits:
            return ""
        names = {"optimizer": "optimizer_state"}
        parts = ", ".join(f"{t(names.get(k, k), lang)} {v / 1e9:,.1f} GB" for k, v in self.memory.items())
        return t("plan_over_memory", lang, need=self.memory_total / 1e9, cap=self.capacity / 1e9, parts=parts)


def aligned(layout: Layout, per_node: int) -> bool:
    """Whether every TP group and every block of the two inner dimensions (a pipeline, pp x tp,
    in the default order; a DP x TP block with the pipeline outermost) lies in the nodes the same
    way as rank 0's: each block divides a node or is whole nodes. Otherwise some groups straddle
    two nodes while rank 0's does not (tp=6 on 8-GPU nodes: ranks 6..11)."""
    if layout.world_size <= per_node:
        return True
    middle = getattr(layout, layout.dims[1])
    return all(size % per_node == 0 or per_node % size == 0 for size in (layout.tp, layout.tp * middle))


@lru_cache(maxsize=65536)
def _span(layout: Layout, dim: str, per_node: int) -> tuple[int, int]:
    """(ranks per node, nodes) of rank 0's group along ``dim``, read off ``Layout``'s rank mapping
    (for an ``aligned`` layout every group sits in the nodes like rank 0's)."""
    size = getattr(layout, dim)
    if size == 1:
        return 1, 1
    return _strided_span(size, layout.rank(**{dim: 1}) - layout.rank(), per_node)


@lru_cache(maxsize=65536)
def _strided_span(size: int, stride: int, per_node: int) -> tuple[int, int]:
    """(ranks per node, nodes) of ``size`` ranks ``stride`` apart from rank 0."""
    if size == 1:
        return 1, 1
    if stride >= per_node:
        return 1, size
    per = min(size, -(-per_node // stride))
    return per, (size - 1) * stride // per_node + 1


def _links(hw: Hardware):
    intra = (hw.collective.alpha, hw.collective.beta)
    inter = (hw.inter_node.alpha, hw.inter_node.beta) if hw.inter_node is not None else intra
    return intra, inter


@lru_cache(maxsize=65536)
def _collective(kind: str, S: float, span: tuple[int, int], intra: tuple, inter: tuple) -> float:
    """Seconds of an all-reduce or a reduce-scatter (= all-gather) of S bytes over ``span``
    (cached: the search asks for the same few sizes thousands of times)."""
    if S <= 0 or span == (1, 1):
        return 0.0
    if kind == "all_reduce":
        return formulas.hierarchical_allreduce_time(S, *span, intra, inter)
    return formulas.hierarchical_reduce_scatter_time(S, *span, intra, inter)


def _allreduce(hw, S, span):
    return _collective("all_reduce", S, span, *_links(hw))


def _reduce_scatter(hw, S, span):
    return _collective("reduce_scatter", S, span, *_links(hw))


def estimate(model, hw: Hardware, setup: Setup, global_batch: int) -> Estimate:
    """Price one optimizer step of ``model`` on ``hw`` laid out as ``setup`` (see the module
    docstring for what counts and what overlaps). Inputs are assumed consistent (``plan`` checks
    them): dp·micro_batch divides the global batch, pp is at most the layers (an uneven split is
    priced by its fullest stage)."""
    model = transformer(model)
    lay = setup.layout
    dp, pp, tp, cp = lay.dp, lay.pp, lay.tp, lay.cp
    b, s, h, V = setup.micro_batch, model.seq_len, model.hidden, model.vocab
    m = global_batch // (dp * b)
    tokens = b * s // cp  # this rank's share of the micro-batch's tokens
    per_node = hw.devices_per_node
    sp = setup.sequence_parallel and tp > 1
    rate, mem_bw = hw.flops * hw.mfu, hw.mem_bw
    fused = hw.flops * (hw.attention or hw.mfu) if setup.flash else rate  # the attention kernels' rate
    spans = {dim: _span(lay, dim, per_node) for dim in ("tp", "pp", "dp", "cp")}

    # compute of one layer for one micro-batch, forward and backward (recomputation included)
    gemm = 2 * tokens * model.layer_weights / tp
    scores = 4 * tokens * s * h / tp * (0.5 if setup.flash else 1.0)
    local, attn_bytes = memory_bound_bytes(model, tp, sp, setup.flash, setup.fused)
    mem_fwd = tokens * (local + attn_bytes) / mem_bw
    gemm_rate = rate * (FP8_MATMUL_SPEEDUP[gpu_family(hw)] if setup.fp8 else 1.0)  # plan checks the GPU
    fwd = gemm / gemm_rate + scores / fused + mem_fwd
    bwd = 2 * gemm / gemm_rate + (2.5 if setup.flash else 2.0) * scores / fused + 2 * mem_fwd
    if setup.recompute == "full":
        bwd += fwd
    elif setup.recompute == "selective" and not setup.flash:
        bwd += scores / rate + tokens * attn_bytes / mem_bw
    elif setup.recompute == "op":  # the even-numbered matmuls and every memory-bound op, forward again
        again = 2 * tokens * sum(weights for _, weights in _matmuls(model, tp)[1::2])
        bwd += again / gemm_rate + tokens * local / mem_bw

    # tensor parallel: 2 collectives of the layer's activations each way (+2 when recomputing)
    tp_bytes = tokens * h * BYTES
    tp_calls = 4 + (2 if setup.recompute == "full" else 0)
    tp_layer = tp_calls * _allreduce(hw, tp_bytes, spans["tp"]) if tp > 1 else 0.0
    cp_layer, cp_bytes = _context_parallel(model, hw, setup, tokens, spans["cp"], scores / fused)
    ep_layer, ep_bytes = _expert_parallel(model, hw, lay, tokens / (tp if sp else 1), per_node, setup.recompute)
    layer_comm = tp_layer + cp_layer + ep_layer  # all exposed alike: inside every layer, between dependent kernels

    # the logit layer and its fp32 cross-entropy on the last stage
    logits = 3 * 2 * tokens * V * h / tp / rate + 5 * 4 * tokens * V / tp / mem_bw
    v = setup.virtual if setup.schedule == "interleaved" else 1
    layers = -(-model.layers // (pp * v)) * v  # on the fullest stage (uneven when pp·v does not divide the layers)
    work = layers * (fwd + bwd)  # one micro-batch on one stage
    comm_stage = layers * layer_comm

    # pipeline hops: one activation per micro-batch and chunk each way (split over the TP group:
    # Megatron's scatter/gather, or sequence parallel), on the link between neighbouring stages
    hop_bytes = tokens * h * BYTES / tp
    hops = 0.0
    if pp > 1:
        link = hw.inter_node if spans["pp"][1] > 1 and hw.inter_node is not None else hw.p2p
        hops = 2 * v * link.time(hop_bytes)
    # stages are equal but the last also runs the logits: (m-1)·slowest + every stage once,
    # the fill and drain shrunk v-fold by interleaving
    slowest = work + comm_stage + hops + logits
    every_stage = pp * (work + comm_stage + hops) + logits
    pipeline = m * slowest + (every_stage - slowest) / v

    # data parallel and ZeRO: this rank's share of the fullest stage (the first holds the
    # embedding; the last the output layer, or a copy of the tied embedding when pp > 1)
    psi_layers = layers * (model.layer_parameters - model.expert_parameters * (1 - 1 / lay.ep))  # experts split ep ways
    psi_first = psi_layers + model.embedding_parameters + (model.head_parameters if pp == 1 else 0)
    psi_last = psi_layers + model.head_parameters + (model.vocab * h if model.tied else 0)
    psi = (psi_first if pp == 1 else max(psi_first, psi_last)) / tp
    grads = psi * BYTES
    dp_time = 0.0
    # the gradients are reduced (and ZeRO shards) over the dp·cp ranks that hold the same weights
    shard = setup.shard if 0 < setup.shard < dp and setup.zero >= 1 else dp * cp  # HSDP: ZeRO within shard groups
    if dp * cp > 1:
        stride = lay.rank(dp=1) - lay.rank()
        span = (_strided_span(shard, stride, per_node) if cp == 1 or shard < dp * cp else
                (spans["cp"][0] * spans["dp"][0], spans["cp"][1] * spans["dp"][1]))
        if setup.zero <= 1:  # once per step, after the last micro-batch's backward
            reduce = _allreduce(hw, grads, span) if setup.zero == 0 else 2 * _reduce_scatter(hw, grads, span)
            last_backward = layers * bwd
            dp_time = max(0.0, reduce - last_backward) if setup.overlap_dp else reduce
        else:  # every micro-batch: reduce-scatter the gradients during backward; ZeRO-3 also
            # all-gathers the weights for forward and again for backward, a layer ahead (FSDP prefetch)
            unit = _reduce_scatter(hw, grads, span)
            if setup.zero == 3:  # backward gathers the weights again unless forward kept them
                again = 2 if setup.reshard_after_forward else 1
                exposed = max(0.0, unit - layers * fwd) + max(0.0, again * unit - layers * bwd - logits)
            else:
                exposed = max(0.0, unit - layers * bwd)
            dp_time = m * exposed + (unit if setup.zero == 2 else 0.0)  # ZeRO-2: all-gather the new weights once
        if shard < dp * cp:  # HSDP: the replicas of each shard all-reduce it once per step, behind the last backward
            replicas = _allreduce(hw, grads / shard, _strided_span(dp // shard, stride * shard, per_node))
            dp_time += max(0.0, replicas - layers * bwd) if setup.overlap_dp else replicas
    optimizer = psi / (shard if setup.zero >= 1 else 1) * ADAM_BYTES / mem_bw

    compute = m * (work + logits)
    comm_exposed, pp_exposed = m * comm_stage, m * hops
    time = {"compute": compute, "tp": m * (layers * tp_layer), "pp": pp_exposed,
            "bubble": max(pipeline - compute - comm_exposed - pp_exposed, 0.0), "dp": dp_time, "optimizer": optimizer,
            "cp": m * layers * cp_layer, "ep": m * layers * ep_layer}

    # memory of the fullest rank: each candidate stage's model states and the activations it holds
    # at once (stage 0: the embedding and the most micro-batches in flight; the last: the logits)
    per_layer = tokens * activation_bytes(model, tp, sp, setup.recompute, setup.flash)
    transient = 0.0
    if setup.recompute == "full":  # the layer being recomputed holds its full activations for a moment
        transient = tokens * activation_bytes(model, tp, sp, "none", setup.flash)
    logit_bytes = 2 * 4 * tokens * V / tp  # fp32 logits and their gradient
    if pp == 1:
        stages = [(psi, layers * per_layer + logit_bytes)]
    else:
        def stage(r, n, extra):  # stage r holding n layers (in v chunks) and ``extra`` parameters
            held = formulas.inflight_activations(setup.schedule, pp, m, r, v) * n / v * per_layer
            return (n * per_layer_params + extra) / tp, held + (logit_bytes if r == pp - 1 else 0.0)
        per_layer_params = psi_layers / layers
        head = model.head_parameters + (model.vocab * h if model.tied else 0)
        light = pp * layers - model.layers
        # an uneven split gives its lighter stages (one layer fewer) to the ends first, as Llama 3 does
        # (Dubey et al. 2024 §3.3.2): stage 0, the last, then stage 1, ...; stages 0 .. heavy-1 are light
        heavy = (light + 1) // 2
        stages = [stage(0, layers - (light > 0), model.embedding_parameters), stage(pp - 1, layers - (light > 1), head)]
        if 0 < heavy < pp - 1:
            stages.append(stage(heavy, layers, 0.0))

    def rank_memory(stage_psi, activations):
        states = formulas.zero_memory(max(stage_psi, 1.0), shard, setup.zero)
        if setup.zero == 3 and shard > 1:  # FSDP holds two layers' gathered weights and one layer's full
            # gradient (or, keeping them after forward, the whole stage's until its backward)
            states["parameters"] += (2 * model.layer_parameters / tp if setup.reshard_after_forward
                                     else stage_psi) * BYTES
            states["gradients"] += model.layer_parameters / tp * BYTES
        return {**states, "activations": activations + transient}

    memory = max((rank_memory(*st) for st in stages), key=lambda mem: sum(mem.values()))

    links = {dim: _link_name(spans[dim]) for dim in ("tp", "pp", "dp", "cp")}
    links["ep"] = _link_name(_ep_span(lay, per_node))
    comm = {"tp": tp_bytes, "pp": hop_bytes, "dp": grads, "cp": cp_bytes, "ep": ep_bytes}
    return Estimate(model, hw, setup, global_batch, m, time, memory, links, comm)


def _context_parallel(model, hw, setup, tokens, span, attention_seconds) -> tuple[float, float]:
    """(exposed seconds per layer per micro-batch, forward and backward, bytes of this rank's K/V
    block) of context parallelism's key/value exchange (module docstring)."""
    cp = setup.layout.cp
    kv = 2 * tokens * model.kv_hidden / setup.layout.tp * BYTES
    if cp == 1:
        return 0.0, 0.0
    passes = 3 if setup.recompute == "full" else 2  # the forward's exchange again when recomputing
    if setup.attention == "ring":
        link = hw.inter_node if span[1] > 1 and hw.inter_node is not None else hw.p2p
        step = (cp - 1) * link.time(kv)
        fwd = max(0.0, step - attention_seconds)
        bwd = max(0.0, 2 * step - 2.5 * attention_seconds)
        return (passes - 1) * fwd + bwd, kv
    if setup.attention == "all-gather":
        return passes * _reduce_scatter(hw, kv * cp, span), kv
    qkvo = 2 * tokens * (model.hidden + model.kv_hidden) / setup.layout.tp * BYTES  # ulysses: q, k, v in, output out
    return 2 * passes * _all_to_all(hw, qkvo, cp, span), kv


def _all_to_all(hw, S, n, span) -> float:
    """An all-to-all of S bytes per rank over n ranks: (n-1)/n of it leaves each rank, over the
    slowest link the group spans, in n-1 messages."""
    link = hw.inter_node if span[1] > 1 and hw.inter_node is not None else hw.collective
    return (n - 1) * link.alpha + S * (n - 1) / n * link.beta


def _ep_span(lay: Layout, per_node: int) -> tuple[int, int]:
    """(ranks per node, nodes) of an expert-parallel group: ep neighbouring DP ranks."""
    return _strided_span(lay.ep, lay.rank(dp=1) - lay.rank(), per_node) if lay.dp > 1 else (1, 1)


def _expert_parallel(model, hw, lay, tokens, per_node, recompute) -> tuple[float, float]:
    """(seconds per layer per micro-batch, averaged over the layers, forward and backward, bytes
    per all-to-all) of the experts' dispatch and combine: tokens·hidden·top_k bytes each way."""
    if lay.ep == 1 or model.moe_share == 0:
        return 0.0, 0.0
    S = tokens * model.hidden * model.top_k * BYTES
    passes = 3 if recompute == "full" else 2
    return model.moe_share * 2 * passes * _all_to_all(hw, S, lay.ep, _ep_span(lay, per_node)), S


def _link_name(span) -> str:
    return "none" if span == (1, 1) else ("intra" if span[1] == 1 else "inter")


__all__ = ["Transformer", "MODELS", "transformer", "Setup", "Estimate", "estimate", "activation_bytes", "CP_ATTENTION",
           "memory_bound_bytes", "aligned", "whole_number", "USABLE_MEMORY"]
