"""What a ninth source does to the leave-one-source-out table (issue 31's "no source worse than
20 %"): NVIDIA NeMo 24.07's pre-training table on DGX-H100 (NVIDIA/NeMo
docs/source/performance/performance_summary.md @070a0bb: tokens/s per GPU, FP8, Megatron-Core with
Transformer Engine), added to benchmarks/published.py's 42 runs for this probe only.

It is not in published.py because every row is FP8, priced here with FP8_MATMUL_SPEEDUP, which was
fitted to torchtitan's Float8 linears, not Transformer Engine's: the rows test that speed-up and the
H100 matmul rate together. Nemotron-8B and -22B are left out (their shapes are not in the table or a
config we could cite); Nemotron-4 340B is priced and reported.

    python benchmarks/probes/ninth_source.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import published as P  # noqa: E402
from published import _LLAMA, LLAMA2, MEGATRON_ORDER, MODELS, Run, Transformer  # noqa: E402

SHAPES = {  # NeMo's configs: GPT-3 5B and 20B (24 x 4096 / 44 x 6144), Llama 2 (Touvron et al. 2023),
    # Nemotron-4 340B (Nemotron-4 340B Technical Report, Table 1: 96 x 18432, 96 heads, 8 KV heads,
    # squared-ReLU MLP of 73728, vocabulary 256000)
    "GPT3-5B": Transformer(24, 4096, 32, 2048, 51200, name="GPT-3 5B"),
    "GPT3-20B": Transformer(44, 6144, 48, 2048, 51200, name="GPT-3 20B"),
    "GPT3-175B": MODELS["gpt3-175b"],
    "LLAMA2-7B": Transformer(32, 4096, 32, 4096, 32000, ffn=11008, **_LLAMA, name="Llama 2 7B"),
    "LLAMA2-13B": LLAMA2["13b"], "LLAMA2-70B": LLAMA2["70b"],
    "LLAMA3-8B": MODELS["llama3-8b"], "LLAMA3-70B": MODELS["llama3-70b"],
    "Nemotron-340B": Transformer(96, 18432, 96, 4096, 256000, ffn=73728, kv_heads=8, bias=False, dropout=False,
                                 tied=False, learned_positions=False, name="Nemotron-4 340B"),
}
# (model, GPUs, global batch, micro-batch, TP, PP, CP, VP, tokens/s/GPU) as published
TABLE = [("GPT3-5B", 64, 2048, 4, 1, 1, 1, 1, 22521), ("GPT3-20B", 64, 256, 2, 2, 1, 1, 1, 5851),
         ("GPT3-175B", 128, 256, 1, 4, 8, 1, 6, 726), ("GPT3-175B", 512, 2048, 2, 4, 8, 1, 6, 782),
         ("LLAMA2-7B", 8, 128, 1, 1, 1, 1, 1, 16847), ("LLAMA2-13B", 16, 128, 1, 1, 4, 1, 10, 8646),
         ("LLAMA2-70B", 64, 128, 1, 4, 4, 1, 20, 1707), ("Nemotron-340B", 128, 32, 1, 8, 8, 1, 12, 322),
         ("LLAMA3-8B", 8, 128, 1, 1, 1, 2, 1, 12036), ("LLAMA3-70B", 64, 128, 1, 4, 4, 2, 5, 1533)]


def nemo_runs() -> list[Run]:
    """The table as Runs: Megatron-Core's distributed optimizer (ZeRO-1), sequence parallelism, flash
    attention, overlapped gradient reduction, no recomputation, PP outermost, ring CP."""
    runs = []
    for name, gpus, batch, micro, tp, pp, cp, vp, tokens in TABLE:
        setup = dict(fp8=True, zero=1, sequence_parallel=True, flash=True, overlap_dp=True, recompute="none",
                     tp=tp, pp=pp, cp=cp, micro_batch=micro, attention="ring",
                     **(dict(schedule="interleaved", virtual=vp) if vp > 1 else dict(schedule="1f1b") if pp > 1
                        else {}),
                     **(MEGATRON_ORDER if pp > 1 and gpus // (tp * pp * cp) > 1 else {}))
        runs.append(Run("NeMo 24.07 H100 (FP8)", f"{name}, {gpus} GPUs", SHAPES[name],
                        "Nx8xH100-ib" if gpus > 8 else "8xH100-nvlink", gpus, batch, tokens, "tokens_gpu", setup))
    return runs


def main():
    print("| run | published | predicted | error |\n|---|---:|---:|---:|")
    for run in nemo_runs():
        best = P.predict(run)
        if best is None:
            print(f"| {run.label} | {run.published:,} | does not fit as published | - |")
            continue
        predicted = P.metric(run, best.step_time)
        print(f"| {run.label} | {run.published:,} | {predicted:,.0f} | {P.throughput_error(run, predicted):+.1%} |")
        P.RUNS.append(run)  # the runs that fit join the leave-one-source-out fit
    print()
    P.print_leave_one_source_out()


if __name__ == "__main__":
    main()
