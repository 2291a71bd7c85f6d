"""The "mechanism in ~20 lines" that opens ``sequence_parallel.py``, ``context_parallel.py``,
``expert_parallel.py``, ``precision.py`` and ``recompute.py``, run as written (its names supplied)
on 2 ranks inside ``mpkit.launch`` and compared with the real function or class and, where one
exists, the single device. Each test says why its tolerance is what it is.
"""
import importlib
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import mpkit
from mpkit.models import MixtureOfExperts
from mpkit.parallel import (LossScaler, MixedPrecision, expert_parallel, recompute_layers, ring_attention,
                            sequence_parallel, ulysses_attention)

from test_parallel_sketches import mlp, params_after, sketch

# the modules (``sequence_parallel`` and ``expert_parallel`` are also the names of functions there)
sp_module, cp_module, ep_module, precision, recompute = (
    importlib.import_module(f"mpkit.parallel.{name}")
    for name in ("sequence_parallel", "context_parallel", "expert_parallel", "precision", "recompute"))


class NormMLP(nn.Module):
    """The block of the sequence-parallel sketch: ``x + down(act(up(norm(x))))``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.up, self.act, self.down = nn.LayerNorm(8), nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


def _sequence_parallel_rank(ctx):
    n, r = ctx.world_size, ctx.rank
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1))
    mine = x.chunk(n, dim=1)[r]
    whole = NormMLP()
    names = {"torch": torch, "dist": dist, "F": F, "N": n, "r": r, "norm": whole.norm, "up": whole.up,
             "act": whole.act, "down": whole.down}
    exec(sketch(sp_module), names)
    with torch.no_grad():
        ours = names["block"](mine)
        real = sequence_parallel(NormMLP(), {"up": "column", "down": "row"}, seq_dim=1)(mine)
        single = whole(x).chunk(n, dim=1)[r]
    return (ours - real).abs().max().item(), (ours - single).abs().max().item()


@pytest.mark.timeout(120)
def test_sequence_parallel_sketch_computes_the_block():
    # the row layer's partial products are summed by a reduce-scatter, on one device by one matmul:
    # float32 rounding (measured 2e-7 on values of order 1); a doubled bias or a lost shard is O(0.1)
    for to_real, to_single in mpkit.launch(_sequence_parallel_rank, 2, timeout=100):
        assert to_real <= 1e-6 and to_single <= 1e-6


def _context_parallel_rank(ctx):
    n, r = ctx.world_size, ctx.rank
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 8, 5, generator=g) for _ in range(3))  # [b, heads, s, d]: 4 heads, 8 tokens
    mine = [t.chunk(n, dim=2)[r] for t in (q, k, v)]  # block r of the sequence (the sketch's contiguous split)
    names = {"torch": torch, "dist": dist, "F": F, "math": math, "N": n, "r": r}
    exec(sketch(cp_module), names)
    single = F.scaled_dot_product_attention(q, k, v, is_causal=True).chunk(n, dim=2)[r]
    ring, ulysses = names["ring"](*mine), names["ulysses"](*mine)
    return ((ring - ring_attention(*mine, balanced=False)).abs().max().item(), (ring - single).abs().max().item(),
            (ulysses - ulysses_attention(*mine, balanced=False)).abs().max().item(),
            (ulysses - single).abs().max().item())


@pytest.mark.timeout(120)
def test_context_parallel_sketches_compute_causal_attention():
    # ring: softmax merged block by block through log-sum-exps, one device in one softmax (float32
    # rounding, measured 2e-7 on outputs of order 1); Ulysses runs the very same attention on whole heads
    # (equal up to the kernel's order of summation); a lost block or a wrong mask is O(1)
    for differences in mpkit.launch(_context_parallel_rank, 2, timeout=100):
        assert max(differences) <= 1e-6, differences


def moe(experts=4, top_k=2):
    """A mixture with room for every token (capacity_factor = experts: ``experts·t·k/experts`` slots,
    more than any expert can be chosen for), so the fixed-capacity class drops none, as the sketch."""
    torch.manual_seed(0)
    return MixtureOfExperts(6, experts, top_k, capacity_factor=experts)


def _expert_parallel_rank(ctx):
    n, r = ctx.world_size, ctx.rank
    x = torch.randn(4, 5, 6, generator=torch.Generator().manual_seed(3))  # [groups, tokens, h]
    mine = x.chunk(n)[r]  # this rank's share of the batch, as in data parallelism
    whole = moe()
    per = whole.num_experts // n
    names = {"torch": torch, "dist": dist, "F": F, "N": n, "E": whole.num_experts, "k": whole.top_k,
             "router": whole.router, "experts": whole.experts[r * per:(r + 1) * per], "x": mine.reshape(-1, 6)}
    with torch.no_grad():
        exec(sketch(ep_module), names)
        ours = names["y"].view_as(mine)
        real = expert_parallel(moe())(mine)
        single = whole(x).chunk(n)[r]
    return (ours - real).abs().max().item(), (ours - single).abs().max().item(), sum(whole.stats["load"]).item()


@pytest.mark.timeout(120)
def test_expert_parallel_sketch_mixes_the_experts():
    # the same expert matmuls on the same rows, in batches of other sizes (the class pads each expert
    # to its capacity): float32 rounding, measured 2e-8 on outputs of order 1; a row sent to the wrong expert
    # or weighted twice is O(0.1)
    for to_real, to_single, routed in mpkit.launch(_expert_parallel_rank, 2, timeout=100):
        assert to_real <= 1e-6 and to_single <= 1e-6
        assert routed == 4 * 5 * 2  # every (token, choice) was routed, none dropped


def _precision_rank(ctx, steps=4):
    g = torch.Generator().manual_seed(4 + ctx.rank)  # each rank its own data: the ranks hold other gradients
    batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(steps)]
    if ctx.rank == 1:
        batches[0] = (batches[0][0] * 1e5, batches[0][1])  # beyond fp16's 65504: inf on rank 1 only, step 0
    model, real = mlp(seed=0), mlp(seed=0)
    names = {"torch": torch, "dist": dist, "model": model, "loss_fn": F.cross_entropy, "scale": 2.0 ** 16,
             "good": 0, "growth_interval": 2, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    mp = MixedPrecision("fp16", LossScaler(2.0 ** 16, growth_interval=2))
    opt = torch.optim.SGD(real.parameters(), lr=0.1)
    mp.wrap([real])
    scales, skips = [], []
    for x, y in batches:
        scales.append(names["scale"])
        names.update(x=x, y=y)
        exec(sketch(precision), names)  # the names it sets (scale, good, found_inf) carry to the next step
        skips.append(bool(names["found_inf"].item()))
        names["optimizer"].zero_grad()
        mp.backward(F.cross_entropy(real(x), y))
        mp.step(opt, list(real.parameters()), group=dist.group.WORLD)
        opt.zero_grad()
    return (params_after(model) - params_after(real)).abs().max().item(), scales, skips, mp.report(), (
        params_after(model) - params_after(mlp(seed=0))).abs().max().item()


@pytest.mark.timeout(120)
def test_precision_sketch_scales_skips_and_steps_as_mixed_precision_does():
    # the same fp16 matmuls, scaling and fp32 steps in the same order: equal (measured 0.0); 1e-6 leaves
    # room for kernel choice, while a step taken or skipped wrongly moves the weights by ~1e-2
    for difference, scales, skips, report, moved in mpkit.launch(_precision_rank, 2, timeout=100):
        assert difference <= 1e-6
        assert scales == report["loss_scale"] == [2.0 ** 16, 2.0 ** 15, 2.0 ** 15, 2.0 ** 16]
        # step 0 overflowed on rank 1 only, and rank 0 skipped it too; then two good steps grow the scale
        assert skips == [True, False, False, False] and report["skipped_steps"] == [0]
        assert moved > 1e-3


def blocks_counting(calls):
    """Three small blocks; each run of a block's forward appends its index to ``calls`` (hooked on
    the block's first layer: ``recompute_layers`` reruns the block's ``forward``, not its hooks)."""
    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(3))
    for i, block in enumerate(blocks):
        block[0].register_forward_pre_hook(lambda module, args, i=i: calls.append(i))
    return blocks


def _recompute_rank(ctx):
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(5 + ctx.rank))
    runs, grads = {}, {}
    for how in ("sketch", "recompute_layers", "plain"):
        calls = runs[how] = []
        blocks = blocks_counting(calls)
        if how == "sketch":
            names = {"checkpoint": checkpoint, "blocks": blocks}
            exec(sketch(recompute), names)
            forward = names["forward"]
        else:
            if how == "recompute_layers":
                recompute_layers(blocks, "full")
            forward = nn.Sequential(*blocks)
        forward(x).square().sum().backward()
        grads[how] = torch.cat([p.grad.reshape(-1) for p in blocks.parameters()])
    return ({how: (grads[how] - grads["plain"]).abs().max().item() for how in grads}, runs)


@pytest.mark.timeout(120)
def test_recompute_sketch_runs_each_block_again_for_the_same_gradients():
    # recomputing a block runs the same float32 operations on the same input again: the same
    # gradients (measured 0.0; 1e-6 for kernel choice; a block whose saved input were wrong gives O(0.1))
    for differences, runs in mpkit.launch(_recompute_rank, 2, timeout=100):
        assert max(differences.values()) <= 1e-6
        assert runs["plain"] == [0, 1, 2]
        assert runs["sketch"] == runs["recompute_layers"] == [0, 1, 2, 2, 1, 0]  # forward, then again in backward
