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

Reading order: ``estimate`` is the step in a screenful, one line per dimension; each dimension
is priced by its own function below it, in the order above (``_layer_compute``: matmuls,
attention and memory-bound ops with recomputation; ``_tensor_parallel``, ``_context_parallel``,
``_expert_parallel``, ``_logits``, ``_pipeline``, ``_data_parallel``, ``_memory``). The model's
shape and the published presets are in ``shapes.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from mpkit.costmodel.shapes import MODELS, Transformer, transformer, whole_number  # MODELS, whole_number: re-exported
from mpkit.i18n import t
from mpkit.layout import Layout
from mpkit.simulator import formulas
from mpkit.simulator.hardware import FP8_MATMUL_SPEEDUP, USABLE_MEMORY, Hardware, gpu_family

BYTES = 2  # bf16 activations, gradients and the weights the matmuls read
ADAM_BYTES = 28  # per parameter: read fp32 master, m, v (12) + bf16 grad (2); write master, m, v + bf16 weight (14)
CP_ATTENTION = ("ring", "all-gather", "ulysses")  # how context-parallel ranks exchange keys and values


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


# ---- one step: each dimension priced by its own function below -----------------------------------------

def estimate(model, hw: Hardware, setup: Setup, global_batch: int) -> Estimate:
    """Price one optimizer step of ``model`` on ``hw`` laid out as ``setup`` (see the module
    docstring for what counts and what overlaps). Inputs are assumed consistent (``plan`` checks
    them): dp·micro_batch divides the global batch, pp is at most the layers (an uneven split is
    priced by its fullest stage)."""
    model = transformer(model)
    step, rates = _step(model, hw, setup, global_batch), _rates(hw, setup)
    fwd, bwd, attention = _layer_compute(model, setup, step, rates)
    tp_layer, tp_bytes = _tensor_parallel(model, hw, setup, step)
    cp_layer, cp_bytes = _context_parallel(model, hw, setup, step.tokens, step.spans["cp"], attention)
    ep_layer, ep_bytes = _expert_parallel(model, hw, setup.layout, step.tokens / (setup.layout.tp if step.sp else 1),
                                          hw.devices_per_node, setup.recompute)
    layer_comm = tp_layer + cp_layer + ep_layer  # all exposed alike: inside every layer, between dependent kernels
    logits = _logits(model, setup, step, rates)
    work = step.layers * (fwd + bwd)  # one micro-batch on one stage
    comm_stage = step.layers * layer_comm
    pipeline, hops, hop_bytes = _pipeline(model, hw, setup, step, work + comm_stage, logits)
    psi_layers, psi = _stage_parameters(model, setup.layout, step.layers)
    grads = psi * BYTES
    dp_time, shard = _data_parallel(hw, setup, step, grads, fwd, bwd, logits)
    optimizer = psi / (shard if setup.zero >= 1 else 1) * ADAM_BYTES / rates.memory

    m = step.m
    compute = m * (work + logits)
    comm_exposed, pp_exposed = m * comm_stage, m * hops
    time = {"compute": compute, "tp": m * (step.layers * tp_layer), "pp": pp_exposed,
            "bubble": max(pipeline - compute - comm_exposed - pp_exposed, 0.0), "dp": dp_time, "optimizer": optimizer,
            "cp": m * step.layers * cp_layer, "ep": m * step.layers * ep_layer}
    memory = _memory(model, setup, step, psi, psi_layers, shard)
    links = {dim: _link_name(step.spans[dim]) for dim in ("tp", "pp", "dp", "cp")}
    links["ep"] = _link_name(_ep_span(setup.layout, hw.devices_per_node))
    comm = {"tp": tp_bytes, "pp": hop_bytes, "dp": grads, "cp": cp_bytes, "ep": ep_bytes}
    return Estimate(model, hw, setup, global_batch, m, time, memory, links, comm)


@dataclass(frozen=True)
class _Step:
    """What every dimension's price reads: the step's shape on one rank."""
    m: int  # micro-batches per step
    tokens: int  # this rank's share of a micro-batch's tokens (b·s/cp)
    layers: int  # layers on the fullest stage (uneven when pp·v does not divide the layers)
    v: int  # model chunks per rank: the interleaved schedule's virtual stages, else 1
    sp: bool  # sequence parallel inside a TP group of more than one rank
    spans: dict  # (ranks per node, nodes) of rank 0's group along tp, pp, dp and cp


def _step(model: Transformer, hw: Hardware, setup: Setup, global_batch: int) -> _Step:
    lay = setup.layout
    v = setup.virtual if setup.schedule == "interleaved" else 1
    return _Step(m=global_batch // (lay.dp * setup.micro_batch), tokens=setup.micro_batch * model.seq_len // lay.cp,
                 layers=-(-model.layers // (lay.pp * v)) * v, v=v, sp=setup.sequence_parallel and lay.tp > 1,
                 spans={dim: _span(lay, dim, hw.devices_per_node) for dim in ("tp", "pp", "dp", "cp")})


@dataclass(frozen=True)
class _Rates:
    """What one GPU sustains for each kind of kernel: FLOP/s, or bytes/s for memory-bound ones."""
    matmul: float  # hw.flops × hw.mfu: the logit layer, selective recomputation's scores
    blocks: float  # the blocks' matmuls: the matmul rate, FP8_MATMUL_SPEEDUP times it under fp8
    attention: float  # the attention kernels: flash attention's own rate (hw.attention), else the matmul rate
    memory: float  # hw.mem_bw: memory-bound ops and the optimizer step


def _rates(hw: Hardware, setup: Setup) -> _Rates:
    matmul = hw.flops * hw.mfu
    return _Rates(matmul, matmul * (FP8_MATMUL_SPEEDUP[gpu_family(hw)] if setup.fp8 else 1.0),  # plan checks the GPU
                  hw.flops * (hw.attention or hw.mfu) if setup.flash else matmul, hw.mem_bw)


def _layer_compute(model: Transformer, setup: Setup, step: _Step, rates: _Rates) -> tuple[float, float, float]:
    """(forward, backward, the forward's attention kernels) seconds of one layer for one
    micro-batch on one rank: matmuls, attention scores and memory-bound ops; the backward twice
    the forward (2.5 times for flash attention's scores, which it recomputes), plus what
    ``setup.recompute`` runs again."""
    tp, tokens = setup.layout.tp, step.tokens
    gemm = 2 * tokens * model.layer_weights / tp
    scores = 4 * tokens * model.seq_len * model.hidden / tp * (0.5 if setup.flash else 1.0)
    local, attn_bytes = memory_bound_bytes(model, tp, step.sp, setup.flash, setup.fused)
    mem_fwd = tokens * (local + attn_bytes) / rates.memory
    fwd = gemm / rates.blocks + scores / rates.attention + mem_fwd
    bwd = 2 * gemm / rates.blocks + (2.5 if setup.flash else 2.0) * scores / rates.attention + 2 * mem_fwd
    if setup.recompute == "full":
        bwd += fwd
    elif setup.recompute == "selective" and not setup.flash:
        bwd += scores / rates.matmul + tokens * attn_bytes / rates.memory
    elif setup.recompute == "op":  # the even-numbered matmuls and every memory-bound op, forward again
        again = 2 * tokens * sum(weights for _, weights in _matmuls(model, tp)[1::2])
        bwd += again / rates.blocks + tokens * local / rates.memory
    return fwd, bwd, scores / rates.attention


def _tensor_parallel(model: Transformer, hw: Hardware, setup: Setup, step: _Step) -> tuple[float, float]:
    """(exposed seconds per layer per micro-batch, bytes per collective) of tensor parallelism: 2
    all-reduces of the layer's activations forward and 2 backward (+2 when full recomputation
    reruns the forward); sequence parallelism's reduce-scatter + all-gather pairs cost the same."""
    tp_bytes = step.tokens * model.hidden * BYTES
    calls = 4 + (2 if setup.recompute == "full" else 0)
    return (calls * _allreduce(hw, tp_bytes, step.spans["tp"]) if setup.layout.tp > 1 else 0.0), tp_bytes


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


def _expert_parallel(model, hw, lay, tokens, per_node, recompute) -> tuple[float, float]:
    """(seconds per layer per micro-batch, averaged over the layers, forward and backward, bytes
    per all-to-all) of the experts' dispatch and combine: tokens·hidden·top_k bytes each way."""
    if lay.ep == 1 or model.moe_share == 0:
        return 0.0, 0.0
    S = tokens * model.hidden * model.top_k * BYTES
    passes = 3 if recompute == "full" else 2
    return model.moe_share * 2 * passes * _all_to_all(hw, S, lay.ep, _ep_span(lay, per_node)), S


def _logits(model: Transformer, setup: Setup, step: _Step, rates: _Rates) -> float:
    """Seconds of the logit layer (forward and backward matmuls) and its fp32 cross-entropy on the last stage."""
    tokens, tp, V = step.tokens, setup.layout.tp, model.vocab
    return 3 * 2 * tokens * V * model.hidden / tp / rates.matmul + 5 * 4 * tokens * V / tp / rates.memory


def _pipeline(model: Transformer, hw: Hardware, setup: Setup, step: _Step, stage_seconds: float,
              logits: float) -> tuple[float, float, float]:
    """(the pipeline's step seconds, seconds of one micro-batch's hops, bytes per hop).

    One activation per micro-batch and chunk each way, split over the TP group (Megatron's
    scatter/gather, or sequence parallel), on the link between neighbouring stages, not hidden.
    Stages are equal (``stage_seconds``: one micro-batch's compute and layer communication) but the
    last also runs the logits: (m-1)·slowest + every stage once, the fill and drain shrunk v-fold
    by interleaving."""
    pp, v = setup.layout.pp, step.v
    hop_bytes = step.tokens * model.hidden * BYTES / setup.layout.tp
    hops = 0.0
    if pp > 1:
        link = hw.inter_node if step.spans["pp"][1] > 1 and hw.inter_node is not None else hw.p2p
        hops = 2 * v * link.time(hop_bytes)
    slowest = stage_seconds + hops + logits
    every_stage = pp * (stage_seconds + hops) + logits
    return step.m * slowest + (every_stage - slowest) / v, hops, hop_bytes


def _stage_parameters(model: Transformer, lay: Layout, layers: int) -> tuple[float, float]:
    """(the fullest stage's layer parameters, the parameters one rank of it holds): the first stage
    holds the embedding, the last the output layer (or a copy of the tied embedding when pp > 1);
    experts split ep ways, the rest tp ways."""
    psi_layers = layers * (model.layer_parameters - model.expert_parameters * (1 - 1 / lay.ep))
    psi_first = psi_layers + model.embedding_parameters + (model.head_parameters if lay.pp == 1 else 0)
    psi_last = psi_layers + model.head_parameters + (model.vocab * model.hidden if model.tied else 0)
    return psi_layers, (psi_first if lay.pp == 1 else max(psi_first, psi_last)) / lay.tp


def _data_parallel(hw: Hardware, setup: Setup, step: _Step, grads: float, fwd: float, bwd: float,
                   logits: float) -> tuple[float, int]:
    """(exposed seconds per step, the ranks ZeRO shards over) of data parallelism and ZeRO.

    The gradients (``grads`` bytes) are reduced, and ZeRO shards, over the dp·cp ranks that hold
    the same weights. ZeRO 0-1: once per step, after the last micro-batch's backward (hidden behind
    it when ``overlap_dp``); ZeRO-2: reduce-scatter every micro-batch during backward; ZeRO-3 also
    all-gathers the weights for forward and again for backward, a layer ahead (FSDP's prefetch).
    HSDP (``setup.shard``): ZeRO within groups of ``shard`` DP ranks, whose replicas all-reduce
    each shard once per step, behind the last backward."""
    lay, per_node, layers, m = setup.layout, hw.devices_per_node, step.layers, step.m
    dp, cp = lay.dp, lay.cp
    shard = setup.shard if 0 < setup.shard < dp and setup.zero >= 1 else dp * cp
    if dp * cp == 1:
        return 0.0, shard
    stride = lay.rank(dp=1) - lay.rank()
    span = (_strided_span(shard, stride, per_node) if cp == 1 or shard < dp * cp else
            (step.spans["cp"][0] * step.spans["dp"][0], step.spans["cp"][1] * step.spans["dp"][1]))
    if setup.zero <= 1:
        reduce = _allreduce(hw, grads, span) if setup.zero == 0 else 2 * _reduce_scatter(hw, grads, span)
        last_backward = layers * bwd
        dp_time = max(0.0, reduce - last_backward) if setup.overlap_dp else reduce
    else:
        unit = _reduce_scatter(hw, grads, span)
        if setup.zero == 3:  # backward gathers the weights again unless forward kept them
            again = 2 if setup.reshard_after_forward else 1
            exposed = max(0.0, unit - layers * fwd) + max(0.0, again * unit - layers * bwd - logits)
        else:
            exposed = max(0.0, unit - layers * bwd)
        dp_time = m * exposed + (unit if setup.zero == 2 else 0.0)  # ZeRO-2: all-gather the new weights once
    if shard < dp * cp:
        replicas = _allreduce(hw, grads / shard, _strided_span(dp // shard, stride * shard, per_node))
        dp_time += max(0.0, replicas - layers * bwd) if setup.overlap_dp else replicas
    return dp_time, shard


def _memory(model: Transformer, setup: Setup, step: _Step, psi: float, psi_layers: float, shard: int) -> dict:
    """Bytes of the fullest rank by category: each candidate stage's model states and the
    activations it holds at once (stage 0: the embedding and the most micro-batches in flight; the
    last: the logits; an uneven split's first full stage), the largest of them."""
    tp, tokens, layers = setup.layout.tp, step.tokens, step.layers
    per_layer = tokens * activation_bytes(model, tp, step.sp, setup.recompute, setup.flash)
    transient = 0.0
    if setup.recompute == "full":  # the layer being recomputed holds its full activations for a moment
        transient = tokens * activation_bytes(model, tp, step.sp, "none", setup.flash)
    logit_bytes = 2 * 4 * tokens * model.vocab / tp  # fp32 logits and their gradient
    stages = ([(psi, layers * per_layer + logit_bytes)] if setup.layout.pp == 1 else
              _pipeline_stages(model, setup, step, psi_layers, per_layer, logit_bytes))

    def rank_memory(stage_psi, activations):
        states = formulas.zero_memory(max(stage_psi, 1.0), shard, setup.zero)
        if setup.zero == 3 and shard > 1:  # FSDP holds two layers' gathered weights and one layer's full
            # gradient (or, keeping them after forward, the whole stage's until its backward)
            states["parameters"] += (2 * model.layer_parameters / tp if setup.reshard_after_forward
                                     else stage_psi) * BYTES
            states["gradients"] += model.layer_parameters / tp * BYTES
        return {**states, "activations": activations + transient}

    return max((rank_memory(*st) for st in stages), key=lambda mem: sum(mem.values()))


def _pipeline_stages(model, setup, step, psi_layers, per_layer, logit_bytes) -> list[tuple[float, float]]:
    """(parameters on one rank, activations held at once) of the stages that may be the fullest:
    the first, the last and, in an uneven split, the first stage with every layer. The lighter
    stages (one layer fewer) go to the ends first, as Llama 3's (Dubey et al. 2024 §3.3.2): stage
    0, the last, then stage 1, ...; each holds ``formulas.inflight_activations`` micro-batches."""
    pp, tp, layers, v = setup.layout.pp, setup.layout.tp, step.layers, step.v
    per_layer_params = psi_layers / layers

    def stage(r, n, extra):  # stage r holding n layers (in v chunks) and ``extra`` parameters
        held = formulas.inflight_activations(setup.schedule, pp, step.m, r, v) * n / v * per_layer
        return (n * per_layer_params + extra) / tp, held + (logit_bytes if r == pp - 1 else 0.0)

    head = model.head_parameters + (model.vocab * model.hidden if model.tied else 0)
    light = pp * layers - model.layers
    heavy = (light + 1) // 2  # stages 0 .. heavy-1 are light
    stages = [stage(0, layers - (light > 0), model.embedding_parameters), stage(pp - 1, layers - (light > 1), head)]
    if 0 < heavy < pp - 1:
        stages.append(stage(heavy, layers, 0.0))
    return stages


# ---- which link a group talks over, and what a collective costs on it -----------------------------------

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


def _all_to_all(hw, S, n, span) -> float:
    """An all-to-all of S bytes per rank over n ranks: (n-1)/n of it leaves each rank, over the
    slowest link the group spans, in n-1 messages."""
    link = hw.inter_node if span[1] > 1 and hw.inter_node is not None else hw.collective
    return (n - 1) * link.alpha + S * (n - 1) / n * link.beta


def _ep_span(lay: Layout, per_node: int) -> tuple[int, int]:
    """(ranks per node, nodes) of an expert-parallel group: ep neighbouring DP ranks."""
    return _strided_span(lay.ep, lay.rank(dp=1) - lay.rank(), per_node) if lay.dp > 1 else (1, 1)


def _link_name(span) -> str:
    return "none" if span == (1, 1) else ("intra" if span[1] == 1 else "inter")


__all__ = ["Transformer", "MODELS", "transformer", "Setup", "Estimate", "estimate", "activation_bytes", "CP_ATTENTION",
           "memory_bound_bytes", "aligned", "whole_number", "USABLE_MEMORY"]
