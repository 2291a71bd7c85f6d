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
    experts: int = 0  # gpt: >0 makes every block's MLP a mixture of this many experts
    top_k: int = 1  # experts per token
    capacity_factor: float = 1.25  # slots per expert = ceil(capacity_factor · seq_len · top_k / experts)

    def __post_init__(self):
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"model={self.kind!r} is unknown; use one of {', '.join(MODEL_KINDS)}")
        for name in ("layers", "hidden", "d_in", "classes", "vocab", "seq_len", "heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive whole number")
        if not is_number(self.layer_ms) or not 0 <= self.layer_ms < math.inf:
            raise ValueError(f"layer_ms={self.layer_ms!r} must be a number of milliseconds >= 0 (0 = no simulated device time)")
        self._check_experts()
        if self.kind == "gpt" and self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; pick hidden as a multiple of heads")

    def _check_experts(self):
        for name in ("experts", "top_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "experts" else 1):
                raise ValueError(f"{name}={value!r} must be a whole number >= {0 if name == 'experts' else 1}")
        if not is_number(self.capacity_factor) or not 0 < self.capacity_factor < math.inf:
            raise ValueError(f"capacity_factor={self.capacity_factor!r} must be a positive number, e.g. 1.25")
        if self.experts and self.kind != "gpt":
            raise ValueError("experts= makes the gpt's MLPs mixtures of experts; use model='gpt'")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} is larger than experts={self.experts}: a token cannot pick more "
                             f"experts than there are; use top_k <= {self.experts}")

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

    attention = None  # q, k, v -> y, all [batch, heads, seq, head_dim]; None: causal SDPA (context parallel swaps it)

    def forward(self, x):
        qkv = self.qkv(x)
        b, s = qkv.shape[:2]  # the whole sequence even when x is a sequence-parallel shard
        q, k, v = qkv.view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = self.core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))

    def core(self, q, k, v):
        """The attention core, softmax(QK^T/sqrt(d))V: what selective recomputation recomputes, and
        what context parallelism replaces (``attention``)."""
        if self.attention is not None:
            return self.attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class FeedForward(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class MixtureOfExperts(nn.Module):
    """A mixture-of-experts MLP (Switch/GShard): a router picks ``top_k`` of ``experts`` FeedForwards
    per token; each expert takes at most ``capacity`` tokens of each group (one group = one sequence
    of a [batch, seq, hidden] input, so the result does not depend on how the batch is split), and
    the tokens beyond it are dropped (they pass only through the residual). First choices are served
    before second choices, earlier tokens before later ones. A token's output is the sum of its kept
    experts' outputs weighted by their router probabilities (not renormalised, so the router learns
    even with ``top_k=1``, as in Switch).

    The step is route -> dispatch into an [experts, groups·capacity, hidden] buffer ->
    ``run_experts`` -> combine (``capacity_mixture``, which ``mpkit.parallel.expert_parallel`` runs
    too, with an all-to-all to the ranks that hold the experts in place of ``run_experts``). It
    follows the contract ``expert_parallel`` takes from any MoE: ``router(x) -> logits``,
    ``experts`` (an ``nn.ModuleList``), ``top_k``, ``capacity_factor``. ``stats`` holds the last
    forward's load per expert (tokens routed, before the capacity), the tokens kept, the dropped
    count and Switch's load-balancing loss E·Σ f_e·P_e (detached: reported, not trained)."""

    def __init__(self, hidden, experts, top_k=1, capacity_factor=1.25):
        super().__init__()
        self.num_experts, self.top_k, self.capacity_factor = experts, top_k, capacity_factor
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(hidden) for _ in range(experts))
        self.stats = {}

    def capacity(self, tokens: int) -> int:
        """Slots per expert and group: ceil(capacity_factor · tokens · top_k / experts)."""
        return capacity_slots(tokens, self.top_k, self.num_experts, self.capacity_factor)

    def run_experts(self, buffer):
        """[experts, slots, hidden] -> the same shape, expert e applied to row e."""
        return torch.stack([expert(buffer[e]) for e, expert in enumerate(self.experts)])

    def forward(self, x):
        y, stats = capacity_mixture(x, self.router(x), self.run_experts, self.top_k, self.capacity(x.shape[1]))
        self.stats = stats or self.stats
        return y


def capacity_slots(tokens: int, top_k: int, experts: int, capacity_factor: float) -> int:
    """Slots per expert and group: ceil(capacity_factor · tokens · top_k / experts), at least 1."""
    return max(1, math.ceil(capacity_factor * tokens * top_k / experts))


def capacity_mixture(x, logits, run_experts, k: int, cap: int, normalize: bool = False):
    """GShard's fixed-capacity mixture of x [groups, tokens, hidden] with router ``logits``
    [groups, tokens, experts]: (output, stats). ``run_experts`` maps the [experts, groups·cap,
    hidden] buffer to the experts' outputs; ``normalize``: the chosen weights renormalised to sum
    to 1 (Mixtral, Qwen's ``norm_topk_prob``). Stats are empty on the meta device."""
    g, t, h = x.shape
    e = logits.shape[-1]
    probs = F.softmax(logits, dim=-1)  # [g, t, e]
    weights, chosen = probs.topk(k, dim=-1)  # [g, t, k]
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    expert_hot = (chosen[..., None] == torch.arange(e, device=x.device)).to(x.dtype)  # [g, t, k, e]
    queue = expert_hot.transpose(1, 2).reshape(g, k * t, e)  # choice-major, then token order
    slot = ((queue.cumsum(1) - 1) * queue).sum(-1).view(g, k, t).transpose(1, 2)  # place in its expert's queue
    slot_hot = ((slot[..., None] == torch.arange(cap, device=x.device)) & (slot < cap)[..., None]).to(x.dtype)
    # GShard's dispatch and combine tensors [g, t, e, cap]: shapes only, so it also runs on the meta device
    dispatch = torch.einsum("gtke,gtkc->gtec", expert_hot, slot_hot)
    combine = torch.einsum("gtk,gtke,gtkc->gtec", weights, expert_hot, slot_hot)
    buffer = torch.einsum("gtec,gth->egch", dispatch, x).reshape(e, g * cap, h)
    out = run_experts(buffer).view(e, g, cap, h)
    y = torch.einsum("gtec,egch->gth", combine, out)
    if x.device.type == "meta":
        return y, {}
    with torch.no_grad():
        load, kept = expert_hot.sum((0, 1, 2)), dispatch.sum((0, 1, 3))
        return y, {"load": load.long(), "capacity": cap, "kept": kept.long(), "dropped": int(load.sum() - kept.sum()),
                   "balance_loss": balance_loss(expert_hot[:, :, 0], probs)}


def balance_loss(first_choice_hot, probs) -> float:
    """Switch's load-balancing loss E·Σ_e f_e·P_e: f_e the share of tokens whose first choice is e,
    P_e the mean router probability of e (1.0 when perfectly balanced)."""
    e = probs.shape[-1]
    return float(e * (first_choice_hot.reshape(-1, e).mean(0) * probs.reshape(-1, e).mean(0)).sum())


class Block(Layer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.layer_ms)
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = SelfAttention(cfg.hidden, cfg.heads)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = (MixtureOfExperts(cfg.hidden, cfg.experts, cfg.top_k, cfg.capacity_factor) if cfg.experts
                    else FeedForward(cfg.hidden))

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
    moe = f", MoE {cfg.experts} experts top-{cfg.top_k}" if cfg.experts else ""
    return (f"TinyGPT: {cfg.layers} blocks, hidden {cfg.hidden}, {cfg.heads} heads, seq {cfg.seq_len}, "
            f"vocab {cfg.vocab}{moe} ({n:,} parameters, {math.ceil(n * 4 / 2**10)} KiB fp32)")


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
