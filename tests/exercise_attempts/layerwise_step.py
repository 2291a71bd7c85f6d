"""Attempts for layerwise_step(ctx, stage, x, y, loss_fn, act_shape)."""
import torch
import torch.distributed as dist


# ---------------------------------------------------------------- correct
def hook_sends_input_grad(ctx, stage, x, y, loss_fn, act_shape):
    """The input gradient is sent back from a tensor hook during backward."""
    r, n = ctx.rank, ctx.world_size
    if r == 0:
        a = x
    else:
        buf = torch.empty(act_shape)
        dist.recv(buf, src=r - 1)
        a = buf.clone().requires_grad_(True)
        a.register_hook(lambda g: dist.send(g.contiguous(), dst=r - 1))
    out = stage(a)
    if r == n - 1:
        loss = loss_fn(out, y)
        loss.backward()
        return loss
    dist.send(out.detach().contiguous(), dst=r + 1)
    g = torch.empty(act_shape)
    dist.recv(g, src=r + 1)
    torch.autograd.backward([out], [g])
    return None


def nonblocking_and_autograd_grad(ctx, stage, x, y, loss_fn, act_shape):
    """isend/irecv + wait; torch.autograd.grad for the input and the parameters, p.grad filled by hand."""
    r, n = ctx.rank, ctx.world_size
    params = [p for p in stage.parameters() if p.requires_grad]
    if r > 0:
        a = torch.zeros(act_shape)
        dist.irecv(a, src=r - 1).wait()
        a.requires_grad_()
    else:
        a = x
    out = stage(a)
    if r < n - 1:
        dist.isend(out.detach().clone(), dst=r + 1).wait()
        gout = torch.zeros(act_shape)
        dist.irecv(gout, src=r + 1).wait()
        target, gvec, loss = out, gout, None
    else:
        loss = loss_fn(out, y)
        target, gvec = loss, None
    inputs = params + ([a] if r > 0 else [])
    grads = torch.autograd.grad(target, inputs, grad_outputs=gvec, allow_unused=True)
    for p, gp in zip(params, grads[:len(params)]):
        if gp is None:
            continue
        p.grad = gp.clone() if p.grad is None else p.grad + gp
    if r > 0:
        dist.isend(grads[-1].contiguous(), dst=r - 1).wait()
    return loss


CORRECT = [hook_sends_input_grad, nonblocking_and_autograd_grad]


# ---------------------------------------------------------------- wrong
def forgot_requires_grad(ctx, stage, x, y, loss_fn, act_shape):
    r, n = ctx.rank, ctx.world_size
    if r == 0:
        a = x
    else:
        a = torch.empty(act_shape)
        dist.recv(a, r - 1)
    out = stage(a)
    if r == n - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty(act_shape)
        dist.recv(g, r + 1)
        out.backward(g)
        loss = None
    if r > 0:
        dist.send(a.grad, r - 1)
    return loss


def backward_without_gradient(ctx, stage, x, y, loss_fn, act_shape):
    """Non-last ranks call out.backward() without the received gradient."""
    r, n = ctx.rank, ctx.world_size
    if r == 0:
        a = x
    else:
        a = torch.empty(act_shape)
        dist.recv(a, r - 1)
        a.requires_grad_()
    out = stage(a)
    if r == n - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty(act_shape)
        dist.recv(g, r + 1)
        out.sum().backward()
        loss = None
    if r > 0:
        dist.send(a.grad, r - 1)
    return loss


def never_sends_input_grad(ctx, stage, x, y, loss_fn, act_shape):
    """Forgets to send a.grad back: the previous rank waits forever."""
    r, n = ctx.rank, ctx.world_size
    if r == 0:
        a = x
    else:
        a = torch.empty(act_shape)
        dist.recv(a, r - 1)
        a.requires_grad_()
    out = stage(a)
    if r == n - 1:
        loss = loss_fn(out, y)
        loss.backward()
        return loss
    dist.send(out.detach(), r + 1)
    g = torch.empty(act_shape)
    dist.recv(g, r + 1)
    out.backward(g)
    return None


def returns_output_everywhere(ctx, stage, x, y, loss_fn, act_shape):
    """Correct step, but non-last ranks return their output instead of None."""
    r, n = ctx.rank, ctx.world_size
    if r == 0:
        a = x
    else:
        a = torch.empty(act_shape)
        dist.recv(a, r - 1)
        a.requires_grad_()
    out = stage(a)
    if r == n - 1:
        loss = loss_fn(out, y)
        loss.backward()
        result = loss
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty(act_shape)
        dist.recv(g, r + 1)
        out.backward(g)
        result = out.detach()
    if r > 0:
        dist.send(a.grad, r - 1)
    return result


def last_rank_no_backward(ctx, stage, x, y, loss_fn, act_shape):
    """Last rank computes the loss but never calls backward (so nothing flows back)."""
    r, n = ctx.rank, ctx.world_size
    if r == 0:
        a = x
    else:
        a = torch.empty(act_shape)
        dist.recv(a, r - 1)
        a.requires_grad_()
    out = stage(a)
    if r == n - 1:
        return loss_fn(out, y)
    dist.send(out.detach(), r + 1)
    g = torch.empty(act_shape)
    dist.recv(g, r + 1)
    out.backward(g)
    if r > 0:
        dist.send(a.grad, r - 1)
    return None


def grad_sent_wrong_way(ctx, stage, x, y, loss_fn, act_shape):
    """Sends the input gradient to r+1 instead of r-1."""
    r, n = ctx.rank, ctx.world_size
    if r == 0:
        a = x
    else:
        a = torch.empty(act_shape)
        dist.recv(a, r - 1)
        a.requires_grad_()
    out = stage(a)
    if r == n - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), r + 1)
        g = torch.empty(act_shape)
        dist.recv(g, r + 1)
        out.backward(g)
        loss = None
    if r > 0:
        dist.send(a.grad, (r + 1) % n)
    return loss


WRONG = [
    (forgot_requires_grad, "requires_grad"),
    (backward_without_gradient, "gradient"),
    (never_sends_input_grad, "missing"),
    (returns_output_everywhere, "none"),
    (last_rank_no_backward, "missing"),
    (grad_sent_wrong_way, "deadlock"),
]
