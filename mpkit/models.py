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

from mpkit.whole import is_number

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
        if not is_number(self.layer_ms) or not 0 <= self.layer_ms < math.inf:
            raise ValueError(f"layer_ms={self.layer_ms!r} must be a number of milliseconds >= 0 (0 = no simulated device time)")
        if self.kind == "gpt" and self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; pick hidden as a multiple of heads")

    @property
    def num_layers(self) -> int:
        """Length of ``model.layers``: mlp has exactly ``layers``; gpt adds embedding and head."""
        return self.layers if self.kind == "mlp" else self.layers + 2

    def as_dict(self):
        return asdict(self)

    # ---- what a run needs of any model (``UserModel`` has the same methods) ----
    builtin = True

    def build(self, seed: int = 0) -> "LayerStack":
        return build_model(self, seed)

    def batch(self, batch_size: int, step: int, seed: int = 0):
        return make_batch(self, batch_size, step, seed)

    def loss(self, output, target):
        return loss_fn(self, output, target)

    def layers_of(self, model) -> list:
        """The sequence of layers that pipelines cut into stages."""
        return list(model.layers)

    def describe(self) -> str:
        return describe(self)


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
        y = self.core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))

    def core(self, q, k, v):
        """The attention core, softmax(QK^T/sqrt(d))V: what selective recomputation recomputes."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


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
    """Counted on the meta device: a what-if size never allocates its weights."""
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(cfg).parameters())


def describe(cfg: ModelConfig) -> str:
    n = parameter_count(cfg)
    if cfg.kind == "mlp":
        return f"MLP {cfg.d_in}->{cfg.hidden}x{cfg.layers}->{cfg.classes} ({n:,} parameters)"
    return (f"TinyGPT: {cfg.layers} blocks, hidden {cfg.hidden}, {cfg.heads} heads, seq {cfg.seq_len}, "
            f"vocab {cfg.vocab} ({n:,} parameters, {math.ceil(n * 4 / 2**10)} KiB fp32)")


class UserModel:
    """A learner's own model for ``mpkit.train``: ``factory()`` builds it (called with the same seed
    on every rank, so the replicas start equal), ``data(step, batch_size)`` returns the step's
    global batch ``(inputs, targets)`` (the same on every rank), ``loss(output, target)`` the mean
    loss. Pipelines (``mp``, ``pp``) need the model to be an ``nn.Sequential``."""

    builtin = False

    def __init__(self, factory, data, loss=F.cross_entropy):
        if isinstance(factory, nn.Module):  # callable too, but calling it runs forward() with no input
            raise ValueError(f"model= takes a function that builds your model (model=MyNet or "
                             f"model=lambda: MyNet(...)), so that every rank builds its own copy from the same seed; "
                             f"got an instance of {type(factory).__name__}")
        for name, value in (("model", factory), ("data", data), ("loss", loss)):
            if not callable(value):  # the type, not the repr: a list of batches would print every tensor
                raise ValueError(f"{name}= must be callable, got a {type(value).__name__}: model=a function "
                                 f"returning an nn.Module, data=a function (step, batch_size) -> (inputs, targets), "
                                 f"loss=(output, target) -> loss")
        self.factory, self.data, self.loss_fn = factory, data, loss

    def build(self, seed: int = 0) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self.factory()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model factory {self.factory!r} returned a {type(model).__name__}, not an nn.Module")
        return model

    def batch(self, batch_size: int, step: int, seed: int = 0):
        out = self.data(step, batch_size)
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
            raise TypeError(f"data(step, batch_size) must return (inputs, targets) tensors; got {type(out).__name__}")
        if out[0].shape[0] != batch_size:
            raise ValueError(f"data(step={step}, batch_size={batch_size}) returned a batch of {out[0].shape[0]} samples; "
                             f"return exactly batch_size samples")
        return out

    def loss(self, output, target):
        return self.loss_fn(output, target)

    def layers_of(self, model) -> list:
        if not isinstance(model, nn.Sequential):
            raise ValueError(f"a pipeline cuts an nn.Sequential into stages; this model is a {type(model).__name__}. "
                             f"Return an nn.Sequential from the model factory to train it with mp or pp")
        return list(model)

    def describe(self) -> str:
        model = self.build()
        n = sum(p.numel() for p in model.parameters())
        return f"{type(model).__name__} from {getattr(self.factory, '__name__', 'a factory')} ({n:,} parameters)"

    def as_dict(self) -> dict:
        return {"kind": "user", "factory": getattr(self.factory, "__qualname__", repr(self.factory)),
                "data": getattr(self.data, "__qualname__", repr(self.data)),
                "loss": getattr(self.loss_fn, "__qualname__", repr(self.loss_fn))}

    def __eq__(self, other):
        return isinstance(other, UserModel) and (self.factory, self.data, self.loss_fn) == (
            other.factory, other.data, other.loss_fn)

    def __hash__(self):
        return hash((self.factory, self.data, self.loss_fn))

    def __repr__(self):
        return f"UserModel({self.as_dict()['factory']})"
