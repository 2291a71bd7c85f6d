"""The models, data and single-device runs the ``mpkit.parallel`` tests (``test_parallel_*.py``)
compare with: an ordinary model a learner would write, with a frozen layer, tied weights, an
unused branch, parameter groups, AdamW with weight decay and torch's default ``zero_grad()``.

Every parallel run is compared with the single-device run of the same model, data and optimizer,
and with PyTorch's own implementation of the mechanism (DDP, ZeroRedundancyOptimizer).
Tolerance: data parallelism sums the same per-sample gradients in another order (each rank's
shard mean, then the mean over ranks), so values differ in the last float32 bits; after 5 AdamW
steps at lr 1e-2 that stays below 1e-5 (measured: ~1e-7).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import mpkit
from mpkit.parallel import DataParallel, ShardedOptimizer

ATOL = 1e-5


STEPS, BATCH = 5, 8


class Net(nn.Module):
    """Embedding tied to the output layer, a frozen projection, an unused branch."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(8, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(self.body(self.frozen(self.emb(idx).mean(1))))


def make_net(seed=0):
    torch.manual_seed(seed)
    return Net()


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, 16, (BATCH, 4), generator=g), torch.randint(0, 16, (BATCH,), generator=g)


def shard(t, rank, world):
    return t.tensor_split(world)[rank]


def param_groups(model):
    """Weight decay on matrices only: two groups, as real training scripts do."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def plain_loop(model, opt, make_batch, steps):
    """The single-device loop every parity test compares with; the losses."""
    losses = []
    for step in range(steps):
        x, y = make_batch(step)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def single_run(steps=STEPS):
    model = make_net()
    losses = plain_loop(model, torch.optim.AdamW(param_groups(model), lr=1e-2), batch, steps)
    return losses, state(model)


REFERENCE = single_run()


def assert_matches_single(out, world_size):
    ref_losses, ref_state = REFERENCE
    start = state(make_net())
    for rank in range(world_size):
        losses, params = out[rank]
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= ATOL
        for name, tensor in ref_state.items():
            assert (params[name] - tensor).abs().max().item() <= ATOL, (rank, name)
        for name in ("frozen.weight", "frozen.bias", "unused.weight", "unused.bias"):
            assert torch.equal(params[name], start[name]), (rank, name)  # never moved, bit for bit


def train_replicated(ctx_rank, world_size, wrap, make_opt, sync):
    """Every rank builds the net from its own seed (the wrapper must broadcast rank 0's)."""
    model = make_net(seed=ctx_rank)
    wrapped = wrap(model)
    opt = make_opt(model)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(wrapped(shard(x, ctx_rank, world_size)), shard(y, ctx_rank, world_size))
        loss.backward()
        sync(wrapped)
        opt.step()
        opt.zero_grad()  # torch's default: set_to_none=True
        mean = torch.tensor([loss.item()])
        dist.all_reduce(mean)
        losses.append(mean.item() / world_size)
    return losses, state(model)


def data_parallel_rank(ctx, bucket_mb, overlap, sharded):
    def wrap(model):
        return DataParallel(model, bucket_mb=bucket_mb, overlap=overlap, find_unused_parameters=True)

    def make_opt(model):
        if sharded:
            return ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2)
        return torch.optim.AdamW(param_groups(model), lr=1e-2)

    return train_replicated(ctx.rank, ctx.world_size, wrap, make_opt, lambda dp: dp.finish_gradient_synchronization())


class Block(nn.Module):
    """A transformer-style MLP block, the shape tensor parallelism splits."""

    def __init__(self, width=16):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential()
        self.mlp.up = nn.Linear(width, 4 * width)
        self.mlp.act = nn.GELU()
        self.mlp.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def deep_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), Block(), Block(), nn.Tanh(), Block(), nn.Linear(16, 5))


def regression_batch(step, size=BATCH):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(size, 6, generator=g), torch.randint(0, 5, (size,), generator=g)


def train_deep(model, steps=3):
    """AdamW with weight decay on the whole batch of each step; the losses."""
    return plain_loop(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), regression_batch, steps)


def single_deep():
    model = deep_net()
    return train_deep(model), state(model)


def deep_data(step, batch_size):
    return regression_batch(step, batch_size)


class HalfAndFull(nn.Module):
    """A bf16 layer feeding an fp32 one: a bucket or a flat shard is one tensor of one dtype."""

    def __init__(self):
        super().__init__()
        self.low = nn.Linear(4, 4).to(torch.bfloat16)
        self.full = nn.Linear(4, 2)

    def forward(self, x):
        return self.full(self.low(x.to(torch.bfloat16)).float())


def half_and_full():
    torch.manual_seed(0)
    return HalfAndFull()


def with_buffer(rank):
    """nn.Linear(4, 4) with a rank-local buffer of the rank's own size."""
    layer = nn.Linear(4, 4)
    layer.register_buffer("seen", torch.zeros(1 + rank))
    return layer


def raised(make) -> str:
    """What ``make()`` raised (a ValueError or TypeError) as "Type: message", or "accepted"."""
    try:
        make()
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def assert_every_rank_raises(bad_input_rank, case, message, world_size=2):
    """Run ``bad_input_rank(ctx, case)`` (which returns ``raised(...)``) on every rank of a fresh
    world and check each rank's reply carries ``message``."""
    for reply in mpkit.launch(bad_input_rank, world_size, args=(case,), timeout=50):
        assert message in reply, reply
