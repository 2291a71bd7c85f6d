"""``mpkit.parallel`` on an ordinary model a learner would write: a frozen layer, tied weights, an
unused branch, parameter groups, AdamW with weight decay and torch's default ``zero_grad()``.

Every parallel run is compared with the single-device run of the same model, data and optimizer,
and with PyTorch's own implementation of the mechanism (DDP, ZeroRedundancyOptimizer).
Tolerance: data parallelism sums the same per-sample gradients in another order (each rank's
shard mean, then the mean over ranks), so values differ in the last float32 bits; after 5 AdamW
steps at lr 1e-2 that stays below 1e-5 (measured: ~1e-7).
"""
import pickle

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import pytest

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


def _data_parallel_rank(ctx, bucket_mb, overlap, sharded):
    def wrap(model):
        return DataParallel(model, bucket_mb=bucket_mb, overlap=overlap, find_unused_parameters=True)

    def make_opt(model):
        if sharded:
            return ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2)
        return torch.optim.AdamW(param_groups(model), lr=1e-2)

    return train_replicated(ctx.rank, ctx.world_size, wrap, make_opt, lambda dp: dp.finish_gradient_synchronization())


def _torch_rank(ctx, zero):
    """The same training with PyTorch's DDP, and ZeroRedundancyOptimizer when ``zero``."""
    def make_opt(model):
        groups = param_groups(model)
        if not zero:
            return torch.optim.AdamW(groups, lr=1e-2)
        opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW, lr=1e-2,
                                      weight_decay=0.1)
        opt.add_param_group(groups[1])
        return opt

    return train_replicated(ctx.rank, ctx.world_size, lambda m: DistributedDataParallel(m, find_unused_parameters=True),
                            make_opt, lambda _: None)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("bucket_mb,overlap", [(0, True), (1e-4, True), (25.0, True), (0, False), (25.0, False)])
def test_data_parallel_matches_single_device(world_size, bucket_mb, overlap):
    out = mpkit.launch(_data_parallel_rank, world_size, args=(bucket_mb, overlap, False), timeout=150)
    assert_matches_single(out, world_size)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 4])
def test_sharded_optimizer_matches_single_device(world_size):
    out = mpkit.launch(_data_parallel_rank, world_size, args=(25.0, True, True), timeout=150)
    assert_matches_single(out, world_size)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("zero", [False, True], ids=["ddp", "zero_redundancy"])
def test_torch_implementations_agree_with_ours(zero):
    """PyTorch's DDP (+ ZeroRedundancyOptimizer) on the same model lands where ours does."""
    theirs = mpkit.launch(_torch_rank, 2, args=(zero,), timeout=150)
    ours = mpkit.launch(_data_parallel_rank, 2, args=(25.0, True, zero), timeout=150)
    assert_matches_single(theirs, 2)
    for (their_losses, their_state), (our_losses, our_state) in zip(theirs, ours):
        assert max(abs(a - b) for a, b in zip(their_losses, our_losses)) <= ATOL
        assert all((their_state[k] - our_state[k]).abs().max().item() <= ATOL for k in our_state)


# ---- a world mpkit did not make -------------------------------------------------------------

def _plain_world_child(rank, world_size, ports, queue):
    torch.set_num_threads(1)  # forked after the parent ran torch ops: OpenMP would hang without it
    if rank == 0:
        # The store's port: bound on port 0 as the OS picks it, so no other process can take it
        # between choosing and binding; the tcp:// rendezvous below then shares this server
        # (multi-tenant TCPStores in one process share one server per port).
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
        port = server.port
        for _ in range(world_size - 1):
            ports.put(port)
    else:
        port = ports.get(timeout=60)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        out = _data_parallel_rank(type("Ctx", (), {"rank": rank, "world_size": world_size}), 25.0, True, True)
        queue.put(pickle.dumps((rank, out)))  # plain bytes: a tensor would travel as shared memory
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_works_in_a_plain_init_process_group_world():
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue, ports = context.Queue(), context.Queue()
    procs = [context.Process(target=_plain_world_child, args=(r, 2, ports, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    try:
        results = dict(pickle.loads(queue.get(timeout=90)) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    assert [proc.exitcode for proc in procs] == [0, 0]
    assert_matches_single([results[0], results[1]], 2)


# ---- checkpoints and accumulation -------------------------------------------------------------

def _resume_rank(ctx, stop_at):
    """Train ``stop_at`` steps, save model + optimizer, rebuild both from scratch, load, finish."""
    def fresh():
        model = make_net(seed=ctx.rank)
        dp = DataParallel(model, find_unused_parameters=True)
        return model, dp, ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2)

    model, dp, opt = fresh()
    losses = []
    for step in range(STEPS):
        if step == stop_at:
            saved = (state(model), opt.state_dict())
            model, dp, opt = fresh()
            model.load_state_dict(saved[0])
            opt.load_state_dict(saved[1])
        x, y = batch(step)
        loss = F.cross_entropy(dp(shard(x, ctx.rank, 2)), shard(y, ctx.rank, 2))
        loss.backward()
        dp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return state(model)


@pytest.mark.timeout(120)
def test_sharded_optimizer_state_dict_resumes_exactly():
    straight = mpkit.launch(_resume_rank, 2, args=(None,), timeout=100)
    resumed = mpkit.launch(_resume_rank, 2, args=(2,), timeout=100)
    for a, b in zip(straight, resumed):
        assert all(torch.equal(a[k], b[k]) for k in a)  # the same run, bit for bit


def _layout_mismatch_rank(ctx):
    model = make_net()
    saved = ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2).state_dict()
    other = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)  # one group, not two
    try:
        other.load_state_dict(saved)
    except ValueError as exc:
        return str(exc)
    return "loaded"


@pytest.mark.timeout(60)
def test_state_dict_of_another_layout_is_refused():
    assert all("saved for layout" in msg for msg in mpkit.launch(_layout_mismatch_rank, 2, timeout=50))


def _accumulate_rank(ctx):
    """Two micro-steps per rank: the first under no_sync(), the second synchronises both."""
    model = make_net(seed=ctx.rank)
    dp = DataParallel(model, bucket_mb=1e-4, find_unused_parameters=True)
    opt = torch.optim.AdamW(param_groups(model), lr=1e-2)
    events = []
    for step in range(STEPS):
        x, y = (shard(t, ctx.rank, 2) for t in batch(step))
        halves = list(zip(x.tensor_split(2), y.tensor_split(2)))
        with dp.no_sync():
            (F.cross_entropy(dp(halves[0][0]), halves[0][1]) / 2).backward()
        events.append(sum(e.kind == "all_reduce" for e in ctx.trace.events))
        (F.cross_entropy(dp(halves[1][0]), halves[1][1]) / 2).backward()
        dp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
    return state(model), events, len(dp.buckets)


@pytest.mark.timeout(120)
def test_no_sync_accumulates_locally_and_syncs_once():
    out = mpkit.launch(_accumulate_rank, 2, timeout=100)
    _, ref = REFERENCE
    for params, events, buckets in out:
        assert all((params[k] - ref[k]).abs().max().item() <= ATOL for k in ref)
        # no all-reduce inside no_sync(): before each synchronising backward the count is only the
        # earlier steps' buckets plus their used-parameter masks
        assert buckets > 1 and events == [(buckets + 1) * step for step in range(STEPS)]


# ---- tensor and pipeline parallel on a learner's model ----------------------------------------

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


def _tp_rank(ctx):
    from mpkit.parallel import full_parameters, tensor_parallel

    model = tensor_parallel(deep_net(), {"*.mlp.up": "column", "*.mlp.down": "row"})
    losses = train_deep(model)  # every rank sees the whole batch; only the split layers differ
    kinds = sorted({(e.kind, e.name.split(" ")[0]) for e in ctx.trace.events})
    return losses, full_parameters(model), sum(p.numel() for p in model.parameters()), kinds


def _uneven_tp_rank(ctx, lists):
    from mpkit.parallel import Split, full_parameters, tensor_parallel

    model = tensor_parallel(deep_net(), {"*.mlp.up": Split("column", lists), "*.mlp.down": Split("row", lists)})
    return train_deep(model), full_parameters(model)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lists", [[list(range(40)), list(range(40, 64))],  # 40 and 24 of the 64 features
                                   [list(range(64)), []]])  # a rank with none of them
def test_tensor_parallel_with_index_lists_of_different_lengths_matches_single(lists):
    # full_parameters all-gathers padded slices (gloo aborted on unequal sizes); the same 1e-5
    # tolerance as the even split: only the row layer's partial sums change order
    ref_losses, ref_state = single_deep()
    for losses, params in mpkit.launch(_uneven_tp_rank, 2, args=(lists,), timeout=100):
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= ATOL
        assert set(params) == set(ref_state)
        assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)


def test_head_split_refuses_heads_the_ranks_do_not_divide():
    from mpkit.parallel import head_split

    with pytest.raises(ValueError, match=r"head_split\(10, 4\): 4 ranks do not divide hidden=10"):
        head_split(10, 4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_parallel_on_a_user_model(world_size):
    # every rank sees the whole batch; a row-parallel layer sums partial products in another
    # order than one matmul: float32 noise of ~1e-7, so the same 1e-5 tolerance holds
    ref_losses, ref_state = single_deep()
    full = sum(p.numel() for p in deep_net().parameters())
    for losses, params, local, kinds in mpkit.launch(_tp_rank, world_size, timeout=100):
        assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= ATOL
        assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)
        split = 3 * (2 * 16 * 64)  # three blocks' up and down weights are cut in world_size pieces
        assert local == full - split + split // world_size - 3 * 64 + 3 * 64 // world_size
        assert ("all_reduce", "g") in kinds and ("all_reduce", "f") in kinds  # traced inside mpkit.launch


def _pipeline_rank(ctx, schedule, split_points):
    from mpkit.parallel import pipeline

    pipe = pipeline(deep_net(), split_points=split_points, schedule=schedule, micro_batches=4,
                    loss_fn=F.cross_entropy)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(3):
        x, y = regression_batch(step)
        losses.append(pipe.step(x, y))
        opt.step()
        opt.zero_grad()
    params = {f"{i}.{n}": p.detach().clone() for s in pipe.stages.values()
              for i, layer in zip(s.layer_ids, s) for n, p in layer.named_parameters()}
    return losses, params, sorted(pipe.stages)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world_size,schedule,split_points", [(2, "1f1b", None), (2, "gpipe", [3]),
                                                              (4, "1f1b", [1, 3, 5]), (2, "interleaved", None)])
def test_pipeline_on_a_user_sequential(world_size, schedule, split_points):
    # micro-batch losses are averaged (loss/m per micro-batch, gradients accumulated): the same
    # math as the whole batch at once, summed in another order — float32 noise under 1e-5
    ref_losses, ref_state = single_deep()
    out = mpkit.launch(_pipeline_rank, world_size, args=(schedule, split_points), timeout=100)
    last = [losses for losses, _, _ in out if losses[0] is not None]
    assert len(last) == 1 and max(abs(a - b) for a, b in zip(last[0], ref_losses)) <= ATOL
    params = {k: v for _, p, _ in out for k, v in p.items()}
    assert set(params) == set(ref_state)
    assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)
    if split_points:
        assert out[0][2] == [0]


def frozen_input_net():
    """deep_net with its input layer frozen, as a fine-tuned model's embedding or backbone."""
    model = deep_net()
    model[0].requires_grad_(False)
    return model


def _frozen_first_stage_rank(ctx):
    from mpkit.parallel import pipeline

    pipe = pipeline(frozen_input_net(), split_points=[1], schedule="1f1b", micro_batches=4, loss_fn=F.cross_entropy)
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-2, weight_decay=0.1)  # rank 0's are all frozen: skipped
    losses = []
    for step in range(3):
        losses.append(pipe.step(*regression_batch(step)))
        opt.step()
        opt.zero_grad()
    return losses, {f"{i}.{n}": p.detach().clone() for s in pipe.stages.values()
                    for i, layer in zip(s.layer_ids, s) for n, p in layer.named_parameters()}


@pytest.mark.timeout(120)
def test_pipeline_with_a_frozen_first_stage_matches_single_device():
    # the first stage computes no gradient at all: its backward has nothing to do (autograd
    # refuses a backward through an output that needs none), the other stages train as usual
    model = frozen_input_net()
    ref_losses, ref_state = train_deep(model), state(model)
    out = mpkit.launch(_frozen_first_stage_rank, 2, timeout=100)
    assert out[0][0] == [None] * 3 and max(abs(a - b) for a, b in zip(out[1][0], ref_losses)) <= ATOL
    params = {**out[0][1], **out[1][1]}
    assert set(params) == set(ref_state) and torch.equal(params["0.weight"], ref_state["0.weight"])
    assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)


def tied_sequential():
    """An embedding whose weight the output layer reuses, as language models tie them."""
    torch.manual_seed(0)
    emb = nn.Embedding(16, 8)
    head = nn.Linear(8, 16, bias=False)
    head.weight = emb.weight
    return nn.Sequential(emb, nn.Linear(8, 8), nn.Tanh(), head)


# ---- mpkit.train on a learner's model ---------------------------------------------------------

def deep_data(step, batch_size):
    return regression_batch(step, batch_size)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy,options", [("dp", {}), ("ddp", {}), ("zero1", {}), ("fsdp", {}),
                                              ("tp", {"plan": {"*.mlp.up": "column", "*.mlp.down": "row"}}),
                                              ("pp", {"schedule": "1f1b"}), ("mp", {}), ("ps", {})])
def test_train_accepts_a_model_factory(strategy, options):
    world = 3 if strategy == "ps" else 2
    run = mpkit.train(strategy, world, model=deep_net, data=deep_data, loss=F.cross_entropy, steps=3,
                      batch_size=8, optimizer="adam", **options)
    assert run.compare_to_reference().max <= ATOL
    assert len(run.losses) == 3 and run.trace.events


def token_data(step, batch_size):
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, 16, (batch_size, 4), generator=g), torch.randint(0, 16, (batch_size,), generator=g)


@pytest.mark.timeout(200)
def test_train_fsdp_on_a_model_with_tied_weights_and_an_unused_branch():
    # FSDP2 refuses a parameter in two units ("use fully_shard([module_a, module_b])", which a
    # train user cannot do): the tied embedding and output layer stay with the root unit. Every
    # rank's gradient shard is reduce-scattered in float32: the 1e-5 tolerance of the others
    run = mpkit.train("fsdp", 2, model=make_net, data=token_data, steps=3, batch_size=8, optimizer="adam")
    assert run.compare_to_reference().max <= ATOL


@pytest.mark.timeout(200)
@pytest.mark.parametrize("strategy", ["dp", "ddp"])
def test_train_on_a_model_with_an_unused_branch(strategy):
    # Net has an unused branch (and a frozen layer and tied weights): dp, and torch's DDP in its
    # own words, ask for the option by name; then with it both train as one device does. dp
    # traces its used-parameter mask; DDP's bitmap all-reduce runs inside DDP, off the timeline,
    # and the cost model prices both the same way
    with pytest.raises(mpkit.LaunchError, match="find_unused_parameters=True"):
        mpkit.train(strategy, 2, model=make_net, data=token_data, steps=2, batch_size=8)
    run = mpkit.train(strategy, 2, model=make_net, data=token_data, steps=3, batch_size=8, optimizer="adam",
                      find_unused_parameters=True)
    assert run.compare_to_reference().max <= ATOL
    assert any(e.name == "used-parameter mask" for e in run.trace.events) == (strategy == "dp")
    predicted = mpkit.sim.predict(strategy, world_size=2, hardware="8xH100-nvlink", find_unused_parameters=True)
    assert len([e for e in predicted.trace.events if e.name == "used-parameter mask"]) == 2  # one per rank
    with pytest.raises(ValueError, match="find_unused_parameters='yes' must be True"):
        mpkit.train(strategy, 2, find_unused_parameters="yes")


# ---- bad input ---------------------------------------------------------------------------------

def _bad_input_rank(ctx, case):
    from mpkit.parallel import pipeline, tensor_parallel

    frozen = nn.Linear(4, 4).requires_grad_(False)
    cases = {
        "no trainable": lambda: DataParallel(frozen),
        "no trainable zero": lambda: ShardedOptimizer(frozen.parameters(), torch.optim.AdamW, lr=1e-3),
        "bucket_mb": lambda: DataParallel(nn.Linear(4, 4), bucket_mb=-1),
        "missing layer": lambda: tensor_parallel(deep_net(), {"mlp.upp": "column"}),
        "not linear": lambda: tensor_parallel(deep_net(), {"3": "column"}),
        "not divisible": lambda: tensor_parallel(nn.Sequential(nn.Linear(4, 3)), {"0": "column"}),
        "too many stages": lambda: pipeline(nn.Sequential(nn.Linear(4, 4)), loss_fn=F.mse_loss),
        "bad style": lambda: tensor_parallel(deep_net(), {"0": "diagonal"}),
        "lbfgs": lambda: ShardedOptimizer(nn.Linear(4, 4).parameters(), torch.optim.LBFGS),
        "tied across stages": lambda: pipeline(tied_sequential(), split_points=[2], loss_fn=F.cross_entropy),
        "rank without parameters": lambda: pipeline(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4),
                                                                  nn.Flatten()),
                                                    schedule="interleaved", micro_batches=2, loss_fn=F.mse_loss),
        "different replicas": lambda: DataParallel(nn.Linear(4, 4 + 4 * ctx.rank)),
        "replica dtypes": lambda: DataParallel(nn.Linear(4, 4).to(torch.float64 if ctx.rank else torch.float32)),
        "replica strides": lambda: DataParallel(transposed_weight(ctx.rank == 1)),
        "replica count": lambda: DataParallel(nn.Sequential(*(nn.Linear(4, 4) for _ in range(1 + ctx.rank)))),
        "rank-local buffer": lambda: DataParallel(with_buffer(ctx.rank), broadcast_buffers=False),
        "different buffers": lambda: DataParallel(with_buffer(ctx.rank)),
        "mixed dtypes": lambda: ShardedOptimizer(half_and_full().parameters(), torch.optim.SGD, lr=0.1),
        "sharded replicas": lambda: sharded_start(nn.Linear(4, 4 + 4 * ctx.rank), with_module=False),
        "sharded replica order": lambda: sharded_start(nn.Sequential(nn.Linear(4, 2 + 2 * ctx.rank),
                                                                     nn.Linear(4, 4 - 2 * ctx.rank)),
                                                       with_module=True),
        "sharded buffers": lambda: sharded_start(with_buffer(ctx.rank), with_module=True),
        "sharded order, flat": lambda: sharded_start(nn.Sequential(nn.Linear(4, 2 + 2 * ctx.rank),
                                                                   nn.Linear(4, 4 - 2 * ctx.rank)),
                                                     with_module=False),
    }
    try:
        cases[case]()
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,message", [
    ("no trainable", "no trainable parameters"),
    ("no trainable zero", "no trainable parameters"),
    ("bucket_mb", "bucket_mb=-1 must be a number of MiB >= 0"),
    ("missing layer", "plan names 'mlp.upp', but the module has no such layer; its nn.Linear layers: 0, "),
    ("not linear", "ColumnParallelLinear slices an nn.Linear; 3 is a Tanh"),
    ("not divisible", "layer 0: tp size 2 does not divide out_features=3"),
    ("too many stages", "has 1 layers, fewer than the 2 stages of world_size=2"),
    ("bad style", "use 'column', 'row'"),
    ("lbfgs", "LBFGS updates a tensor as a whole"),
    # each rank would train its own copy of the tied weight on its own stage's gradient only
    ("tied across stages", "parameter '0.weight' of stage 0 is shared with '3.weight' of stage 1 (tied weights)"),
    # as mpkit.train("pp") checks it: per rank, so interleaving may give a rank a parameter-free stage
    ("rank without parameters", "rank 1 would hold only stages 1 (layers [1]: ReLU) and 3 (layers [3]: Flatten), "
                                "none of which has parameters"),
    # one flat buffer per group: the bf16 parameters would silently become fp32
    ("mixed dtypes", "parameter group 0 mixes dtypes (bfloat16, float32)"),
    # rank 1 built a wider layer: the broadcast would fill it with rank 0's values, silently. DDP
    # compares the count, sizes and strides of the parameters (_verify_params_across_processes);
    # we compare dtypes too, and every rank raises, naming the rank and the parameter
    ("different replicas", "the replicas differ: parameter 'weight' has shape (8, 4), dtype float32 on group "
                           "rank 1, but shape (4, 4), dtype float32 on group rank 0"),
    ("replica dtypes", "parameter 'weight' has shape (4, 4), dtype float64 on group rank 1, but shape (4, 4), "
                       "dtype float32 on group rank 0"),
    ("replica strides", "parameter 'weight' has shape (4, 4), dtype float32, strides (1, 4) on group rank 1, "
                        "but shape (4, 4), dtype float32, strides (4, 1) on group rank 0"),
    ("replica count", "group rank 1 has 4 parameter tensors, group rank 0 has 2: group rank 1's parameter "
                      "'1.weight' has no counterpart on group rank 0"),
    # DDP compares parameters, not buffers: with broadcast_buffers=False they are rank-local
    ("rank-local buffer", "accepted"),
    # but broadcast coalesced (broadcast_buffers=True) they must match, or values cross buffers silently
    ("different buffers", "the replicas differ: parameter 'buffer seen' has shape (2,)"),
    # ShardedOptimizer.broadcast_parameters broadcasts flat buffers (or the module coalesced): the
    # same silent crossing of parameter boundaries, the same check
    ("sharded replicas", "ShardedOptimizer.broadcast_parameters: the replicas differ: parameter 'group 0 param 0' "
                         "has shape (8, 4), dtype float32 on group rank 1"),
    ("sharded replica order", "ShardedOptimizer.broadcast_parameters: the replicas differ: parameter '0.weight' has "
                              "shape (4, 4), dtype float32 on group rank 1, but shape (2, 4)"),
    ("sharded buffers", "ShardedOptimizer.broadcast_parameters: the replicas differ: parameter 'buffer seen'"),
    # the same total size in another order: equal flat buffers, so only the check tells
    ("sharded order, flat", "ShardedOptimizer.broadcast_parameters: the replicas differ: parameter 'group 0 param 0' "
                            "has shape (4, 4), dtype float32 on group rank 1, but shape (2, 4)"),
])
def test_bad_input_is_a_clear_error(case, message):
    for reply in mpkit.launch(_bad_input_rank, 2, args=(case,), timeout=50):
        assert message in reply, reply


def test_tensor_parallel_keeps_a_frozen_layer_frozen():
    # the slices are new Parameters; a frozen layer that came back trainable would silently train
    from mpkit.parallel import tensor_parallel

    block = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    block[0].requires_grad_(False)
    tensor_parallel(block, {"0": "column", "2": "row"}, rank=0, world_size=2)
    assert [(n, p.requires_grad) for n, p in block.named_parameters()] == [
        ("0.weight", False), ("0.bias", False), ("2.weight", True), ("2.bias", True)]


def test_tensor_parallel_refuses_to_untie_a_tied_layer():
    # splitting the head would leave the embedding with the full tensor and the head with a new
    # slice: two tensors trained apart where one device trains one
    from mpkit.parallel import tensor_parallel

    with pytest.raises(ValueError, match="layer 'head' shares a parameter with 'emb.weight' .* Leave 'head' out"):
        tensor_parallel(make_net(), {"head": "column"}, rank=0, world_size=2)


class HalfAndFull(nn.Module):
    """A bf16 layer feeding an fp32 one: a bucket or a flat shard is one tensor of one dtype."""

    def __init__(self):
        super().__init__()
        self.low = nn.Linear(4, 4).to(torch.bfloat16)
        self.full = nn.Linear(4, 2)

    def forward(self, x):
        return self.full(self.low(x.to(torch.bfloat16)).float())


def sharded_start(model, with_module):
    """ZeRO-1 without DataParallel: the replicas start from rank 0's values."""
    opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
    opt.broadcast_parameters(model if with_module else None)


def transposed_weight(transposed):
    """nn.Linear(4, 4) whose weight is, where ``transposed``, a column-major tensor (other strides)."""
    layer = nn.Linear(4, 4)
    if transposed:
        layer.weight = nn.Parameter(layer.weight.detach().t().contiguous().t())
    return layer


def with_buffer(rank):
    """nn.Linear(4, 4) with a rank-local buffer of the rank's own size."""
    layer = nn.Linear(4, 4)
    layer.register_buffer("seen", torch.zeros(1 + rank))
    return layer


def half_and_full():
    torch.manual_seed(0)
    return HalfAndFull()


def _mixed_dtype_rank(ctx):
    model = half_and_full()
    dp = DataParallel(model)  # default caps: both layers would fit one bucket
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = regression_batch(0, 4)
    F.cross_entropy(dp(shard(x[:, :4], ctx.rank, 2)), shard(y % 2, ctx.rank, 2)).backward()
    dp.finish_gradient_synchronization()
    opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, len(dp.buckets)


@pytest.mark.timeout(60)
def test_data_parallel_keeps_each_dtype_in_its_own_bucket():
    # one flat bucket of the first dtype made .grad of another dtype, which torch refuses
    model = half_and_full()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = regression_batch(0, 4)
    F.cross_entropy(model(x[:, :4]), y % 2).backward()
    opt.step()
    for params, buckets in mpkit.launch(_mixed_dtype_rank, 2, timeout=50):
        assert buckets == 2
        for name, ref in model.named_parameters():
            assert params[name].dtype == ref.dtype
            # bf16 gradients averaged in bf16 round differently from one device's: 2 bf16 ulps
            assert (params[name].float() - ref.detach().float()).abs().max().item() <= 2 * 2**-8


def _clipped_rank(ctx, average_gradients):
    model = deep_net()
    dp = None if average_gradients else DataParallel(model)
    opt = ShardedOptimizer(param_groups(model), torch.optim.AdamW, lr=1e-2, average_gradients=average_gradients)
    norms = []
    for step in range(STEPS):
        x, y = regression_batch(step)
        F.cross_entropy((dp or model)(shard(x, ctx.rank, 2)), shard(y, ctx.rank, 2)).backward()
        if dp is not None:
            dp.finish_gradient_synchronization()
        norms.append(opt.clip_grad_norm_(0.05).item())
        opt.step()
        opt.zero_grad()
    return norms, state(model)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("average_gradients", [True, False])
def test_sharded_optimizer_clips_the_averaged_gradient(average_gradients):
    # torch's clip_grad_norm_ on the model after backward would see each rank's own gradient when
    # the optimizer averages them itself: the clip must act on the average, as on one device
    model = deep_net()
    opt = torch.optim.AdamW(param_groups(model), lr=1e-2)
    ref_norms = []
    for step in range(STEPS):
        x, y = regression_batch(step)
        F.cross_entropy(model(x), y).backward()
        ref_norms.append(nn.utils.clip_grad_norm_(model.parameters(), 0.05).item())
        opt.step()
        opt.zero_grad()
    assert min(ref_norms) > 0.05  # every step is clipped
    for norms, params in mpkit.launch(_clipped_rank, 2, args=(average_gradients,), timeout=100):
        assert max(abs(a - b) for a, b in zip(norms, ref_norms)) <= ATOL
        assert all((params[k] - v).abs().max().item() <= ATOL for k, v in state(model).items())


def _unused_branch_rank(ctx):
    model = make_net()
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, average_gradients=True, lr=1e-2)
    opt.name_parameters(model)
    x, y = batch(0)
    F.cross_entropy(model(shard(x, ctx.rank, 2)), shard(y, ctx.rank, 2)).backward()
    try:
        opt.step()
    except RuntimeError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.timeout(60)
def test_sharded_optimizer_averaging_itself_names_a_parameter_without_gradient():
    # average_gradients=True reduce-scatters every trainable gradient: Net's unused branch has none
    # (its .grad is only the flat buffer's view, which no backward reached), which must be an error
    # naming it, not a silent AdamW step on a zero gradient that one device would have skipped
    for reply in mpkit.launch(_unused_branch_rank, 2, timeout=50):
        assert reply.startswith("parameter(s) 'unused.weight', 'unused.bias' have no gradient this step"), reply
        assert "find_unused_parameters=True" in reply


def _regained_gradients_rank(ctx):
    import warnings

    from mpkit.errors import MpkitWarning

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(8)))  # 16 parameters, 8 in each rank's slice
    opt = ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=1e-2)
    opt.name_parameters(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # count every warning raised, not once per message
        for step in range(6):
            if step % 2 == 0:  # steps 1, 3, 5 have no gradients; 2 and 4 bring all 16 back
                model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    return [str(w.message) for w in caught if issubclass(w.category, MpkitWarning)]


@pytest.mark.timeout(60)
def test_sharded_optimizer_warns_about_bias_correction_once():
    # every parameter of a slice regaining its gradient (twice) used to warn once per parameter
    # name and step: 8 per rank per step. One warning per optimizer says how many and names a few.
    for messages in mpkit.launch(_regained_gradients_rank, 2, timeout=50):
        assert len(messages) == 1, messages
        assert messages[0].startswith("8 parameter(s) of this rank's slice ("), messages
        assert "and 5 more) have a gradient again" in messages[0] and "bias correction" in messages[0]


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="needs a process group"):
        DataParallel(nn.Linear(2, 2))


def batch_norm_net():
    """Four BatchNorm layers: 12 buffers (running_mean, running_var float32, num_batches_tracked int64)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16), nn.BatchNorm1d(16),
                         nn.ReLU(), nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4),
                         nn.BatchNorm1d(4))


# (mode, grad enabled, inside no_sync(), backward) of each forward. Which of them sync buffers in
# torch 2.13 DDP (require_forward_param_sync, set by the previous forward's _post_forward):
# 0 yes (first); 1 yes; 2 yes (the no_sync one itself); 3 no (after no_sync); 4 yes (eval under
# no_grad, after a synchronising one); 5 no (after no_grad); 6 no (eval with grad, after no_grad);
# 7 yes (after eval with grad); 8 no (train, after no_grad); 9 yes.
BN_SCHEDULE = [("train", True, False, True), ("train", True, False, True), ("train", True, True, True),
               ("train", True, False, True), ("eval", False, False, False), ("eval", False, False, False),
               ("eval", True, False, False), ("eval", False, False, False), ("train", True, False, True),
               ("train", True, False, True)]
BN_SYNCS = [True, True, True, False, True, False, False, True, False, True]


def _batch_norm_rank(ctx, ours, broadcast_buffers, count=False):
    from contextlib import nullcontext

    model = batch_norm_net()
    norms = [m for m in model if isinstance(m, nn.BatchNorm1d)]
    if ctx.rank == 1:  # another replica's statistics, which a buffer broadcast must overwrite
        norms[0].running_mean.fill_(5.0)
    wrap = (DataParallel(model, broadcast_buffers=broadcast_buffers) if ours
            else DistributedDataParallel(model, broadcast_buffers=broadcast_buffers))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls, per_forward, snapshots = [0], [], []
    if count:  # every broadcast mpkit's Comm issues goes through torch.distributed.broadcast
        real = dist.broadcast
        dist.broadcast = lambda *a, **k: (calls.__setitem__(0, calls[0] + 1), real(*a, **k))[1]
    for step, (mode, grad, accumulate, backward) in enumerate(BN_SCHEDULE):
        x, y = regression_batch(step)
        if ctx.rank == 1:
            for norm in norms:  # drifts between forwards: only a broadcast before the forward undoes it
                norm.running_var.fill_(3.0)
        model.train(mode == "train")
        before = calls[0]
        with torch.set_grad_enabled(grad), (wrap.no_sync() if accumulate else nullcontext()):
            out = wrap(shard(x, ctx.rank, 2))
            if backward:
                F.cross_entropy(out, shard(y % 4, ctx.rank, 2)).backward()
        per_forward.append(calls[0] - before)
        if backward and not accumulate:
            if ours:
                wrap.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad()
        snapshots.append({"out": out.detach().clone(), **state(model)})
    return per_forward if count else snapshots


@pytest.mark.timeout(150)
@pytest.mark.parametrize("broadcast_buffers", [True, False])
def test_data_parallel_syncs_batch_norm_statistics_as_ddp_does(broadcast_buffers):
    # DDP (broadcast_buffers=True) copies rank 0's buffers into every replica at the start of the
    # forwards BN_SYNCS marks (training, eval, no_grad and no_sync() forwards); each rank then
    # updates them from its own slice. Same ops in the same order on each rank, so ours must equal
    # DDP's rank by rank after every forward up to the gradient sum's order (ATOL): a broadcast
    # missing or extra anywhere leaves rank 1's drifted variance (3.0) in one and not the other.
    theirs = mpkit.launch(_batch_norm_rank, 2, args=(False, broadcast_buffers), timeout=100)
    ours = mpkit.launch(_batch_norm_rank, 2, args=(True, broadcast_buffers), timeout=100)
    for rank, (mine, ddp) in enumerate(zip(ours, theirs)):
        for forward, (a, b) in enumerate(zip(mine, ddp)):
            assert a.keys() == b.keys()
            worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
            assert worst <= ATOL, (rank, forward, worst)
    # and the broadcast matters: rank 1's drifted variance survives only without it
    assert (ours[1][-1]["1.running_var"] > 2.0).all() != broadcast_buffers


@pytest.mark.timeout(60)
def test_data_parallel_broadcasts_buffers_coalesced():
    # 4 BatchNorm layers = 12 buffers of 2 dtypes (float32 statistics, int64 batch counters): DDP's
    # _broadcast_coalesced sends one flat tensor per dtype, not one per buffer; so must we, on the
    # forwards DDP syncs, and nothing on the others
    for per_forward in mpkit.launch(_batch_norm_rank, 2, args=(True, True, True), timeout=50):
        assert per_forward == [2 if sync else 0 for sync in BN_SYNCS], per_forward


def test_data_parallel_broadcast_buffers_must_be_a_bool():
    with pytest.raises(ValueError, match=r"broadcast_buffers='yes' must be True .* or False"):
        DataParallel(nn.BatchNorm1d(2), broadcast_buffers="yes")


def test_tensor_parallel_takes_an_unpaired_plan_whose_column_layers_say_what_their_output_is():
    # the pairing rule belongs to mpkit.train("tp") (one plan, one call); the public mechanism takes
    # each layer on its own: a lone column layer that gathers its output, a plan in two calls
    from mpkit.parallel import ColumnParallelLinear, RowParallelLinear, Split, tensor_parallel

    head = tensor_parallel(output_net(), {"2": Split("column", gather_output=True)}, rank=0, world_size=2)
    assert isinstance(head[2], ColumnParallelLinear) and head[2].gather_output
    for first, second in [({"*.mlp.up": Split("column", gather_output=False)}, {"*.mlp.down": "row"}),
                          ({"*.mlp.down": "row"}, {"*.mlp.up": "column"})]:  # either order, in two calls
        model = tensor_parallel(tensor_parallel(deep_net(), first, rank=0, world_size=2), second, rank=0, world_size=2)
        assert isinstance(model[1].mlp.up, ColumnParallelLinear) and not model[1].mlp.up.gather_output
        assert isinstance(model[1].mlp.down, RowParallelLinear)
    # a plain column layer with no row layer anywhere: slice or full output is not guessed, and the
    # refusal comes before any layer is swapped
    model = deep_net()
    before = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match=r"plan splits 0 by columns but no layer by rows.*"
                                         r"Split\('column', gather_output=True\)"):
        tensor_parallel(model, {"0": "column"}, rank=0, world_size=2)
    assert [type(m) for m in model.modules()] == before  # still whole: usable on one device
    with pytest.raises(ValueError, match="gather_output applies to 'column' layers"):
        tensor_parallel(model, {"0": Split("row", gather_output=True)}, rank=0, world_size=2)


@pytest.mark.parametrize("indices, fault", [
    ([[0, 1, 2, 3, 4], [4, 5, 6, 7, 8]], r"more than once: \[4\]; on no rank: \[9\]"),  # overlap
    ([[0, 0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], r"more than once: \[0\]"),  # twice on one rank
    ([[0, 1, 2, 3], [5, 6, 7, 8, 9]], r"on no rank: \[4\]"),  # a gap
    ([[0, 1, 2, 3, 4], [5, 6, 7, 8, 10]], r"outside 0..9: \[10\]; on no rank: \[9\]"),
])
@pytest.mark.parametrize("gather_output", [True, False])
def test_split_index_lists_must_hold_each_feature_exactly_once(indices, fault, gather_output):
    # an index on two ranks would count twice, a missing one would stay uninitialised in the
    # gathered output (or be dropped from the slices): refused before any layer is swapped
    from mpkit.parallel import Split, tensor_parallel

    model = output_net()
    before = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match=r"layer 2: its index lists must hold each of its out_features=10 exactly "
                                         r"once across the ranks; indices " + fault):
        tensor_parallel(model, {"2": Split("column", indices, gather_output=gather_output)}, rank=0, world_size=2)
    assert [type(m) for m in model.modules()] == before
    with pytest.raises(ValueError, match="3 index lists for a tp size of 2; give one per rank"):
        tensor_parallel(model, {"2": Split("column", [[0], [1], [2]], gather_output=True)}, rank=0, world_size=2)
    with pytest.raises(ValueError, match="1-D list or tensor of whole numbers"):
        tensor_parallel(model, {"2": Split("column", [[0.0] * 5, [1.0] * 5], gather_output=True)}, rank=0,
                        world_size=2)


def test_split_index_lists_that_partition_the_features_in_any_order_train_like_single():
    # strided lists (rank 0 the even classes, rank 1 the odd) gathered back into the full output
    from mpkit.parallel import Split

    strided = Split("column", [list(range(0, 10, 2)), list(range(1, 10, 2))], gather_output=True)
    run = mpkit.train("tp", 2, model=output_net, data=deep_data, loss=F.cross_entropy, steps=3, batch_size=8,
                      optimizer="adam", plan={"2": strided})
    assert run.compare_to_reference().max <= ATOL  # tolerance as for contiguous slices: the f all-reduce's order


def output_net():
    """A small classifier whose output layer is split over its classes (vocab-parallel)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 10))


def _unpaired_tp_rank(ctx):
    from mpkit.parallel import Split, full_parameters, tensor_parallel

    out = []
    head = tensor_parallel(output_net(), {"2": Split("column", gather_output=True)})  # a lone column layer
    two_calls = tensor_parallel(deep_net(), {"*.mlp.up": Split("column", gather_output=False)})
    two_calls = tensor_parallel(two_calls, {"*.mlp.down": "row"})  # the plan in two calls
    for model in (head, two_calls):
        out.append((train_deep(model), full_parameters(model)))
    return out, [e.name for e in ctx.trace.events if e.kind == "all_gather"]


@pytest.mark.timeout(120)
def test_tensor_parallel_on_an_unpaired_plan_matches_single_device():
    # every rank sees the whole batch. The gathered output is the full layer's output exactly
    # (a concatenation); the f all-reduce sums the input gradient's two partial products in
    # another order than one matmul, and the row layer its partial outputs: float32 noise of
    # ~1e-7 after 3 AdamW steps, so the 1e-5 tolerance of the other parity tests holds
    refs = []
    for make in (output_net, deep_net):
        model = make()
        refs.append((train_deep(model), state(model)))
    for models, gathers in mpkit.launch(_unpaired_tp_rank, 2, timeout=100):
        for (losses, params), (ref_losses, ref_state) in zip(models, refs):
            assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= ATOL
            assert set(params) == set(ref_state)
            assert all((params[k] - ref_state[k]).abs().max().item() <= ATOL for k in ref_state)
        # the lone column layer's output went through one all-gather per forward (3 steps); the
        # others are full_parameters' gathers of the split weights afterwards
        assert [g for g in gathers if g.startswith("gather forward")] == ["gather forward 2"] * 3


@pytest.mark.timeout(120)
def test_train_tp_takes_a_lone_column_layer_that_gathers_its_output():
    # mpkit.train("tp") wants its split layers in pairs, but a gathered column layer gives the
    # full output and stands alone. Tolerance as above: the f all-reduce's summation order only.
    from mpkit.parallel import Split

    run = mpkit.train("tp", 2, model=output_net, data=deep_data, loss=F.cross_entropy, steps=3, batch_size=8,
                      optimizer="adam", plan={"2": Split("column", gather_output=True)})
    assert run.compare_to_reference().max <= ATOL
    assert run.extra[0]["sharded_layers"] == ["2"]
