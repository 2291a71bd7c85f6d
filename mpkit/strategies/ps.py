"""Parameter server over ``torch.distributed.rpc`` (TensorPipe): rank 0 holds the parameters and
the optimizer; ranks 1..N-1 are workers, each with its own shard of the global batch (as equal
as ``tensor_split`` cuts it: batch 32 on 3 workers is 11, 11 and 10 samples).

A worker's step: pull the current parameters, forward/backward on its shard, push the
gradients. ``mode="sync"``: the server waits for every worker's push, averages (each shard's
mean gradient weighted by its size) and steps once — the shards together are the global batch,
so this equals ``single``. ``mode="async"``: the
server applies each push as it arrives (one optimizer step per push, under a lock so a pull
never reads half-updated parameters): no worker waits for another, but a gradient may have been
computed on parameters that other pushes have since changed. Its *staleness* is the number of
updates in between (server version at apply − version pulled).

``losses``: sync, the global loss per step (the shard losses weighted by size); async, the loss of
each push in the order the server applied them ((world_size-1)·steps values). Every worker
builds the model from the seed, which is the server's version 0, so its first step needs no
pull; with two or more async workers, at most one first push can be applied at version 0, so
some push is always stale.

All rpc use stays in this module (rpc is in maintenance mode upstream). Tensors travel as CPU
tensors, so TensorPipe needs no device maps on GPUs either.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch
from torch.distributed import rpc

from mpkit.observe.comm import nbytes
from mpkit.simulator.engine import Compute
from mpkit.pricing.pricing import fwd_bwd, message, optimizer
from mpkit.pricing.profile import Cost
from mpkit.strategies.base import RankOutput, Strategy, make_optimizer, state_of
from mpkit.strategies.loop import forward_backward, local_batch, run_steps
from mpkit.strategies.rpcworld import join_rpc

OPTIONS = {"mode": "sync"}
MODES = ("sync", "async")
SERVER = "rank0"


def validate(cfg):
    if cfg.world_size < 2:
        raise ValueError(f"ps needs a server and at least one worker: use world_size>=2 (got {cfg.world_size})")
    if cfg.option("mode") not in MODES:
        raise ValueError(f"mode={cfg.option('mode')!r} is unknown; use one of {', '.join(MODES)}")
    workers = cfg.world_size - 1
    if cfg.batch_size < workers:
        raise ValueError(f"batch_size={cfg.batch_size} is smaller than the {workers} workers (world_size-1): each "
                         f"worker needs a sample at least; use batch_size>={workers} or fewer ranks")


def shard_sizes(batch_size: int, workers: int) -> list[int]:
    """Samples per worker: the batch cut as ``tensor_split`` cuts it (32 over 3 workers: 11, 11, 10)."""
    return [batch_size // workers + (i < batch_size % workers) for i in range(workers)]


@dataclass
class _Push:
    worker: int
    step: int
    version: int
    loss: float
    grads: list
    done: torch.futures.Future


class _Server:
    """What the rpc handlers (TensorPipe's threads) share with the server's main loop."""

    def __init__(self, ctx, model):
        self.ctx, self.params = ctx, list(model.parameters())
        # Gradients travel for trainable parameters only; one buffer each, made before tracking
        # starts so ``track`` counts them as gradients; received gradients are copied in
        # (received tensors are made in rpc threads, which the memory tracker does not see).
        self.trainable = [p for p in self.params if p.requires_grad]
        self.grads = [torch.zeros_like(p) for p in self.trainable]
        self.lock = threading.Lock()
        self.version = 0
        self.pushes = queue.Queue()


_server: _Server | None = None  # set on rank 0 only


def _pull(worker, step):
    """Runs on the server: a consistent copy of the parameters and their version. ``step`` is the
    worker's step the pull starts: this runs on an rpc thread, and the server's main loop may
    already be on another step (``ctx.set_step``), so the event is tagged with the request's."""
    trace, start = _server.ctx.trace, _server.ctx.trace.now()
    with _server.lock:
        version, params = _server.version, [p.detach().cpu().clone() for p in _server.params]
    trace.record("rpc", start, trace.now(), bytes=sum(map(nbytes, params)), name=f"pull reply to rank {worker}",
                 step=step)
    return version, params


@rpc.functions.async_execution
def _push(worker, step, version, loss, grads):
    """Runs on the server: queue the gradients; the reply comes once the main loop applied them."""
    done = torch.futures.Future()
    _server.pushes.put(_Push(worker, step, version, loss, grads, done))
    return done


def _apply(ctx, optimizer, grads_per_worker, sizes=None):
    """Average the workers' gradients into the server's ``.grad`` buffers, take one step. Each
    worker's is the mean over its shard, so shards of ``sizes`` samples weigh by their size (the
    gradient of the batch mean; equal shards: the plain mean). A worker whose step did not reach
    a parameter sends None for it, a zero in the average; a parameter no worker reached has no
    gradient, so the optimizer skips it, as on one device."""
    sizes = sizes or [1] * len(grads_per_worker)
    with ctx.trace.span("compute", name="average gradients"), torch.no_grad():
        for p, buffer, grads in zip(_server.trainable, _server.grads, zip(*grads_per_worker)):
            got = [(g, n) for g, n in zip(grads, sizes) if g is not None]
            p.grad = buffer if got else None
            if got:
                buffer.zero_()
                for g, n in got:
                    buffer.add_(g.to(p.device), alpha=n)
                buffer.div_(sum(sizes))
    with ctx.trace.span("optimizer"), _server.lock:
        optimizer.step()
        _server.version += 1
        return _server.version


def _serve(ctx, cfg, model, optimizer):
    workers = ctx.world_size - 1
    sizes = shard_sizes(cfg.batch_size, workers)
    losses, staleness, order = [], [], []
    for p, buffer in zip(_server.trainable, _server.grads):
        p.grad = buffer
    with ctx.memory.track(model, optimizer):
        if cfg.option("mode") == "sync":
            for step in range(cfg.steps):
                ctx.set_step(step)
                pushes = sorted((_server.pushes.get() for _ in range(workers)), key=lambda p: p.worker)
                staleness += [_server.version - p.version for p in pushes]
                version = _apply(ctx, optimizer, [p.grads for p in pushes], sizes)
                losses.append(sum(p.loss * n for p, n in zip(pushes, sizes)) / cfg.batch_size)  # the batch mean
                order += [(p.worker, p.step) for p in pushes]
                for p in pushes:
                    p.done.set_result(version)
        else:
            for i in range(cfg.steps * workers):
                ctx.set_step(i // workers)  # rounds of one push per worker, on average
                push = _server.pushes.get()
                staleness.append(_server.version - push.version)
                push.done.set_result(_apply(ctx, optimizer, [push.grads]))
                losses.append(push.loss)
                order.append((push.worker, push.step))
    return losses, {"mode": cfg.option("mode"), "staleness": staleness, "apply_order": order,
                    "pushes_per_worker": {w: sum(o[0] == w for o in order) for w in range(1, ctx.world_size)}}


def _pull_into(ctx, model, step) -> int:
    """Copy the server's current parameters into ``model`` at the start of ``step``; returns their version."""
    start = ctx.trace.now()
    version, params = rpc.rpc_sync(SERVER, _pull, args=(ctx.rank, step))
    ctx.trace.record("rpc", start, ctx.trace.now(), name=f"pull version {version}")
    with torch.no_grad():
        for p, new in zip(model.parameters(), params):
            p.copy_(new)
    return version


def _push_from(ctx, model, step, version, loss) -> None:
    """Send this worker's gradients (computed on parameters of ``version``) and drop them."""
    grads = [None if p.grad is None else p.grad.cpu() for p in model.parameters() if p.requires_grad]
    start = ctx.trace.now()
    rpc.rpc_sync(SERVER, _push, args=(ctx.rank, step, version, loss, grads))
    ctx.trace.record("rpc", start, ctx.trace.now(), bytes=sum(nbytes(g) for g in grads if g is not None),
                     name=f"push (pulled version {version})")
    model.zero_grad(set_to_none=True)


def _work(ctx, cfg, model):
    """A worker's steps in the one loop: pull (from its second step on), forward/backward on its
    shard, push."""
    state = {"step": 0, "version": 0}

    def step(x, y):
        if state["step"]:
            state["version"] = _pull_into(ctx, model, state["step"])
        loss = forward_backward(ctx, cfg, model, x, y).item()
        _push_from(ctx, model, state["step"], state["version"], loss)
        state["step"] += 1
        return loss

    run_steps(ctx, cfg, step, local_batch(ctx, cfg, ctx.rank - 1, ctx.world_size - 1), track=(model,))
    return {"pushes": cfg.steps}


def run_rank(ctx, cfg):
    global _server
    model = cfg.model.build(cfg.seed).to(ctx.device)
    if ctx.rank == 0:
        _server = _Server(ctx, model)
    join_rpc(ctx)
    if ctx.rank == 0:
        losses, extra = _serve(ctx, cfg, model, make_optimizer(model.parameters(), cfg))
        rpc.shutdown()  # waits until every worker is done too
        return RankOutput(losses=losses, params=state_of(model), extra={"role": "server", **extra})
    extra = _work(ctx, cfg, model)
    rpc.shutdown()
    return RankOutput(extra={"role": "worker", **extra})


def program(pricer):
    """One synchronous step (rank 0 serves): each worker pulls the parameters (one rpc, traced on
    both sides as the run traces it), runs forward/backward on its shard and pushes its gradients
    (one rpc, answered once the server stepped); the server takes the pushes one after another
    over its own link, averages them and steps. rpc (TensorPipe) is priced with the gloo p2p
    link: same sockets, a little more per-message software."""
    if pricer.options["mode"] != "sync":
        raise ValueError("ps mode='async' has no step to predict (each push is its own update); use mode='sync'")
    workers = pricer.world - 1
    prof = pricer.piece(batch=-(-pricer.batch // workers))  # the largest shard: the server waits for it
    size = prof.total_param_bytes
    tensors = sum(len(sh) for sh in prof.layer_shapes.values())

    def rpc(side, me, peer, key, nbytes, name="", record=True):
        return message(pricer, side, me, peer, key, nbytes, kind="rpc", name=name, record=record)

    server = [rpc("send", 0, w, ("pull", w), size, f"pull reply to rank {w}") for w in range(1, pricer.world)]
    server += [rpc("recv", 0, w, ("push", w), size, record=False) for w in range(1, pricer.world)]
    average = Cost(ops=tensors * (workers + 1), bytes=3 * size * workers)  # copy, add_ per push, div_
    server += [Compute("compute", pricer.seconds(average, "optimizer"), name="average gradients"),
               optimizer(pricer, prof)]
    server += [rpc("send", 0, w, ("reply", w), 8, record=False) for w in range(1, pricer.world)]
    programs = [server]
    for w in range(1, pricer.world):
        programs.append([rpc("recv", w, 0, ("pull", w), size, "pull"), *fwd_bwd(pricer, prof),
                         rpc("send", w, 0, ("push", w), size, "push"), rpc("recv", w, 0, ("reply", w), 8, record=False)])
    return programs


STRATEGY = Strategy("ps", OPTIONS, validate, run_rank, program, dim=None, no_precision=(
    "its workers push gradients over rpc to a server that steps on them, so fp16's loss scaler would have to "
    "live on the server and, in mode='async', skip one worker's push while the others' apply: mpkit leaves "
    "the parameter server in fp32; for mixed precision or recomputation with data parallelism use dp, ddp, "
    "zero1 or fsdp"), no_checkpoint=(
    "its parameters and optimizer live on the server behind rpc, and in mode='async' the order in which pushes "
    "apply is not reproducible, so a resumed run could not equal the uninterrupted one; for checkpoints of "
    "data parallelism use dp, ddp, zero1 or fsdp"))
