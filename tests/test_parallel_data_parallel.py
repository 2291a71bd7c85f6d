"""``mpkit.parallel.DataParallel`` on a learner's model: parity with one device and with torch's DDP
(on 2 and 4 ranks, every bucket size, with and without overlap), a world mpkit did not make,
``no_sync()``, one dtype per bucket, BatchNorm buffers synced as DDP syncs them, and bad input.
Models and tolerance: ``parallel_models``."""
import pickle

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

import pytest

import mpkit
from mpkit.parallel import DataParallel
from parallel_models import (assert_every_rank_raises, ATOL, REFERENCE, STEPS, assert_matches_single, batch, data_parallel_rank, half_and_full,
                             make_net, param_groups, raised, regression_batch, shard, state, train_replicated,
                             with_buffer)


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
    out = mpkit.launch(data_parallel_rank, world_size, args=(bucket_mb, overlap, False), timeout=150)
    assert_matches_single(out, world_size)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("zero", [False, True], ids=["ddp", "zero_redundancy"])
def test_torch_implementations_agree_with_ours(zero):
    """PyTorch's DDP (+ ZeroRedundancyOptimizer) on the same model lands where ours does."""
    theirs = mpkit.launch(_torch_rank, 2, args=(zero,), timeout=150)
    ours = mpkit.launch(data_parallel_rank, 2, args=(25.0, True, zero), timeout=150)
    assert_matches_single(theirs, 2)
    for (their_losses, their_state), (our_losses, our_state) in zip(theirs, ours):
        assert max(abs(a - b) for a, b in zip(their_losses, our_losses)) <= ATOL
        assert all((their_state[k] - our_state[k]).abs().max().item() <= ATOL for k in our_state)


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
        out = data_parallel_rank(type("Ctx", (), {"rank": rank, "world_size": world_size}), 25.0, True, True)
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


def transposed_weight(transposed):
    """nn.Linear(4, 4) whose weight is, where ``transposed``, a column-major tensor (other strides)."""
    layer = nn.Linear(4, 4)
    if transposed:
        layer.weight = nn.Parameter(layer.weight.detach().t().contiguous().t())
    return layer


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


def _bad_input_rank(ctx, case):
    frozen = nn.Linear(4, 4).requires_grad_(False)
    cases = {
        "no trainable": lambda: DataParallel(frozen),
        "bucket_mb": lambda: DataParallel(nn.Linear(4, 4), bucket_mb=-1),
        "different replicas": lambda: DataParallel(nn.Linear(4, 4 + 4 * ctx.rank)),
        "replica dtypes": lambda: DataParallel(nn.Linear(4, 4).to(torch.float64 if ctx.rank else torch.float32)),
        "replica strides": lambda: DataParallel(transposed_weight(ctx.rank == 1)),
        "replica count": lambda: DataParallel(nn.Sequential(*(nn.Linear(4, 4) for _ in range(1 + ctx.rank)))),
        "rank-local buffer": lambda: DataParallel(with_buffer(ctx.rank), broadcast_buffers=False),
        "different buffers": lambda: DataParallel(with_buffer(ctx.rank)),
    }
    return raised(cases[case])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case,message", [
    ("no trainable", "no trainable parameters"),
    ("bucket_mb", "bucket_mb=-1 must be a number of MiB >= 0"),
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
])
def test_bad_input_is_a_clear_error(case, message):
    assert_every_rank_raises(_bad_input_rank, case, message)
