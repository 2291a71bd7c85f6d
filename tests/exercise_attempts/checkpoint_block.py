"""Attempts for checkpoint_block(block, x): block(x) keeping only x for backward, recomputed in
backward with the forward's RNG state (dropout's mask), without torch.utils.checkpoint."""
import torch
import torch.utils.checkpoint as tuc


# ---------------------------------------------------------------- correct
def returns_parameter_grads(block, x):
    """The Function computes every parameter's gradient with torch.autograd.grad and returns them."""
    params = [p for p in block.parameters() if p.requires_grad]

    class Ckpt(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp, *ps):
            ctx.state = torch.get_rng_state()
            ctx.save_for_backward(inp)
            with torch.no_grad():
                return block(inp)

        @staticmethod
        def backward(ctx, grad):
            (inp,) = ctx.saved_tensors
            now = torch.get_rng_state()
            torch.set_rng_state(ctx.state)
            with torch.enable_grad():
                leaf = inp.detach().requires_grad_(inp.requires_grad)
                out = block(leaf)
                wrt = ([leaf] if leaf.requires_grad else []) + params
                got = torch.autograd.grad(out, wrt, grad)
            torch.set_rng_state(now)
            gx = got[0] if leaf.requires_grad else None
            return (gx, *got[1 if leaf.requires_grad else 0:])

    return Ckpt.apply(x, *params)


def saved_tensor_hooks_that_drop(block, x):
    """Non-reentrant style: the block runs under saved_tensors_hooks whose pack keeps only an index;
    the first unpack in backward recomputes the block from x with the forward's RNG state and
    hands out the tensors that recomputation saved, in the same order."""
    state, keep = torch.get_rng_state(), x.detach()
    count, store = [0], []

    def pack(t):
        count[0] += 1
        return count[0] - 1

    def unpack(i):
        if not store:
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                torch.set_rng_state(state)
                with torch.autograd.graph.saved_tensors_hooks(lambda t: store.append(t) or len(store) - 1,
                                                             lambda j: store[j]):
                    block(keep.requires_grad_(x.requires_grad))
        return store[i]
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return block(x)


def fork_rng_in_forward_too(block, x):
    """Both passes run inside fork_rng from the same captured state."""
    params = tuple(p for p in block.parameters() if p.requires_grad)
    state = torch.get_rng_state()

    class Recompute(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp, *ps):
            ctx.save_for_backward(inp)
            with torch.no_grad():
                out = block(inp)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            (inp,) = ctx.saved_tensors
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(state)
                with torch.enable_grad():
                    again = inp.detach()
                    again.requires_grad = inp.requires_grad
                    torch.autograd.backward(block(again), grad_out)
            return (again.grad,) + tuple(None for _ in ps_holder)

    ps_holder = params
    return Recompute.apply(x, *params)


CORRECT = [returns_parameter_grads, saved_tensor_hooks_that_drop, fork_rng_in_forward_too]


# ---------------------------------------------------------------- wrong
def _checkpoint(block, x, params, forward, backward):
    """A Function over (x, *params) made of the given forward(ctx, inp) and backward(ctx, grad) ->
    x's gradient: the frame the wrong ones below share."""
    class Ckpt(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp, *ps):
            return forward(ctx, inp)

        @staticmethod
        def backward(ctx, grad):
            return (backward(ctx, grad),) + (None,) * len(params)
    return Ckpt.apply(x, *params)


def _keep_input(ctx, inp, block):
    ctx.rng = torch.get_rng_state()
    ctx.save_for_backward(inp)
    with torch.no_grad():
        return block(inp)


def _recompute(ctx, grad, block, restore=True, requires_grad=None):
    inp = ctx.saved_tensors[0]
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        if restore:
            torch.set_rng_state(ctx.rng)
        leaf = inp.detach().requires_grad_(inp.requires_grad if requires_grad is None else requires_grad)
        torch.autograd.backward(block(leaf), grad)
    return leaf.grad


def plain_forward(block, x):
    """No checkpointing at all: every activation is saved."""
    return block(x)


def no_rng_restore(block, x):
    params = [p for p in block.parameters() if p.requires_grad]
    return _checkpoint(block, x, params, lambda ctx, inp: _keep_input(ctx, inp, block),
                       lambda ctx, grad: _recompute(ctx, grad, block, restore=False))


def uses_torch_checkpoint(block, x):
    return tuc.checkpoint(block, x, use_reentrant=False)


def only_x_as_input(block, x):
    """The textbook reentrant version: Function(x) only, so a first block (x without grad) gets none."""
    return _checkpoint(block, x, [], lambda ctx, inp: _keep_input(ctx, inp, block),
                       lambda ctx, grad: _recompute(ctx, grad, block, requires_grad=True))


def saves_the_hidden_layer(block, x):
    """Keeps the first layer's output for backward as well as x."""
    params = [p for p in block.parameters() if p.requires_grad]

    def forward(ctx, inp):
        ctx.rng = torch.get_rng_state()
        with torch.no_grad():
            hidden = block[0](inp)
            out = block[1:](hidden)
        ctx.save_for_backward(inp, hidden)
        return out
    return _checkpoint(block, x, params, forward, lambda ctx, grad: _recompute(ctx, grad, block))


def x_gradient_dropped(block, x):
    """Recomputes and backpropagates, but returns no gradient for x."""
    params = [p for p in block.parameters() if p.requires_grad]

    def backward(ctx, grad):
        _recompute(ctx, grad, block)   # the parameters get theirs; x's is dropped
        return None
    return _checkpoint(block, x, params, lambda ctx, inp: _keep_input(ctx, inp, block), backward)


WRONG = [
    (plain_forward, "the block's input only"),
    (no_rng_restore, "another dropout mask"),
    (uses_torch_checkpoint, "torch.utils.checkpoint"),
    (only_x_as_input, "pass the block's parameters"),
    (saves_the_hidden_layer, "the block's input only"),
    (x_gradient_dropped, "x's gradient"),
]
