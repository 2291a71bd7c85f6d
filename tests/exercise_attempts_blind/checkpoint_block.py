"""Blind attempts (blind-b) at checkpoint_block: written from the stub and hints only."""
import torch


def _recompute(block, x, state):
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(state)
        with torch.enable_grad():
            xd = x.detach().requires_grad_(x.requires_grad)
            return xd, block(xd)


class _Checkpoint(torch.autograd.Function):
    """(x, *parameters) in, the inner backward accumulates the parameters' gradients itself."""

    @staticmethod
    def forward(ctx, block, x, *params):
        ctx.block, ctx.state = block, torch.get_rng_state()
        ctx.save_for_backward(x)
        return block(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xd, out = _recompute(ctx.block, x, ctx.state)
        torch.autograd.backward(out, grad)
        return (None, xd.grad if x.requires_grad else None) + (None,) * (len(ctx.needs_input_grad) - 2)


class _ReturnsParamGrads(torch.autograd.Function):
    """Same inputs, but torch.autograd.grad computes the parameters' gradients and the Function returns them."""

    @staticmethod
    def forward(ctx, block, x, *params):
        ctx.block = block
        ctx.state = torch.get_rng_state()
        ctx.save_for_backward(x)
        return block(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        params = list(ctx.block.parameters())
        saved_now = torch.get_rng_state()
        torch.set_rng_state(ctx.state)
        with torch.enable_grad():
            xd = x.detach().requires_grad_(x.requires_grad)
            out = ctx.block(xd)
        torch.set_rng_state(saved_now)
        wrt = ([xd] if x.requires_grad else []) + [p for p in params if p.requires_grad]
        got = iter(torch.autograd.grad(out, wrt, grad, allow_unused=True))
        gx = next(got) if x.requires_grad else None
        return (None, gx) + tuple(next(got) if p.requires_grad else None for p in params)


# correct, unusual: the block passed into the Function, the parameters as its trailing inputs (inner backward accumulates)
def function_with_params(block, x):
    return _Checkpoint.apply(block, x, *block.parameters())


# correct, unusual: the Function returns the parameters' gradients (torch.autograd.grad), RNG swapped by hand
def returns_param_grads(block, x):
    return _ReturnsParamGrads.apply(block, x, *block.parameters())


class _NoRng(_Checkpoint):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_(x.requires_grad)
            out = ctx.block(xd)
        torch.autograd.backward(out, grad)
        return (None, xd.grad if x.requires_grad else None) + (None,) * (len(ctx.needs_input_grad) - 2)


# mistake: recomputes without restoring the RNG state, so dropout draws a new mask
def no_rng_restore(block, x):
    return _NoRng.apply(block, x, *block.parameters())


class _NoFork(_Checkpoint):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        torch.set_rng_state(ctx.state)
        with torch.enable_grad():
            xd = x.detach().requires_grad_(x.requires_grad)
            out = ctx.block(xd)
        torch.autograd.backward(out, grad)
        return (None, xd.grad if x.requires_grad else None) + (None,) * (len(ctx.needs_input_grad) - 2)


# mistake: restores the RNG state without fork_rng, so the global stream is rewound and later dropouts repeat masks
def rng_not_forked(block, x):
    return _NoFork.apply(block, x, *block.parameters())


class _SavesOutput(_Checkpoint):
    @staticmethod
    def forward(ctx, block, x, *params):
        ctx.block, ctx.state = block, torch.get_rng_state()
        out = block(x)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, _ = ctx.saved_tensors
        xd, out = _recompute(ctx.block, x, ctx.state)
        torch.autograd.backward(out, grad)
        return (None, xd.grad if x.requires_grad else None) + (None,) * (len(ctx.needs_input_grad) - 2)


# mistake (values right, more memory): also saves the block's output for backward
def saves_output(block, x):
    return _SavesOutput.apply(block, x, *block.parameters())


# mistake: only x goes into the Function, so with a data input (no grad) the parameters get no gradient
def x_only(block, x):
    return _Checkpoint.apply(block, x)


class _NoDetach(_Checkpoint):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.state)
            with torch.enable_grad():
                out = ctx.block(x)
        torch.autograd.backward(out, grad)
        return (None, x.grad) + (None,) * (len(ctx.needs_input_grad) - 2)


# mistake: recomputes on the saved x itself (no detach().requires_grad_()), so x's gradient never appears
def no_detach(block, x):
    return _NoDetach.apply(block, x, *block.parameters())


class _Double(_ReturnsParamGrads):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xd, out = _recompute(ctx.block, x, ctx.state)
        params = list(ctx.block.parameters())
        trainable = [p for p in params if p.requires_grad]
        grads = torch.autograd.grad(out, ([xd] if x.requires_grad else []) + trainable, grad, retain_graph=True,
                                    allow_unused=True)
        torch.autograd.backward(out, grad)
        got = iter(grads)
        gx = next(got) if x.requires_grad else None
        return (None, gx) + tuple(next(got) if p.requires_grad else None for p in params)


# mistake: both accumulates the parameters' gradients inside AND returns them, so they count twice
def params_counted_twice(block, x):
    return _Double.apply(block, x, *block.parameters())


class _OneGrad(_Checkpoint):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        xd, out = _recompute(ctx.block, x, ctx.state)
        torch.autograd.backward(out, grad)
        return None, xd.grad if x.requires_grad else None


# mistake (raises): backward returns gradients for (block, x) only, none for the parameters
def too_few_gradients(block, x):
    return _OneGrad.apply(block, x, *block.parameters())


CORRECT = [function_with_params, returns_param_grads]
WRONG = [
    (no_rng_restore, ("rng", "dropout", "mask")),
    (rng_not_forked, ("fork_rng", "rewound", "global rng", "random stream")),
    (saves_output, ("activation", "memory", "bytes")),
    (x_only, ("parameter", "requires_grad", "requires grad", "first block")),
    (no_detach, ("detach", "requires_grad_", "x's gradient", "gradient of x")),
    (params_counted_twice, ("twice", "double", "2x")),
    (too_few_gradients, ("number of gradients", "none per parameter")),
]
