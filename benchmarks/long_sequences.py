"""Sequence, context and expert parallelism on 2 simulated (CPU/gloo) ranks, next to PyTorch's own
where PyTorch has one.

(a) Mechanisms, forward + backward of one layer, timed inside the ranks (a barrier before each
    repetition, the median over repetitions of rank 0's time):
    - sequence parallelism: a pre-LayerNorm MLP block sequence-sharded by ``mpkit.parallel.sequence_parallel``
      against torch's ``parallelize_module`` with ``SequenceParallel`` + Colwise/RowwiseParallel(Shard(1));
    - ring, all-gather (Llama 3) and Ulysses attention against full attention (SDPA) on one device:
      torch's ``context_parallel`` shards only CUDA kernels and does not run on CPU
      (tests/test_parallel_cp.py); and the check every call makes first (one small all-gather that
      the ranks agree on shapes and options), alone, forward only;
    - the expert-parallel MoE layer against the same layer on one device (torch has no MoE layer).
(b) Strategies, ``Run.step_times`` (median of steps 2.., median over runs): sp against tp, cp (ring,
    Ulysses) against single, ep against single. Compared variants take turns (``benchmarks/_common/turns.py``).

Every measurement is taken twice (``--repeat 2``, the default): the spread between the two is the
noise floor. Memory tracking is off.

    python benchmarks/long_sequences.py [--runs 3] [--reps 20] [--mechanisms-only]
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import OrderedDict
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import mpkit
from mpkit.models import MixtureOfExperts
from mpkit.parallel import (all_gather_attention, all_reduce_sequence_parallel_gradients, expert_parallel,
                            ring_attention, sequence_parallel, shard_sequence, ulysses_attention)
from mpkit.parallel.ring_functions import agree, options
from _common.turns import medians_taking_turns

WORLD = 2
B, S, H, HEADS = 8, 256, 128, 8
MODEL = dict(model="gpt", hidden=128, layers=4, seq_len=64, batch_size=16, heads=4)


def mlp_block(h=H) -> nn.Sequential:
    """LayerNorm, then a column/row pair: the sequence-parallel region and the TP layers of one MLP."""
    return nn.Sequential(OrderedDict(ln=nn.LayerNorm(h), up=nn.Linear(h, 4 * h), act=nn.GELU(), down=nn.Linear(4 * h, h)))


def timed(fn, reps):
    """Median seconds of ``fn()`` over ``reps`` repetitions after one warm-up, every rank starting together."""
    fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sp_block(ctx, which, reps):
    torch.manual_seed(0)
    block = mlp_block()
    x = torch.randn(B, S, H).chunk(ctx.world_size, 1)[ctx.rank].contiguous().requires_grad_()
    if which == "ours":
        sequence_parallel(block, {"up": "column", "down": "row"}, seq_dim=1)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                       parallelize_module)
        parallelize_module(block, init_device_mesh("cpu", (ctx.world_size,)),
                           {"ln": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                            "down": RowwiseParallel(output_layouts=Shard(1))})

    def step():
        block(x).sum().backward()
        if which == "ours":
            all_reduce_sequence_parallel_gradients(block)
    return timed(step, reps)


def attention(ctx, which, reps):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, HEADS, S, H // HEADS, generator=g) for _ in range(3))
    if which == "one device":  # the whole sequence on rank 0 alone, the others idle at the barrier
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        fn = (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()) if ctx.rank == 0 \
            else (lambda: None)
    elif which == "agree check":  # what every call adds: one small all-gather of the shapes and options
        q, k = (shard_sequence(t, dim=2) for t in (q, k))
        opts = options(q, k, k, None, True, None, None, "bhsd", None, (-1, -1), None, 0.0, "attention", "ring")
        fn = lambda: agree(q, k, opts, None)  # noqa: E731
    else:
        q, k, v = (shard_sequence(t, dim=2).requires_grad_() for t in (q, k, v))
        attend = {"ring": ring_attention, "all-gather": all_gather_attention, "ulysses": ulysses_attention}[which]
        fn = lambda: attend(q, k, v).sum().backward()  # noqa: E731
    return timed(fn, reps)


def moe(ctx, which, reps):
    torch.manual_seed(0)
    layer = MixtureOfExperts(H, 8, 2, 1.25)
    x = torch.randn(B, S // 4, H)
    if which == "one device":
        fn = (lambda: layer(x).sum().backward()) if ctx.rank == 0 else (lambda: None)
    else:
        layer = expert_parallel(layer)
        mine = x.tensor_split(ctx.world_size)[ctx.rank]
        fn = lambda: layer(mine).sum().backward()  # noqa: E731
    return timed(fn, reps)


def mechanism(fn, which, reps):
    return mpkit.launch(fn, WORLD, args=(which, reps), trace=False, memory=False)[0]


def strategy_step(strategy, world, steps, **options):
    run = mpkit.train(strategy, world, steps=steps, memory=False, **MODEL, **options)
    return statistics.median(run.step_times()[1:])


def measure(runs, reps, steps, strategies=True):
    rows = []
    for title, fn, labels in (("sequence parallel MLP block (b=8, s=256, h=128)", sp_block, ("ours", "torch")),
                              ("causal attention (b=8, 8 heads, s=256, d=16)", attention,
                               ("ring", "all-gather", "ulysses", "one device", "agree check")),
                              ("MoE layer, 8 experts, top-2, cf 1.25 (b=8, s=64, h=128)", moe, ("ours", "one device"))):
        t = medians_taking_turns({label: partial(mechanism, fn, label, reps) for label in labels}, runs)
        rows.append((title, t))
    if not strategies:
        return rows
    for title, variants in (("train sp vs tp (2 ranks)", {"sp": ("sp", 2, {}), "tp": ("tp", 2, {})}),
                            ("train cp vs single", {"cp ring": ("cp", 2, {}), "cp ulysses": ("cp", 2, {"attention": "ulysses"}),
                                                    "single": ("single", 1, {})}),
                            ("train ep (8 experts) vs single", {"ep": ("ep", 2, {"experts": 8, "top_k": 2}),
                                                               "single": ("single", 1, {"experts": 8, "top_k": 2})})):
        t = medians_taking_turns({label: partial(strategy_step, s, w, steps, **o) for label, (s, w, o) in variants.items()},
                                 runs)
        rows.append((title, t))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=2, help="the whole measurement again: the noise floor")
    parser.add_argument("--mechanisms-only", action="store_true", help="(a) only, not the strategies (b)")
    args = parser.parse_args(argv)
    print(f"{WORLD} ranks; mechanisms: median of {args.reps} repetitions, median over {args.runs} runs; "
          f"strategies: {MODEL}, median of steps 2..{args.steps}, median over {args.runs} runs")
    results = [measure(args.runs, args.reps, args.steps, not args.mechanisms_only) for _ in range(args.repeat)]
    for k, (title, _) in enumerate(results[0]):
        print(f"\n{title}")
        for label in results[0][k][1]:
            print(f"  {label:<12} " + "  ".join(f"{r[k][1][label] * 1e3:8.2f} ms" for r in results))


if __name__ == "__main__":
    main()
