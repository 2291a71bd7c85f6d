"""Ring attention in bf16: output and gradient error against float64, for mpkit's ring, a reference
ring and torch's own bf16 attention on one device (the BENCHMARKS.md table "Ring attention in bf16").

- **mpkit** (``ring_attention(..., split="contiguous")``, N ranks in ``mpkit.launch``): fp32
  scores, statistics and accumulators, one rounding to bf16 at the end.
- **mpkit before** (``--before``, default the commit this work started from, b1fc4c4): the same
  ring with its running max, sum and output kept in the input dtype. Loaded from git.
- **reference**: ring-flash-attention's algorithm on torch's CPU flash kernel
  (``benchmarks/_common/ring_flash_reference.py``, which says which file and commit it follows): each block
  computed by the flash kernel (bf16 output, fp32 log-sum-exp), merged in fp32.
- **torch SDPA bf16**: ``F.scaled_dot_product_attention`` on the whole sequence, one device.

Inputs as ring-flash-attention's tests draw them (normal, bf16; batch 1, 5 heads, head_dim 128),
sequence 1024, seeds 0.. (``--seeds``), world sizes 2 and 4, causal and not; the contiguous split,
the reference's. Errors are against attention in float64 on the same bf16-rounded inputs: mean
over the elements (then over seeds) and max (over elements and seeds); gradients = dq, dk, dv
together. The numbers are deterministic (no timing): a second run prints the same.

    python benchmarks/ring_attention_bf16.py [--seeds 5] [--seq 1024] [--before b1fc4c4]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import types
from pathlib import Path

import torch

import mpkit
from mpkit.parallel import ring_attention, shard_sequence
from _common.ring_flash_reference import errors, inputs, reference_ring, sdpa_bf16, truth

REPO = Path(__file__).resolve().parents[1]


def old_ring(rev: str):
    """``ring_attention`` as it was at ``rev`` (its module source from git, run in a fresh module)."""
    source = subprocess.run(["git", "show", f"{rev}:mpkit/parallel/context_parallel.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("context_parallel_before")
    exec(compile(source, f"{rev}:context_parallel.py", "exec"), module.__dict__)
    return module.ring_attention


def _ranks(ctx, seeds, seq, causal, before):
    """Every seed's shard of output, lse and gradients from mpkit's ring (and the old one)."""
    runs = {"mpkit": lambda q, k, v: ring_attention(q, k, v, causal=causal, split="contiguous", return_lse=True)}
    if before:
        old = old_ring(before)
        runs["mpkit before"] = lambda q, k, v: (old(q, k, v, causal=causal, balanced=False), None)
    out = {}
    for label, run in runs.items():
        for seed in seeds:
            q, k, v, d = inputs(seed, seq=seq)
            q, k, v = (shard_sequence(t, dim=2, split="contiguous").requires_grad_() for t in (q, k, v))
            y, lse = run(q, k, v)
            y.backward(shard_sequence(d, dim=2, split="contiguous"))
            out[label, seed] = [y.detach(), lse, q.grad, k.grad, v.grad]
    return out


def gathered(results, key):
    """Whole tensors from every rank's contiguous shard."""
    return [None if results[0][key][i] is None else torch.cat([r[key][i] for r in results], dim=2) for i in range(5)]


def measure(seeds, seq, before):
    rows = []
    for world in (2, 4):
        for causal in (True, False):
            results = mpkit.launch(_ranks, world, args=(seeds, seq, causal, before), timeout=600, trace=False,
                                   memory=False)
            found = {}
            for seed in seeds:
                q, k, v, d = inputs(seed, seq=seq)
                want = truth(q, k, v, d, causal)
                labels = [label for label, s in results[0] if s == seed]
                for label in labels:
                    found.setdefault(label, []).append(errors(gathered(results, (label, seed)), want))
                found.setdefault("reference", []).append(errors(reference_ring(q, k, v, d, world, causal), want))
                found.setdefault("torch SDPA bf16", []).append(errors(sdpa_bf16(q, k, v, d, causal), want))
            rows.append((world, causal, {label: summary(e) for label, e in found.items()}))
    return rows


def summary(per_seed: list) -> dict:
    return {key: (statistics.mean if "mean" in key else max)(e[key] for e in per_seed) for key in per_seed[0]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--before", default="b1fc4c4", help="a git revision, or '' to leave the old ring out")
    args = parser.parse_args(argv)
    rows = measure(list(range(args.seeds)), args.seq, args.before)
    print(f"bf16, batch 1, 5 heads, head_dim 128, seq {args.seq}, {args.seeds} seeds; |error| vs float64: "
          f"mean (over elements, then seeds) / max (over elements and seeds)")
    print(f"{'N':>2} {'causal':<6} {'implementation':<16} {'out mean':>9} {'out max':>9} {'grad mean':>9} "
          f"{'grad max':>9} {'lse max':>9}   out/ref  grad/ref")
    for world, causal, found in rows:
        ref = found["reference"]
        for label, e in found.items():
            lse = f"{e['lse max']:9.2e}" if "lse max" in e else f"{'-':>9}"
            print(f"{world:>2} {str(causal):<6} {label:<16} {e['out mean']:9.2e} {e['out max']:9.2e} "
                  f"{e['grad mean']:9.2e} {e['grad max']:9.2e} {lse}   {e['out mean'] / ref['out mean']:6.2f}x "
                  f"{e['grad mean'] / ref['grad mean']:6.2f}x")


if __name__ == "__main__":
    main()
