"""The "mechanism in ~20 lines" that opens ``data_parallel.py``, ``sharded_optimizer.py`` and
``tensor_parallel.py`` is what a learner compares their own code against, so it must be true: each
sketch is run as written (its names supplied) on 2 ranks and lands where the real class, or the
single device, does.

Tolerance 1e-6: the sketch and the class sum the same per-rank values in the same order (one
bucket, one slice per rank), and the tensor-parallel MLP differs from one device only in how its
row layer's partial products are summed (float32 rounding, ~1e-7 at these sizes).
"""
import importlib
import math
import textwrap
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import mpkit
from mpkit.parallel import DataParallel, ShardedOptimizer
from mpkit.parallel.buckets import MiB, flat_views, plan_buckets

# the modules (``mpkit.parallel.tensor_parallel`` is also the name of a function there)
data_parallel, sharded_optimizer, tensor_parallel = (importlib.import_module(f"mpkit.parallel.{name}") for name in
                                                     ("data_parallel", "sharded_optimizer", "tensor_parallel"))

TOL = 1e-6


def sketch(module) -> str:
    """The code block after "The mechanism in ~N lines ...::" of ``module``'s docstring."""
    lines = module.__doc__.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("The mechanism in ~")
                 and any(later.rstrip().endswith("::") for later in lines[i:i + 3]))
    start = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith("::")) + 1
    block = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line)
    return textwrap.dedent("\n".join(block))


def mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def data(rank, world_size):
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    return x.tensor_split(world_size)[rank], y.tensor_split(world_size)[rank]


def params_after(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _data_parallel_rank(ctx):
    x, y = data(ctx.rank, ctx.world_size)
    model = mlp(seed=ctx.rank)  # each replica its own start: the sketch's broadcast must align them
    exec(sketch(data_parallel), {  # the docstring's code, as written
        "dist": dist, "MiB": MiB, "plan_buckets": plan_buckets, "flat_views": flat_views,
        "SimpleNamespace": SimpleNamespace, "model": model, "params": list(model.parameters()),
        "loss_fn": F.cross_entropy, "x_local": x, "y_local": y, "world_size": ctx.world_size,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)})
    real = mlp(seed=ctx.rank)
    dp, opt = DataParallel(real), torch.optim.SGD(real.parameters(), lr=0.1)
    F.cross_entropy(dp(x), y).backward()
    dp.finish_gradient_synchronization()
    opt.step()
    return (params_after(model) - params_after(real)).abs().max().item(), params_after(model)


def _sharded_optimizer_rank(ctx):
    x, y = data(ctx.rank, ctx.world_size)
    model = mlp(seed=0)
    params = list(model.parameters())
    names = {"torch": torch, "nn": nn, "dist": dist, "ceil": math.ceil, "flat_views": flat_views, "params": params,
             "numel": sum(p.numel() for p in params), "N": ctx.world_size, "r": ctx.rank}
    exec(sketch(sharded_optimizer), names)
    F.cross_entropy(model(x), y).backward()
    names["step"]()
    real = mlp(seed=0)
    opt = ShardedOptimizer(real.parameters(), torch.optim.AdamW, average_gradients=True)  # the sketch's defaults
    F.cross_entropy(real(x), y).backward()
    opt.step()
    # the averaged gradient slice too: Adam's update hardly sees a gradient's scale
    grads = (names["mine"].grad - opt.shard_parameters[0].grad).abs().max().item()
    return max((params_after(model) - params_after(real)).abs().max().item(), grads), (
        params_after(model) - params_after(mlp(seed=0))).abs().max().item()


def _tensor_parallel_rank(ctx):
    full = mlp(seed=0)
    up, act, down = full
    names = {"torch": torch, "dist": dist, "F": F, "up": up, "act": act, "down": down, "N": ctx.world_size,
             "r": ctx.rank}
    exec(sketch(tensor_parallel), names)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(3), requires_grad=True)
    names["mlp"](x).square().sum().backward()
    x_full = x.detach().clone().requires_grad_(True)
    out = full(x_full)
    out.square().sum().backward()
    return ((names["mlp"](x) - out).abs().max().item(), (x.grad - x_full.grad).abs().max().item())


@pytest.mark.timeout(120)
def test_data_parallel_sketch_steps_as_data_parallel_does():
    out = mpkit.launch(_data_parallel_rank, 2, timeout=100)
    for difference, _ in out:
        assert difference <= TOL
    assert torch.equal(out[0][1], out[1][1])  # and the replicas agree after the step


@pytest.mark.timeout(120)
def test_sharded_optimizer_sketch_steps_as_sharded_optimizer_does():
    for difference, moved in mpkit.launch(_sharded_optimizer_rank, 2, timeout=100):
        assert difference <= TOL
        assert moved > 1e-4  # it did take a step (AdamW's lr 1e-3 moves every weight ~1e-3)


@pytest.mark.timeout(120)
def test_tensor_parallel_sketch_computes_the_full_mlp():
    for out, grad in mpkit.launch(_tensor_parallel_rank, 2, timeout=100):
        assert out <= TOL and grad <= TOL
