"""The planner's cost model against published end-to-end training runs.

For each run: the model, GPUs, layout, batch and the software's documented features (sequence
parallelism, flash attention, recomputation, overlapped gradient reduction) are pinned as
published; what a paper does not state (micro-batch size, interleaving, recomputation where
unstated) is left to ``mpkit.sim.plan``, which picks the fastest setting that fits. The predicted
step time is turned into the paper's own metric (TFLOP/s per GPU by the paper's FLOP formula,
iteration seconds, or tokens/s) and compared as a throughput ratio; MAPE is printed. One
assumption set for every row (``mpkit.simulator.hardware``: datasheets, NCCL and FlashAttention-2
figures, and one sustained matmul efficiency per GPU fitted to a run held out of the MAPE), no
per-row factors; the same table at the best-case matmul efficiency (MAMF) is printed beside it.

Then ``plan`` runs again with only the software pinned (ZeRO stage, recomputation, sequence
parallelism, flash attention, overlap) and the layout free (dp, tp, pp, micro-batches, schedule):
does it choose the published layout family (TP inside a node, PP across nodes, ...)?

    python benchmarks/published.py              # the table, a few seconds
    python benchmarks/published.py --calibrate  # MATMUL_SUSTAINED from the two held-out runs
    python benchmarks/published.py --loso       # leave-one-source-out: each source predicted by
                                                # a matmul efficiency fitted on the other sources
    python benchmarks/published.py --stacks     # mpkit.simulator.hardware.STACKS, fitted per software
    python benchmarks/published.py --fp8        # FP8_MATMUL_SPEEDUP from torchtitan's Float8 rows

A run published with context parallelism pins its cp; the free search then searches cp too. The
family question is asked twice: the fastest layout's family, and the family of the simplest layout
(no pipeline, then no TP, ``LayoutTable.simplest``) priced within the model's own median error of
the fastest, the same band for every row.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field, replace

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/_common/machine.py

from _common.machine import load  # noqa: E402
from mpkit.sim import formulas  # noqa: E402
from mpkit.costmodel.analytic import MODELS, Transformer  # noqa: E402
from mpkit.simulator.hardware import MATMUL_BEST, MATMUL_SUSTAINED  # noqa: E402
from mpkit.simulator.machines import get_hardware  # noqa: E402
from mpkit.costmodel.plan import MEDIAN_ERROR, plan  # noqa: E402

# The training software each source describes (what its paper says it used)
MEGATRON_2021 = dict(sequence_parallel=False, flash=False, overlap_dp=False, recompute="full", zero=0)
MEGATRON_2022 = dict(flash=False, overlap_dp=False, zero=0)  # + sequence_parallel / recompute per row
DEEPSPEED_MTNLG = dict(sequence_parallel=False, flash=False, overlap_dp=False, recompute="full", zero=1,
                       schedule="1f1b")
# Llama 3 (Dubey et al. 2024 §3.3.2): FSDP that shards optimizer states and gradients but keeps the
# gathered weights from forward to backward ("we do not reshard after forward computation"), 8K sequences
# "without activation checkpointing" (the 128K row leaves recomputation to the planner), the first and
# last pipeline stages one layer lighter (the analytic model's rule for an uneven split), context
# parallelism by all-gathering K and V. Its pipeline schedule (interleaved, with a tunable number N of
# consecutive micro-batches between depth- and breadth-first) is left to the planner: the model knows
# Megatron's interleaving (N = PP), whose warm-up at 32 micro-batches (the 8,192-GPU row) holds more
# activations than an H100 fits without checkpointing
LLAMA3 = dict(sequence_parallel=True, flash=True, overlap_dp=True, zero=3, reshard_after_forward=False,
              attention="all-gather")
MOSAIC = dict(sequence_parallel=False, flash=True, overlap_dp=True, zero=3, tp=1, pp=1)  # FSDP: no TP/PP support
TORCHTITAN_FSDP = dict(sequence_parallel=False, flash=True, overlap_dp=True, zero=3, tp=1, pp=1)  # FSDP2, SDPA
# Rank orders as the stacks build them (mpkit.layout): Megatron-LM puts PP outermost (tp-cp-ep-dp-pp from
# the inside out, megatron/core/parallel_state.py's default order); Llama 3 405B used [TP, CP, PP, DP]
# from the inside out (Dubey et al. 2024 §3.3.2): DP outermost
MEGATRON_ORDER, LLAMA3_ORDER = dict(order="megatron"), dict(order="dp-pp-cp-tp")

# MPT shapes: mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml (ALiBi, no biases,
# GeLU MLP of 4x, vocab 50368, flash/triton attention)
_MPT = dict(vocab=50368, bias=False, dropout=False, learned_positions=False)
MPT = {"7b": Transformer(32, 4096, 32, **_MPT, name="MPT-7B"), "13b": Transformer(40, 5120, 40, **_MPT, name="MPT-13B"),
       "30b": Transformer(48, 7168, 56, **_MPT, name="MPT-30B"),
       "70b": Transformer(80, 8192, 64, **_MPT, name="MPT-70B")}


# Llama 2 shapes (Touvron et al. 2023, Table 1; SwiGLU widths 13824 / 28672 from the released configs),
# sequence 4096, vocabulary 32000, GQA with 8 key/value heads at 70B
_LLAMA = dict(gated=True, bias=False, dropout=False, tied=False, learned_positions=False)
LLAMA2 = {"13b": Transformer(40, 5120, 40, 4096, 32000, ffn=13824, **_LLAMA, name="Llama 2 13B"),
          "70b": Transformer(80, 8192, 64, 4096, 32000, ffn=28672, kv_heads=8, **_LLAMA, name="Llama 2 70B")}


def _gpt(layers, hidden, heads):
    return Transformer(layers, hidden, heads, 2048, 51200)


@dataclass
class Run:
    source: str
    label: str
    model: Transformer
    hardware: str
    gpus: int
    global_batch: int
    published: float
    metric: str  # "tflops": TFLOP/s per GPU by Megatron's eq. 3 (with recompute); "seconds": per iteration;
    # "tflops_6n": TFLOP/s per GPU by 6·params + attention per token; "tokens": tokens/s;
    # "tokens_gpu": tokens/s per GPU; "mfu": model FLOPs utilisation (a fraction of the dense peak)
    setup: dict = field(default_factory=dict)


RUNS = [
    # Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
    # Megatron-LM", Table 1 (weak scaling, Selene: DGX A100 80GB, 8 x 200 Gb/s HDR InfiniBand per
    # node; fp16, full activation recomputation, interleaved schedule with scatter/gather, data-
    # parallel all-reduce after the pipeline flush). Metric: achieved TFLOP/s per GPU by eq. 3.
    # Table rows as reproduced in SotaroKaneda/MLCarbon data/megatron_table.csv.
    *[Run("Narayanan 2021 T1", f"GPT {p}B", _gpt(l, h, a), "Nx8xA100-ib", n, B, tf, "tflops",
          dict(MEGATRON_2021, tp=t, pp=pp, **(MEGATRON_ORDER if pp > 1 and n // (t * pp) > 1 else {})))
      for p, a, h, l, t, pp, n, B, tf in [
          (1.7, 24, 2304, 24, 1, 1, 32, 512, 137), (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
          (7.5, 32, 4096, 36, 4, 1, 128, 512, 142), (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
          (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138), (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
          (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148), (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
          (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163), (1008, 160, 25600, 128, 8, 64, 3072, 3072, 163)]],
    # Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    # Table 4: iteration time (s) with full recomputation vs sequence parallel + selective
    # recomputation ("present work"), data-parallel size 1, A100 80GB (Selene). Times as quoted
    # by calculon-ai/calculon calculon/megatron/validation.py; layouts (tp, pp, batch, micro-batch,
    # interleaving) from its validation/*.json; shapes from Table 3 (its examples/*.json).
    *[Run("Korthikanti 2022 T4", f"{name} {mode}", MODELS[key] if key else _gpt(48, 6144, 64), "Nx8xA100-ib", n, B,
          secs, "seconds", dict(MEGATRON_2022, tp=8, pp=pp, micro_batch=mb, virtual=v if v > 1 else None,
                                schedule="interleaved" if v > 1 else "1f1b",
                                sequence_parallel=mode == "selective", recompute=mode))
      for name, key, pp, n, B, mb, v, full, sel in [
          ("22B", None, 1, 8, 4, 4, 1, 1.42, 1.10), ("175B", "gpt3-175b", 8, 64, 64, 1, 3, 18.13, 13.75),
          ("530B", "mt-nlg-530b", 35, 280, 280, 1, 3, 49.05, 37.83),
          ("1T", "megatron-1t", 64, 512, 512, 1, 1, 94.42, 71.49)]
      for mode, secs in (("full", full), ("selective", sel))],
    # Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", §2.4:
    # batch 1920 on 280 / 350 / 420 DGX A100 nodes, 60.1 / 50.2 / 44.4 s per iteration
    # (126 / 121 / 113 TFLOP/s per GPU); tp 8, pp 35 (as in cli99/llm-analysis
    # examples/megatron-turing-nlg, which quotes the paper); DeepSpeed 1F1B pipeline with ZeRO-1.
    *[Run("Smith 2022 §2.4", f"MT-NLG 530B, {n} GPUs", MODELS["mt-nlg-530b"], "Nx8xA100-ib", n, 1920, secs, "seconds",
          dict(DEEPSPEED_MTNLG, tp=8, pp=35, micro_batch=1))
      for n, secs in ((2240, 60.1), (2800, 50.2), (3360, 44.4))],
    # Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4: Llama 3 405B, 16M tokens per batch,
    # TP 8, PP 16 on 8,192 / 16,384 / 16,384 H100s (400 Gb/s RoCE per GPU): CP 1, DP 64 / 128, seq
    # 8,192 (32 / 16 sequences per DP group): 430 / 400 BF16 TFLOP/s per GPU (MFU 43 % / 41 %); and
    # CP 16, DP 8, seq 131,072 (16 sequences per DP group): 380 (38 %) (the table as quoted by
    # glennklockwood.com/garden/llama-3.1 from Balaji's SC'24 slides and by the paper's copies)
    *[Run("Dubey 2024 T4", f"Llama 3 405B, {n} GPUs{', CP 16, 128K' if cp > 1 else ''}",
          replace(MODELS["llama3-405b"], seq_len=seq), "Nx8xH100-ib", n, dp * per_dp, tf, "tflops_6n",
          dict(LLAMA3, tp=8, pp=16, cp=cp, micro_batch=1, **(dict(recompute="none") if cp == 1 else {}),
               **LLAMA3_ORDER))
      for n, cp, dp, seq, per_dp, tf in ((8192, 1, 64, 8192, 32, 430), (16384, 1, 128, 8192, 16, 400),
                                         (16384, 16, 8, 131072, 16, 380))],
    # MosaicML, mosaicml/llm-foundry scripts/train/benchmarking/README.md ("MPT Training
    # Benchmarks"): FSDP FULL_SHARD (ZeRO-3) data parallel only, flash attention; tokens/s as
    # published. A100 80GB / 40GB nodes: 1600 Gbps RoCE per node (= 200 Gb/s per GPU).
    *[Run("MosaicML llm-foundry", f"{key.upper()} {seq} x {n} {gpu}", replace(MPT[key], seq_len=seq), hw, n, batch,
          tokens, "tokens", dict(MOSAIC, micro_batch=mb, recompute="full" if ckpt else "none"))
      for key, seq, n, gpu, hw, mb, batch, tokens, ckpt in [
          ("70b", 2048, 64, "A100-80GB", "Nx8xA100-ib", 8, 2048, 26274, True),
          ("30b", 2048, 8, "A100-80GB", "8xA100-nvlink", 3, 504, 7330, True),
          ("13b", 2048, 8, "A100-80GB", "8xA100-nvlink", 2, 48, 18097, False),
          ("7b", 2048, 8, "A100-80GB", "8xA100-nvlink", 6, 96, 37130, False),
          ("13b", 2048, 128, "A100-40GB", "Nx8xA100-40GB-ib", 16, 2048, 252444, True),
          ("70b", 2048, 64, "H100", "Nx8xH100-ib", 8, 2048, 66523, True),
          ("13b", 2048, 64, "H100", "Nx8xH100-ib", 2, 128, 307209, False),
          ("7b", 2048, 8, "H100", "8xH100-nvlink", 6, 48, 85144, False)]],
    # torchtitan, pytorch/torchtitan docs/performance.md (commit 0413364): FSDP2 (1D, ZeRO-3) on 64 A100
    # 80GB, local batch size 1 (Llama 3) or 2 (Llama 2) per GPU, so global batch 64 or 128; WPS = tokens
    # per second per GPU as published. "selective op" checkpointing keeps the attention output and every
    # other matmul's output and recomputes the rest: recompute="op". The A100 cluster's network is not
    # stated: priced as HDR InfiniBand, one NIC per GPU. Run eagerly (fused=False): the 64-A100 presets
    # (train_configs/llama2_13b.toml @0c355e6, "a preset for 64 A100 GPUs") set compile = false and
    # norm_type = "rmsnorm" (the PyTorch-ops RMSNorm, not the fused one)
    *[Run("torchtitan A100", f"{model.name}, {ac} AC, 64 A100", model, "Nx8xA100-ib", 64, 64 * lbs, wps,
          "tokens_gpu", dict(TORCHTITAN_FSDP, micro_batch=lbs,
                             recompute={"selective op": "op", "full": "full", "no": "none"}[ac], fused=False))
      for model, lbs, ac, wps in [
          (MODELS["llama3-8b"], 1, "selective op", 2973), (MODELS["llama3-70b"], 1, "full", 331),
          (LLAMA2["13b"], 2, "no", 2162), (LLAMA2["13b"], 2, "selective op", 1904),
          (LLAMA2["70b"], 2, "full", 353)]],
    # torchtitan, pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3 (the
    # bf16 rows; Float8 rows left out): Llama 3.1 8B, 1D FSDP, local batch 2, selective (op-level)
    # activation checkpointing, on Grand Teton H100s (96GB HBM2e, 500 W cap: the "H100-96GB" preset), 8
    # and 128 GPUs, eager (fused=False: one kernel per op) and torch.compile (fused); TPS/GPU as published
    *[Run("torchtitan H100", f"Llama 3.1 8B, {n} H100-96GB{', compiled' if compiled else ''}", MODELS["llama3-8b"],
          "Nx8xH100-96GB-ib" if n > 8 else "8xH100-96GB-nvlink", n, 2 * n, tps, "tokens_gpu",
          dict(TORCHTITAN_FSDP, micro_batch=2, recompute="op", fused=compiled))
      for n, compiled, tps in [(8, False, 5762), (8, True, 6667), (128, False, 5605), (128, True, 6514)]],
    # BLOOM 176B (BigScience): bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm: 48
    # nodes of 8 A100 80GB, TP 4, PP 12 (so DP 8), micro-batch 2, global batch 2048, 70 layers of 14336,
    # 112 heads, seq 2048, ALiBi, vocab padded to 250880, activation checkpointing, bf16 with
    # Megatron-DeepSpeed's own ZeRO-1 equivalent; Jean Zay's four 100 Gb/s Omni-Path links per node
    # ("Nx8xA100-opa"). Throughput "about 150 TFLOPs" per GPU (bigscience.notion.site "BigScience 176B
    # Model"), taken as Megatron's formula with recomputation, which Megatron-DeepSpeed logs.
    Run("BigScience BLOOM", "BLOOM 176B, 384 A100", Transformer(70, 14336, 112, 2048, 250880, dropout=False,
                                                                 learned_positions=False, name="BLOOM 176B"),
        "Nx8xA100-opa", 384, 2048, 150, "tflops",
        dict(sequence_parallel=False, flash=False, overlap_dp=False, recompute="full", zero=1, tp=4, pp=12,
             micro_batch=2, schedule="1f1b", **MEGATRON_ORDER)),
]


# Sources that set a training stack's matmul rate on a GPU where the runs above have none of that stack
# (mpkit.simulator.hardware.STACKS; `--stacks` fits them with the rest). They are never in RUNS: the MAPE,
# the family count and the leave-one-source-out table above never see them, so no rate is judged on the
# runs it was fitted to. Layouts a source does not state are the planner's choice, as above.
# Megatron-Core as the Megatron-LM README runs it: the distributed optimizer (ZeRO-1; --overlap-param-gather
# needs it), sequence parallelism (--tp-comm-overlap needs it), fused (flash) attention, overlapped gradient
# reduction, PP outermost
MEGATRON_CORE = dict(sequence_parallel=True, flash=True, overlap_dp=True, zero=1, **MEGATRON_ORDER)
GPT3_131K = replace(MODELS["gpt3-175b"], seq_len=4096, vocab=131072, name="GPT-3 175B (vocab 131,072, seq 4096)")
# NVIDIA NeMo 24.07's pre-training table on DGX-H100 (NVIDIA/NeMo docs/source/performance/
# performance_summary.md @070a0bb): Megatron-Core with Transformer Engine, every row FP8 (priced fp8=True,
# with FP8_MATMUL_SPEEDUP, which torchtitan's Float8 rows fitted): the rate is the bf16 matmul rate that,
# with that speed-up, gives NeMo's FP8 throughput. Shapes: NeMo's GPT-3 5B and 20B configs (24 x 4096 /
# 44 x 6144), Llama 2 (Touvron et al. 2023), Llama 3. Left out: Nemotron-8B and -22B (shapes neither in the
# table nor in a config we could cite) and Nemotron-4 340B (does not fit the memory model as published;
# benchmarks/probes/ninth_source.py prices it)
NEMO_SHAPES = {
    "GPT3-5B": Transformer(24, 4096, 32, 2048, 51200, name="GPT-3 5B"),
    "GPT3-20B": Transformer(44, 6144, 48, 2048, 51200, name="GPT-3 20B"),
    "GPT3-175B": MODELS["gpt3-175b"],
    "LLAMA2-7B": Transformer(32, 4096, 32, 4096, 32000, ffn=11008, **_LLAMA, name="Llama 2 7B"),
    "LLAMA2-13B": LLAMA2["13b"], "LLAMA2-70B": LLAMA2["70b"],
    "LLAMA3-8B": MODELS["llama3-8b"], "LLAMA3-70B": MODELS["llama3-70b"],
}
# (model, GPUs, global batch, micro-batch, TP, PP, CP, VP, tokens/s/GPU) as published
NEMO_TABLE = [("GPT3-5B", 64, 2048, 4, 1, 1, 1, 1, 22521), ("GPT3-20B", 64, 256, 2, 2, 1, 1, 1, 5851),
              ("GPT3-175B", 128, 256, 1, 4, 8, 1, 6, 726), ("GPT3-175B", 512, 2048, 2, 4, 8, 1, 6, 782),
              ("LLAMA2-7B", 8, 128, 1, 1, 1, 1, 1, 16847), ("LLAMA2-13B", 16, 128, 1, 1, 4, 1, 10, 8646),
              ("LLAMA2-70B", 64, 128, 1, 4, 4, 1, 20, 1707), ("LLAMA3-8B", 8, 128, 1, 1, 1, 2, 1, 12036),
              ("LLAMA3-70B", 64, 128, 1, 4, 4, 2, 5, 1533)]


def nemo_run(name, gpus, batch, micro, tp, pp, cp, vp, tokens, model=None) -> Run:
    """A row of NEMO_TABLE as a Run: Megatron-Core's distributed optimizer (ZeRO-1), sequence
    parallelism, flash attention, overlapped gradient reduction, no recomputation, PP outermost, ring CP."""
    setup = dict(fp8=True, zero=1, sequence_parallel=True, flash=True, overlap_dp=True, recompute="none",
                 tp=tp, pp=pp, cp=cp, micro_batch=micro, attention="ring",
                 **(dict(schedule="interleaved", virtual=vp) if vp > 1 else dict(schedule="1f1b") if pp > 1 else {}),
                 **(MEGATRON_ORDER if pp > 1 and gpus // (tp * pp * cp) > 1 else {}))
    return Run("NeMo 24.07 H100 (FP8)", f"{name}, {gpus} GPUs", model or NEMO_SHAPES[name],
               "Nx8xH100-ib" if gpus > 8 else "8xH100-nvlink", gpus, batch, tokens, "tokens_gpu", setup)


STACK_RUNS = [
    # NVIDIA/Megatron-LM README.md @0010ab7, "Training Speed and Scalability": "the standard GPT-3 model (our
    # version has slightly more than 175 billion parameters due to larger vocabulary size)", vocabulary
    # 131,072, sequence 4096, strong scaled "from 96 H100 GPUs to 4608 GPUs, using the same batch size of
    # 1152 sequences", MFU "from 47% to 42%" (model FLOPs, no recomputation, of the bf16 dense peak)
    *[Run("Megatron-LM README H100", f"GPT-3 175B, vocab 131K, {n} H100", GPT3_131K, "Nx8xH100-ib", n, 1152, mfu,
          "mfu", MEGATRON_CORE) for n, mfu in ((96, 0.47), (4608, 0.42))],
    *[nemo_run(*row) for row in NEMO_TABLE],
]


def metric(run: Run, step_time: float) -> float:
    """The run's published metric for a step of ``step_time`` seconds."""
    m, tokens = run.model, run.global_batch * run.model.seq_len
    if run.metric == "seconds":
        return step_time
    if run.metric == "tokens":
        return tokens / step_time
    if run.metric == "tokens_gpu":
        return tokens / step_time / run.gpus
    if run.metric == "tflops":
        flops = formulas.megatron_flops(run.global_batch, m.seq_len, m.layers, m.hidden, m.vocab, recompute=True)
        return flops / step_time / run.gpus / 1e12
    if run.metric == "tflops_6n":  # 6 FLOPs per parameter per token + the attention scores
        flops = (6 * m.parameters + 12 * m.layers * m.seq_len * m.hidden) * tokens
        return flops / step_time / run.gpus / 1e12
    if run.metric == "mfu":  # model FLOPs (Megatron's formula without recomputation) over the dense peak
        flops = formulas.megatron_flops(run.global_batch, m.seq_len, m.layers, m.hidden, m.vocab, recompute=False)
        return flops / step_time / run.gpus / get_hardware(run.hardware).flops
    raise ValueError(run.metric)


def throughput_error(run: Run, predicted: float) -> float:
    """Predicted over published throughput, minus one (seconds per iteration inverted first), so
    every row's error means the same: +10 % = the model is 10 % too optimistic."""
    if run.metric == "seconds":
        return run.published / predicted - 1
    return predicted / run.published - 1


LAYOUT = ("dp", "tp", "pp", "cp", "micro_batch", "schedule", "virtual")  # what the family question frees


def family(e) -> str:
    """Where a layout puts TP and PP (the planner's links, read from the same Layout)."""
    place = {"none": "no {}", "intra": "{} in node", "inter": "{} across nodes"}
    return f"{place[e.links['tp']].format('TP')}, {place[e.links['pp']].format('PP')}"


CALIBRATION = {"A100": "7B 2048 x 8 A100-80GB", "H100": "7B 2048 x 8 H100"}  # held out: they fix MATMUL_SUSTAINED


def validation_errors() -> list[float]:
    """|error| of every run but the calibration ones, the published layout priced as pinned: the
    numbers behind the MAPE and behind the planner's ``MEDIAN_ERROR``."""
    return [abs(throughput_error(run, metric(run, predict(run).step_time))) for run in RUNS
            if run.label != CALIBRATION[gpu_of(run)]]


def gpu_of(run: Run) -> str:
    return "A100" if "A100" in run.hardware else "H100"


def predict(run: Run, matmul: float | None = None, **software):
    """The fastest layout ``plan`` finds within what ``run`` pins (its own setup unless
    ``software`` replaces the pins), optionally with the matmul efficiency replaced."""
    return table(run, matmul, **software).best


def table(run: Run, matmul: float | None = None, **software):
    """``plan``'s whole table for ``run`` (as ``predict``)."""
    hw = get_hardware(run.hardware)
    if matmul is not None:
        hw = replace(hw, mfu=matmul)
    return plan(run.model, hw, run.gpus, run.global_batch, **(software or run.setup))


def free_table(run: Run):
    """``plan`` with only the run's software pinned: dp, tp, pp, micro-batches and the schedule free
    (cp too, searched where the run used context parallelism)."""
    software = {k: v for k, v in run.setup.items() if k not in LAYOUT}
    return table(run, **software, cp="search" if run.setup.get("cp", 1) > 1 else 1)


def calibrate() -> dict:
    """MATMUL_SUSTAINED: for each GPU the matmul efficiency at which its calibration run's
    predicted throughput equals the published one (bisection; the error falls as it falls)."""
    out = {}
    for gpu, label in CALIBRATION.items():
        run = next(r for r in RUNS if r.label == label)
        lo, hi = 0.2, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            err = throughput_error(run, metric(run, predict(run, mid).step_time))
            lo, hi = (lo, mid) if err > 0 else (mid, hi)
        out[gpu] = round((lo + hi) / 2, 3)
    return out


GRID = tuple(round(0.30 + 0.02 * i, 2) for i in range(31))  # matmul efficiencies 0.30 ... 0.90


def error_grid(runs=None) -> dict:
    """{run index: [throughput error at each GRID efficiency]}: each run of ``runs`` (default RUNS)
    priced as published (its pins) with the matmul efficiency of its GPU set to each value."""
    return {i: [throughput_error(run, metric(run, predict(run, eff).step_time)) for eff in GRID]
            for i, run in enumerate(RUNS if runs is None else runs)}


def leave_one_source_out(grid: dict) -> dict:
    """{source: (efficiency fitted per GPU without it, [its runs' errors])}. For each source and
    each GPU its runs use, the matmul efficiency is the GRID value with the least mean absolute
    error over the *other* sources' runs on that GPU; the source is then predicted at it. A source
    whose GPU no other source ran on cannot be predicted this way (None)."""
    out = {}
    for source in dict.fromkeys(r.source for r in RUNS):
        fitted, errors = {}, []
        for i, run in enumerate(RUNS):
            if run.source != source:
                continue
            gpu = gpu_of(run)
            if gpu not in fitted:
                others = [j for j, r in enumerate(RUNS) if r.source != source and gpu_of(r) == gpu]
                fitted[gpu] = None if not others else min(
                    range(len(GRID)), key=lambda k: statistics.mean(abs(grid[j][k]) for j in others))
            k = fitted[gpu]
            errors.append(None if k is None else grid[i][k])
        out[source] = ({g: (None if k is None else GRID[k]) for g, k in fitted.items()}, errors)
    return out


# torchtitan's Float8 rows beside their bf16 twins (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1
# and 3, both torch.compile'd): (GPUs, bf16 TPS/GPU, Float8 TPS/GPU). They fit FP8_MATMUL_SPEEDUP and so
# are not among the RUNS that test it
FP8_PAIRS = [(8, 6667, 8532), (128, 6514, 8380)]


def fit_fp8() -> float:
    """The blocks' FP8 matmul speed-up at which the model's Float8/bf16 step-time ratio, averaged
    over FP8_PAIRS, equals the published one (bisection)."""
    from mpkit.simulator import hardware

    def setup(n):
        return dict(model=MODELS["llama3-8b"], hardware="Nx8xH100-96GB-ib" if n > 8 else "8xH100-96GB-nvlink",
                    gpus=n, global_batch=2 * n, micro_batch=2, recompute="op", **TORCHTITAN_FSDP)

    bf16_step = {n: plan(**setup(n)).best.step_time for n, _, _ in FP8_PAIRS}  # the speed-up prices fp8 only

    def predicted_ratio(n, speedup):
        old = hardware.FP8_MATMUL_SPEEDUP["H100"]
        hardware.FP8_MATMUL_SPEEDUP["H100"] = speedup
        try:
            return bf16_step[n] / plan(**setup(n), fp8=True).best.step_time
        finally:
            hardware.FP8_MATMUL_SPEEDUP["H100"] = old

    target = statistics.mean(fp8 / bf16 for _, bf16, fp8 in FP8_PAIRS)
    lo, hi = 1.0, 2.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if statistics.mean(predicted_ratio(n, mid) for n, _, _ in FP8_PAIRS) < target else (lo, mid)
    return round((lo + hi) / 2, 2)


# the training software each source ran (mpkit.simulator.hardware.STACKS)
STACK_OF = {"Narayanan 2021 T1": "megatron", "Korthikanti 2022 T4": "megatron", "Smith 2022 §2.4": "deepspeed",
            "Dubey 2024 T4": "llama3", "MosaicML llm-foundry": "llm-foundry", "torchtitan A100": "torchtitan",
            "torchtitan H100": "torchtitan", "BigScience BLOOM": "deepspeed",
            "Megatron-LM README H100": "megatron", "NeMo 24.07 H100 (FP8)": "nemo"}


def print_stacks():
    """STACKS' efficiencies: per stack and GPU, the GRID value (at most MATMUL_BEST) with the least
    mean absolute error over that stack's rows (RUNS and the STACK_RUNS that only fit rates); then,
    out of sample, each source of a stack and GPU with several predicted from the others
    (Megatron-LM's two papers; DeepSpeed's MT-NLG and BLOOM)."""
    runs = RUNS + STACK_RUNS
    grid, groups = error_grid(runs), {}
    for i, run in enumerate(runs):
        groups.setdefault((STACK_OF[run.source], gpu_of(run)), []).append(i)

    def best(rows, gpu):
        allowed = [k for k, eff in enumerate(GRID) if eff <= MATMUL_BEST[gpu]]
        return min(allowed, key=lambda k: statistics.mean(abs(grid[j][k]) for j in rows))

    print("| stack | GPU | runs | fitted matmul efficiency | MAPE at it |\n|---|---|---:|---:|---:|")
    for (stack, gpu), rows in groups.items():
        k = best(rows, gpu)
        mape = statistics.mean(abs(grid[j][k]) for j in rows)
        print(f"| {stack} | {gpu} | {len(rows)} | {GRID[k]:.2f} | {mape:.1%} |")
    print()
    for (stack, gpu), rows in groups.items():  # out of sample: each source of a stack from its other sources
        sources = list(dict.fromkeys(runs[i].source for i in rows))
        for check in sources if len(sources) > 1 else ():
            k = best([i for i in rows if runs[i].source != check], gpu)
            print(f"{stack} on {gpu} fitted without {check} ({GRID[k]:.2f}) predicts it: MAPE "
                  f"{statistics.mean(abs(grid[j][k]) for j in rows if runs[j].source == check):.1%}")


def print_leave_one_source_out():
    start = time.time()
    result = leave_one_source_out(error_grid())
    print("\n| source | runs | GPUs | matmul efficiency fitted without it | MAPE predicting it | max |")
    print("|---|---:|---|---|---:|---:|")
    pooled, worst = [], 0.0
    for source, (fitted, errors) in result.items():
        known = [abs(e) for e in errors if e is not None]
        pooled += known
        worst = max([worst, statistics.mean(known)] if known else [worst])
        gpus = ", ".join(sorted(fitted))
        effs = ", ".join(f"{g} {'-' if v is None else f'{v:.2f}'}" for g, v in sorted(fitted.items()))
        mape = f"{statistics.mean(known):.1%}" if known else "- (no other source on this GPU)"
        print(f"| {source} | {len(errors)} | {gpus} | {effs} | {mape} | {max(known):.1%} |" if known else
              f"| {source} | {len(errors)} | {gpus} | {effs} | {mape} | - |")
    print(f"\nLeave-one-source-out MAPE {statistics.mean(pooled):.1%} over {len(pooled)} runs from "
          f"{len(result)} sources (each source predicted with constants fitted on the others; grid "
          f"{GRID[0]}-{GRID[-1]}); worst source {worst:.1%}. {time.time() - start:.0f} s")


def main():
    if "--calibrate" in sys.argv:
        print("MATMUL_SUSTAINED =", calibrate())
        return
    if "--fp8" in sys.argv:
        print("FP8_MATMUL_SPEEDUP = {'H100':", fit_fp8(), "}")
        return
    if "--stacks" in sys.argv:
        print_stacks()
        return
    if "--loso" in sys.argv:
        print_leave_one_source_out()
        return
    start = time.time()
    print(f"# {platform.node()}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{load()}; matmul efficiency {MATMUL_SUSTAINED} (sustained, calibrated) vs "
          f"{ {k: round(v, 3) for k, v in MATMUL_BEST.items()} } (best-case MAMF)")
    print("| source | run | GPUs | layout (dp x pp x tp), micro-batches, recompute | metric | published | "
          "predicted | error | error at MAMF | plan's choice | published family | plan's family |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|---|---|---|")
    errors, best_case, same, families = [], [], [], []
    for run in RUNS:
        best = predict(run)
        free_plan = free_table(run)
        free = free_plan.best
        unit = {"tflops": "TFLOP/s/GPU", "tflops_6n": "TFLOP/s/GPU", "seconds": "s/iteration", "tokens": "tokens/s",
                "tokens_gpu": "tokens/s/GPU"}
        if best is None:
            print(f"| {run.source} | {run.label} | {run.gpus} | pinned layout does not fit | {unit[run.metric]} | "
                  f"{run.published:g} | - | - | - | - | - | - |")
            continue
        predicted = metric(run, best.step_time)
        err = throughput_error(run, predicted)
        at_best = throughput_error(run, metric(run, predict(run, MATMUL_BEST[gpu_of(run)]).step_time))
        held_out = run.label == CALIBRATION[gpu_of(run)]
        if not held_out:
            errors.append(abs(err))
            best_case.append(abs(at_best))
        lay = best.setup.layout
        pub_family, plan_family = family(best), (family(free) if free else "nothing fits")
        same.append(pub_family == plan_family)
        families.append((pub_family, free_plan))
        choice = "-" if free is None else (f"{free.setup.layout.dp}x{free.setup.layout.pp}x{free.setup.layout.tp}"
                                           f"{f', CP {free.setup.layout.cp}' if free.setup.layout.cp > 1 else ''}"
                                           f"{f', ZeRO-{free.setup.zero}' if free.setup.zero else ''}"
                                           f"{', PP outermost' if free.setup.layout.dims[0] == 'pp' else ''}")
        outer = ", PP outermost" if lay.dims[0] == "pp" and lay.dp > 1 and lay.pp > 1 else ""
        outer += f", CP {lay.cp}" if lay.cp > 1 else ""
        print(f"| {run.source} | {run.label} | {run.gpus} | {lay.dp} x {lay.pp} x {lay.tp}{outer}, "
              f"{best.micro_batches}x{best.setup.micro_batch}, {best.setup.recompute} | {unit[run.metric]} | "
              f"{run.published:,.4g} | {predicted:,.4g} | {err:+.1%}{' (calibration)' if held_out else ''} | "
              f"{at_best:+.1%} | {choice} | {pub_family} | {plan_family} |")
    print(f"\nMAPE {statistics.mean(errors):.1%} over {len(errors)} runs from "
          f"{len({r.source for r in RUNS})} sources (median {statistics.median(errors):.1%}, max {max(errors):.1%}; "
          f"the {len(CALIBRATION)} calibration runs excluded); with the best-case MAMF efficiency instead: "
          f"{statistics.mean(best_case):.1%}. plan picks the published layout family in {sum(same)} of "
          f"{len(same)} runs. {time.time() - start:.0f} s")
    simple = [pub == family(free_plan.recommended) for pub, free_plan in families]
    print(f"The planner's recommendation (LayoutTable.recommended: the layout with the fewest dimensions within "
          f"MEDIAN_ERROR = {MEDIAN_ERROR:.1%} of the fastest; the median error measured here: "
          f"{statistics.median(errors):.1%}) has the published family in {sum(simple)} of {len(simple)} runs.")


if __name__ == "__main__":
    main()
