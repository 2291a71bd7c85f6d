"""Blind attempts at layerwise_step (written without the reference)."""
import torch
import torch.distributed as dist


# unusual: non-blocking ctx.comm messages and torch.autograd.backward
def with_ctx_comm(ctx, stage, x, y, loss_fn, act_shape):
    r, last = ctx.rank, ctx.world_size - 1
    if r == 0:
        a = x
    else:
        a = torch.empty(act_shape)
        ctx.comm.irecv(a, r - 1).wait()
        a.requires_grad_()
    out = stage(a)
    loss = None
    if r == last:
        loss = loss_fn(out, y)
        torch.autograd.backward(loss)
    else:
        ctx.comm.isend(out.detach(), r + 1).wait()
        g = torch.empty(act_shape)
        ctx.comm.irecv(g, r + 1).wait()
        torch.autograd.backward(out, grad_tensors=g)
    if r > 0:
        ctx.comm.isend(a.grad, r - 1).wait()
    return loss


# unusual: every message through dist.batch_isend_irecv with P2POp
def with_batched_p2p(ctx, stage, x, y, loss_fn, act_shape):
    r, n = dist.get_rank(), dist.get_world_size()

    def exchange(op, tensor, peer):
        for work in dist.batch_isend_irecv([dist.P2POp(op, tensor, peer)]):
            work.wait()

    a = x
    if r > 0:
        a = torch.zeros(act_shape)
        exchange(dist.irecv, a, r - 1)
        a.requires_grad_(True)
    out = stage(a)
    if r == n - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        exchange(dist.isend, out.detach().contiguous(), r + 1)
        grad = torch.zeros(act_shape)
        exchange(dist.irecv, grad, r + 1)
        out.backward(grad)
        loss = None
    if r > 0:
        exchange(dist.isend, a.grad, r - 1)
    return loss


def _step(ctx, stage, x, y, loss_fn, act_shape, needs_grad=True, grad_to=-1, every_rank_returns=False,
          backward_everywhere=True):
    """the usual step with one thing changeable, for the wrong attempts below."""
    r, last = ctx.rank, ctx.world_size - 1
    a = x
    if r > 0:
        a = torch.empty(act_shape)
        dist.recv(a, r - 1)
        if needs_grad:
            a.requires_grad_()
    out = stage(a)
    loss = None
    if r == last:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), r + 1)
        if backward_everywhere:
            g = torch.empty(act_shape)
            dist.recv(g, r + 1)
            out.backward(g)
    if r > 0 and backward_everywhere:
        dist.send(a.grad, r + grad_to)
    if every_rank_returns:
        return loss if loss is not None else out.sum()
    return loss


# wrong (raises): the received activation never gets requires_grad_(), so a.grad is None
def no_requires_grad(ctx, stage, x, y, loss_fn, act_shape):
    return _step(ctx, stage, x, y, loss_fn, act_shape, needs_grad=False)


# wrong: sends the input gradient forwards to r+1 instead of back to r-1 (nobody receives it there)
def grad_sent_forwards(ctx, stage, x, y, loss_fn, act_shape):
    return _step(ctx, stage, x, y, loss_fn, act_shape, grad_to=+1)


# wrong: ranks other than the last return something instead of None
def every_rank_returns_loss(ctx, stage, x, y, loss_fn, act_shape):
    return _step(ctx, stage, x, y, loss_fn, act_shape, every_rank_returns=True)


# wrong: only the last rank runs backward; earlier stages never get p.grad
def backward_only_on_last(ctx, stage, x, y, loss_fn, act_shape):
    return _step(ctx, stage, x, y, loss_fn, act_shape, backward_everywhere=False)


# wrong (raises): off by one, rank 0 also receives from rank -1
def rank0_receives_too(ctx, stage, x, y, loss_fn, act_shape):
    a = torch.empty(act_shape)
    dist.recv(a, ctx.rank - 1)
    a.requires_grad_()
    return _step(ctx, stage, a, y, loss_fn, act_shape)


CORRECT = [with_ctx_comm, with_batched_p2p]
WRONG = [
    (no_requires_grad, ("requires_grad",)),
    (grad_sent_forwards, ("r-1", "r - 1", "previous", "direction", "backwards")),
    (every_rank_returns_loss, ("none", "only the last", "last rank returns")),
    (backward_only_on_last, ("p.grad", "no gradient", "backward", "grad is none")),
    (rank0_receives_too, ("rank -1", "-1", "rank 0")),
]
