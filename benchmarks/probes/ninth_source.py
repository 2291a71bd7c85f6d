"""What a ninth source does to the leave-one-source-out table (issue 31's "no source worse than
20 %"): NVIDIA NeMo 24.07's pre-training table on DGX-H100 (NVIDIA/NeMo
docs/source/performance/performance_summary.md @070a0bb: tokens/s per GPU, FP8, Megatron-Core with
Transformer Engine), added to benchmarks/published.py's 42 runs for this probe only.

It is not among published.py's validation RUNS because every row is FP8, priced here with
FP8_MATMUL_SPEEDUP, which was fitted to torchtitan's Float8 linears, not Transformer Engine's: the rows
test that speed-up and the H100 matmul rate together. (published.py's STACK_RUNS use the same rows to fit
stack "nemo"'s H100 rate, never to validate.) Nemotron-8B and -22B are left out (their shapes are not in
the table or a config we could cite); Nemotron-4 340B is priced and reported.

    python benchmarks/probes/ninth_source.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import published as P  # noqa: E402
from published import NEMO_TABLE, Run, Transformer, nemo_run  # noqa: E402

# Nemotron-4 340B (Nemotron-4 340B Technical Report, Table 1: 96 x 18432, 96 heads, 8 KV heads, squared-ReLU
# MLP of 73728, vocabulary 256000): in the table, but it does not fit the memory model as published
NEMOTRON_340B = Transformer(96, 18432, 96, 4096, 256000, ffn=73728, kv_heads=8, bias=False, dropout=False,
                            tied=False, learned_positions=False, name="Nemotron-4 340B")


def nemo_runs() -> list[Run]:
    """NeMo's table as Runs (published.nemo_run), Nemotron-4 340B included."""
    return [*(nemo_run(*row) for row in NEMO_TABLE),
            nemo_run("Nemotron-340B", 128, 32, 1, 8, 8, 1, 12, 322, model=NEMOTRON_340B)]


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
