"""Checkpoints of every ``mpkit.parallel`` mechanism, in one 4-rank world: ``DataParallel``,
``ShardedOptimizer`` (ZeRO-1, over the whole world and over the dp groups of a dp x tp mesh),
``tensor_parallel``, ``pipeline``, FSDP2's ``fully_shard`` and ``expert_parallel``.

For each: N steps in one go equal K steps, save, a freshly built (differently initialised) copy
loaded, N-K steps, bit for bit (tolerance 0: after the load every rank computes the same ops on the
same values in the same order). Then each checkpoint, loaded into the one-device model (the
resharding from 4 ranks to 1), equals the one-device run of K steps within ``parallel_models.ATOL``
(the parallel run summed the same gradients in another order)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import mpkit
from mpkit.models import MixtureOfExperts
from mpkit.parallel import DataParallel, ShardedOptimizer, expert_parallel, pipeline, tensor_parallel
from mpkit.parallel import checkpoint
from mpkit.parallel.expert_parallel import synchronize_expert_gradients
from parallel_models import ATOL, batch, deep_net, make_net, param_groups, regression_batch, shard

K, N, WORLD = 2, 4, 4


# ---- the cases: (build(ctx, seed) -> (module, optimizer, step(k)), the one-device run) ----

def _net_step(model, wrapped, opt, rank, world, sync=None):
    def step(k):
        x, y = batch(k)
        F.cross_entropy(wrapped(shard(x, rank, world)), shard(y, rank, world)).backward()
        if sync:
            sync()
        opt.step()
        opt.zero_grad()
    return step


def dp_case(ctx, seed):
    model = make_net(seed)
    dp = DataParallel(model, find_unused_parameters=True)
    opt = torch.optim.AdamW(param_groups(model), lr=1e-2)
    return dp, opt, _net_step(model, dp, opt, ctx.rank, WORLD, dp.finish_gradient_synchronization)


def zero1_case(ctx, seed):
    model = make_net(seed)
    dp = DataParallel(model, find_unused_parameters=True)
    opt = ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2)
    return model, opt, _net_step(model, dp, opt, ctx.rank, WORLD, dp.finish_gradient_synchronization)


def fsdp_case(ctx, seed):
    model = make_net(seed)
    fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
    opt = torch.optim.AdamW(param_groups(model), lr=1e-2)
    return model, opt, _net_step(model, model, opt, ctx.rank, WORLD)


def _deep_step(module, opt, rank, world, run):
    def step(k):
        x, y = regression_batch(k)
        run(module, shard(x, rank, world), shard(y, rank, world))
        opt.step()
        opt.zero_grad()
    return step


def tp_zero_case(ctx, seed):
    """dp=2 x tp=2: every Block's MLP split over tp, AdamW's state over dp (ZeRO-1 averaging itself)."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = deep_net() if seed == 0 else _reseeded(deep_net, seed)
    tensor_parallel(model, {"*.mlp.up": "column", "*.mlp.down": "row"}, mesh.get_group("tp"))
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, group=mesh.get_group("dp"), average_gradients=True,
                           lr=1e-2, weight_decay=0.1)
    opt.broadcast_parameters(model)
    return model, opt, _deep_step(model, opt, mesh.get_local_rank("dp"), 2,
                                  lambda m, x, y: F.cross_entropy(m(x), y).backward())


def pp_case(ctx, seed):
    layers = deep_net() if seed == 0 else _reseeded(deep_net, seed)
    pipe = pipeline(layers, schedule="1f1b", micro_batches=2, loss_fn=F.cross_entropy)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2, weight_decay=0.1)
    return pipe, opt, _deep_step(pipe, opt, 0, 1, lambda p, x, y: p.step(x, y))


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.moe = MixtureOfExperts(8, experts=4, top_k=1, capacity_factor=4.0)
        self.out = nn.Linear(8, 5)

    def forward(self, x):
        h = self.embed(x)[:, None, :]  # [batch, 1 token, hidden]: one group per sample
        return self.out(h + self.moe(h))[:, 0]


def experts(seed=0):
    torch.manual_seed(seed)
    return Experts()


def ep_case(ctx, seed):
    model = expert_parallel(experts(seed))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def run(m, x, y):
        F.cross_entropy(m(x), y).backward()
        synchronize_expert_gradients(m)
    return model, opt, _deep_step(model, opt, ctx.rank, WORLD, run)


def _reseeded(make, seed):
    torch.manual_seed(seed)
    model = make()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))  # another initialisation: the load must replace all of it
    return model


CASES = {"dp": dp_case, "zero1": zero1_case, "fsdp": fsdp_case, "dp x tp zero1": tp_zero_case, "pp": pp_case,
         "ep": ep_case}


def local_state(module, opt) -> list[torch.Tensor]:
    """This rank's parameters and optimizer state tensors, as it holds them."""
    inner = opt.inner if isinstance(opt, ShardedOptimizer) else opt
    tensors = [p.detach() for p in module.parameters()]
    tensors += [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)]
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]


def resume_rank(ctx, directory):
    """Every case on this rank: the largest |difference| between N steps in one go and K, save,
    a fresh copy loaded, N-K (0.0 when exact); and the bytes this rank read."""
    out = {}
    for name, case in CASES.items():
        module, opt, step = case(ctx, 0)
        for k in range(K):
            step(k)
        path = directory / name.replace(" ", "_")
        checkpoint.save(path, module, opt, step=K)
        for k in range(K, N):
            step(k)
        again, again_opt, again_step = case(ctx, 1)
        loaded = checkpoint.load(path, again, again_opt)
        for k in range(loaded.step, N):
            again_step(k)
        diffs = [(a - b).abs().max().item() for a, b in zip(local_state(module, opt), local_state(again, again_opt))]
        out[name] = (len(diffs), max(diffs), loaded.read.needed_bytes)
    return out


# ---- the one-device runs each checkpoint is compared with: seed 0 trains, seed 1 is loaded into ----

def single_net(seed):
    model = make_net(seed)
    opt = torch.optim.AdamW(param_groups(model), lr=1e-2)
    return model, opt, _net_step(model, model, opt, 0, 1)


def single_deep(seed):
    model = deep_net() if seed == 0 else _reseeded(deep_net, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, opt, _deep_step(model, opt, 0, 1, lambda m, x, y: F.cross_entropy(m(x), y).backward())


def single_experts(seed):
    model = experts(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt, _deep_step(model, opt, 0, 1, lambda m, x, y: F.cross_entropy(m(x), y).backward())


SINGLE = {"dp": single_net, "zero1": single_net, "fsdp": single_net, "dp x tp zero1": single_deep, "pp": single_deep,
          "ep": single_experts}


@pytest.mark.timeout(240)
def test_every_mechanism_resumes_exactly_and_reshards_to_one_device(tmp_path):
    results = mpkit.launch(resume_rank, WORLD, args=(tmp_path,), timeout=200)
    for rank, out in enumerate(results):
        for name, (count, diff, needed) in out.items():
            assert count > 0 and diff == 0.0, (rank, name, diff)
            assert needed > 0, (rank, name)
    for name, make in SINGLE.items():
        reference, ref_opt, ref_step = make(0)
        for k in range(K):
            ref_step(k)
        loaded, opt, _ = make(1)
        assert checkpoint.load(tmp_path / name.replace(" ", "_"), loaded, opt).step == K
        for (pname, p), q in zip(reference.named_parameters(), loaded.parameters()):
            assert (p - q).abs().max().item() <= ATOL, (name, pname)
        for p, q in zip(reference.parameters(), loaded.parameters()):
            for key, value in ref_opt.state.get(p, {}).items():
                assert (value - opt.state[q][key]).abs().max().item() <= ATOL, (name, key)
