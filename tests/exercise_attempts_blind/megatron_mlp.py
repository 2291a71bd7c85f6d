"""Blind attempts at megatron_mlp (written without the reference)."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


# unusual: matmul and transpose, gelu as a module-free torch call
def with_matmul(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = torch.matmul(f(x), up_weight.t()) + up_bias
    return g(torch.matmul(F.gelu(h), down_weight.t())) + down_bias


# unusual: einsum for both layers, the bias added with Tensor.add after g
def with_einsum(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = torch.nn.GELU()(torch.einsum("bi,oi->bo", f(x), up_weight) + up_bias)
    return g(torch.einsum("bh,oh->bo", h, down_weight)).add(down_bias)


# wrong: adds the whole down_bias on every rank before g (it is counted N times)
def bias_before_g(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.gelu(F.linear(f(x), up_weight, up_bias))
    return g(F.linear(h, down_weight, down_bias))


# wrong: GeLU after the all-reduce (on a sum of partial pre-activations)
def gelu_after_g(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.linear(f(x), up_weight, up_bias)
    return F.gelu(g(F.linear(h, down_weight)) + down_bias)


# wrong: forgets f, so the gradient of x is never summed over ranks
def forgets_f(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.gelu(F.linear(x, up_weight, up_bias))
    return g(F.linear(h, down_weight)) + down_bias


# wrong (wasteful): a second all-reduce just for the bias share
def two_all_reduces(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.gelu(F.linear(f(x), up_weight, up_bias))
    return g(F.linear(h, down_weight)) + g(down_bias / dist.get_world_size())


# wrong (raises): multiplies by up_weight without transposing it
def no_transpose(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.gelu(f(x) @ up_weight + up_bias)
    return g(h @ down_weight) + down_bias


CORRECT = [with_matmul, with_einsum]
WRONG = [
    (bias_before_g, ("bias", "b2", "once")),
    (gelu_after_g, ("gelu", "nonlinear")),
    (forgets_f, ("f(x)", "gradient of x", "x.grad", "input's gradient")),
    (two_all_reduces, ("twice", "two all-reduce", "2 all-reduce", "exactly one", "one all-reduce")),
    (no_transpose, ("shape", "transpose", ".t()")),
]
