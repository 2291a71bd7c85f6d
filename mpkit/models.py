"""The lab's small built-in models and data, made in code from a seed (no downloads).

Both models are a flat list of layers (``model.layers``) so that every strategy splits the same
way: layer-wise model parallel and pipelines cut the list, tensor parallel replaces the Linear
layers inside a block, data parallel copies the whole list. Same seed -> same weights everywhere.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

MODEL_KINDS = ("mlp", "gpt")


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the built-in models. ``mlp``: d_in -> hidden x (layers) -> classes.
    ``gpt``: vocab, seq_len, hidden, heads, layers (transformer blocks), with 4*hidden MLPs.

    ``layer_ms`` adds simulated device time: every layer's forward takes that many extra
    milliseconds and its backward twice as many, spent sleeping. A sleeping rank, like a rank
    waiting for its GPU, leaves the CPU core to the others, so 4 ranks on a 2-core laptop
    still behave like 4 dedicated devices (pipeline bubbles become measurable)."""

    kind: str = "mlp"
    layers: int = 4
    hidden: int = 64
    d_in: int = 32
    classes: int = 8
    vocab: int = 64
    seq_len: int = 16
    heads: int = 4
    layer_ms: float = 0.0

    def __post_init__(self):
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"model={self.kind!r} is unknown; use one of {', '.join(MODEL_KINDS)}")
        for name in ("layers", "hidden", "d_in", "classes", "vocab", "seq_len", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive whole number")
        if not isinstance(self.layer_ms, (int, float)) or isinstance(self.layer_ms, bool) or not self.layer_ms >= 0:
            raise ValueError(f"layer_ms={self.layer_ms!r} must be a number of milliseconds >= 0 (0 = no simulated device time)")
        if self.kind == "gpt" and self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; pick hidden as a multiple of heads")

    @property
    def num_layers(self) -> int:
        """Length of ``model.layers``: mlp has exactly ``layers``; gpt adds embedding and head."""
        return self.layers if self.kind == "mlp" else self.layers + 2

    def as_dict(self):
        return asdict(self)


class SimulatedDeviceTime(torch.autograd.Function):
    """Identity that sleeps ``seconds`` in forward and twice that in backward (see ModelConfig)."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.seconds)
        return grad, None


class Layer(nn.Module):
    """A layer of the stack: ``compute`` plus the optional simulated device time."""

    def __init__(self, layer_ms=0.0):
        super().__init__()
        self.layer_ms = layer_ms

    def forward(self, x):
        out = self.compute(x)
        return SimulatedDeviceTime.apply(out, self.layer_ms / 1e3) if self.layer_ms else out


class DenseReLU(Layer):
    def __init__(self, d_in, d_out, activation=True, layer_ms=0.0):
        super().__init__(layer_ms)
        self.fc = nn.Linear(d_in, d_out)
        self.activation = activation

    def compute(self, x):
        x = self.fc(x)
        return F.relu(x) if self.activation else x


class Embedding(Layer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.layer_ms)
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)

    def compute(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class SelfAttention(nn.Module):
    """Causal multi-head attention; ``qkv`` and ``proj`` are the layers tensor parallel splits."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(Layer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.layer_ms)
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = SelfAttention(cfg.hidden, cfg.heads)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = FeedForward(cfg.hidden)

    def compute(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(Layer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.layer_ms)
        self.ln = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab)

    def compute(self, x):
        return self.out(self.ln(x))


class LayerStack(nn.Module):
    """A model that is just its ``layers`` applied in order (what every strategy relies on)."""

    def __init__(self, layers, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.cfg = cfg

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def build_layers(cfg: ModelConfig) -> list[nn.Module]:
    if cfg.kind == "mlp":
        dims = [cfg.d_in] + [cfg.hidden] * (cfg.layers - 1) + [cfg.classes]
        return [DenseReLU(a, b, activation=i < cfg.layers - 1, layer_ms=cfg.layer_ms)
                for i, (a, b) in enumerate(zip(dims, dims[1:]))]
    return [Embedding(cfg), *(Block(cfg) for _ in range(cfg.layers)), Head(cfg)]


def build_model(cfg: ModelConfig, seed: int = 0) -> LayerStack:
    """The full model with weights fixed by ``seed`` (identical on every rank and in ``single``)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LayerStack(build_layers(cfg), cfg)


def loss_fn(cfg: ModelConfig, output, target):
    """Mean cross-entropy: over samples (mlp) or over all tokens (gpt)."""
    if cfg.kind == "gpt":
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


def make_batch(cfg: ModelConfig, batch_size: int, step: int, seed: int = 0):
    """The global batch of one step (inputs, targets), the same for every strategy.

    mlp: Gaussian inputs labelled by a fixed random linear teacher (learnable).
    gpt: sequences that count up from a random start modulo vocab (next token is learnable).
    """
    gen = torch.Generator().manual_seed(seed * 100_003 + step + 1)
    if cfg.kind == "mlp":
        teacher = torch.Generator().manual_seed(seed + 7)
        w = torch.randn(cfg.d_in, cfg.classes, generator=teacher)
        x = torch.randn(batch_size, cfg.d_in, generator=gen)
        return x, (x @ w).argmax(dim=1)
    start = torch.randint(0, cfg.vocab, (batch_size, 1), generator=gen)
    stride = torch.randint(1, 4, (batch_size, 1), generator=gen)
    seq = (start + stride * torch.arange(cfg.seq_len + 1)) % cfg.vocab
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def parameter_count(cfg: ModelConfig) -> int:
    return sum(p.numel() for p in build_model(cfg).parameters())


def describe(cfg: ModelConfig) -> str:
    n = parameter_count(cfg)
    if cfg.kind == "mlp":
        return f"MLP {cfg.d_in}->{cfg.hidden}x{cfg.layers}->{cfg.classes} ({n:,} parameters)"
    return (f"TinyGPT: {cfg.layers} blocks, hidden {cfg.hidden}, {cfg.heads} heads, seq {cfg.seq_len}, "
            f"vocab {cfg.vocab} ({n:,} parameters, {math.ceil(n * 4 / 2**10)} KiB fp32)")
