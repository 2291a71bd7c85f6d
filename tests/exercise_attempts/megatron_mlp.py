"""Attempts for megatron_mlp(x, up_weight, up_bias, down_weight, down_bias, f, g)."""
import math

import torch
import torch.nn.functional as F


# ---------------------------------------------------------------- correct
def manual_matmul_erf_gelu(x, up_weight, up_bias, down_weight, down_bias, f, g):
    """Matmuls by hand and GeLU written with erf."""
    xin = f(x)
    h = xin.matmul(up_weight.t()) + up_bias
    a = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
    partial = a.matmul(down_weight.t())
    return g(partial) + down_bias


def einsum_version(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = torch.einsum("...i,oi->...o", f(x), up_weight) + up_bias
    z = g(torch.einsum("...o,jo->...j", F.gelu(h), down_weight))
    return down_bias.expand_as(z) + z


CORRECT = [manual_matmul_erf_gelu, einsum_version]


# ---------------------------------------------------------------- wrong
def missing_g(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.linear(f(x), up_weight, up_bias)
    return F.linear(F.gelu(h), down_weight) + down_bias


def bias_before_g(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.linear(f(x), up_weight, up_bias)
    return g(F.linear(F.gelu(h), down_weight, down_bias))


def missing_f(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.linear(x, up_weight, up_bias)
    return g(F.linear(F.gelu(h), down_weight)) + down_bias


def f_and_g_swapped(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.linear(g(x), up_weight, up_bias)
    return f(F.linear(F.gelu(h), down_weight)) + down_bias


def reduce_twice(x, up_weight, up_bias, down_weight, down_bias, f, g):
    """Gathers the hidden layer with g too (all-reduce after the column layer)."""
    h = g(F.linear(f(x), up_weight, up_bias))
    return g(F.linear(F.gelu(h), down_weight)) + down_bias


def relu_instead_of_gelu(x, up_weight, up_bias, down_weight, down_bias, f, g):
    h = F.linear(f(x), up_weight, up_bias)
    return g(F.linear(F.relu(h), down_weight)) + down_bias


def gelu_after_reduce(x, up_weight, up_bias, down_weight, down_bias, f, g):
    """GeLU applied to the summed output instead of between the layers."""
    h = F.linear(f(x), up_weight, up_bias)
    return F.gelu(g(F.linear(h, down_weight))) + down_bias


def bias_split_inside_g(x, up_weight, up_bias, down_weight, down_bias, f, g):
    """Adds down_bias / world_size before g: the forward is right, but down_bias's gradient is N times too small."""
    import torch.distributed as dist
    h = F.linear(f(x), up_weight, up_bias)
    return g(F.linear(F.gelu(h), down_weight) + down_bias / dist.get_world_size())


WRONG = [
    (missing_g, "all-reduce"),
    (bias_before_g, "bias"),
    (missing_f, "f"),
    (f_and_g_swapped, "swapped"),
    (reduce_twice, "once"),
    (relu_instead_of_gelu, "gelu"),
    (gelu_after_reduce, "gelu"),
    (bias_split_inside_g, "bias"),
]
