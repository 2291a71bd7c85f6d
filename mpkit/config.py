"""What a training run is asked to do, checked before any rank starts.

``TrainConfig`` is the plain data every strategy, the cost model and the plots read.
``build_config`` checks the arguments all strategies share (world size, steps, batch, optimizer,
learning rate, seed) and resolves the model sizes; each strategy then checks its own options
(``mpkit.strategies.make_config``). A bad value is a ``ValueError`` that names the argument and
says what to pass, never a hang inside the world.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from mpkit.models import ModelConfig, UserModel
from mpkit.vocabulary import RECOMPUTE
from mpkit.whole import is_number, is_whole  # re-exported for the runtime, train and sim.predict

OPTIMIZERS = ("adam", "sgd")
PRECISIONS = ("fp32", "bf16", "fp16")  # the recipes of mpkit.parallel.precision
DEFAULT_LOSS_SCALE = 2.0**16  # torch.amp.GradScaler's init_scale
MODEL_FIELDS = frozenset(f.name for f in fields(ModelConfig)) - {"kind"}


@dataclass(frozen=True)
class Checkpointing:
    """``mpkit.train``'s checkpoint arguments, resolved by ``train`` before any rank starts:
    save into ``directory`` (``step_000004``, ...) after every ``every`` steps (None: after the
    last one), ``blocking=False`` with ``dcp.async_save``; start from the checkpoint
    ``resume_from``, which holds ``start_step`` steps. ``failure``: (step, rank) where the run
    kills that rank once (SIGKILL), to watch a job lose a rank and come back."""

    directory: str | None = None
    every: int | None = None
    resume_from: str | None = None
    start_step: int = 0
    blocking: bool = True
    failure: tuple[int, int] | None = None

    @property
    def saves(self) -> bool:
        return self.directory is not None

    def due(self, steps_done: int, steps: int) -> bool:
        """Whether a save follows the step that brings the count to ``steps_done`` (of ``steps``)."""
        if not self.saves:
            return False
        return steps_done == steps if self.every is None else steps_done % self.every == 0


@dataclass(frozen=True)
class TrainConfig:
    strategy: str
    world_size: int
    model: ModelConfig | UserModel
    steps: int = 3
    batch_size: int = 32
    lr: float = 1e-2
    optimizer: str = "adam"
    seed: int = 0
    options: dict = field(default_factory=dict)
    check_finite: bool = True  # stop with an error naming the step when a loss is NaN or infinite
    precision: str = "fp32"  # "bf16" / "fp16": autocast compute, fp32 master weights (mpkit.parallel.precision)
    recompute: str | None = None  # "full" / "selective": activation checkpointing (mpkit.parallel.recompute)
    loss_scale: float = DEFAULT_LOSS_SCALE  # fp16's first dynamic loss scale
    checkpointing: Checkpointing = field(default_factory=Checkpointing)  # set by mpkit.train

    def option(self, name):
        return self.options[name]

    def as_dict(self):
        out = asdict(self)
        out["model"] = self.model.as_dict()
        return out


def model_config(model, sizes, data=None, loss=None) -> ModelConfig | UserModel:
    """A built-in model's config from a name, a dict or a ``ModelConfig`` with ``sizes`` applied,
    or a ``UserModel`` from a factory (``model=lambda: MyNet()``) with its ``data`` and ``loss``."""
    if callable(model) and not isinstance(model, (ModelConfig, UserModel)):
        if sizes:
            raise ValueError(f"model sizes {sorted(sizes)} set the built-in models; your model factory sets its own")
        if data is None:
            raise ValueError("model=<a factory> needs data=<a function (step, batch_size) -> (inputs, targets)>, "
                             "the same batch on every rank")
        return UserModel(model, data) if loss is None else UserModel(model, data, loss)
    if data is not None or loss is not None:
        raise ValueError("data= and loss= go with model=<your model factory>; the built-in models make their own")
    if isinstance(model, UserModel):
        return model
    if isinstance(model, ModelConfig):
        return ModelConfig(**{**model.as_dict(), **sizes})
    if isinstance(model, dict):
        return ModelConfig(**{**model, **sizes})
    return ModelConfig(kind=model, **sizes)


SEED_LIMIT = 2**32  # seeds are mixed with the step number into torch generator seeds; keep them plain


def _check_shared(world_size, steps, batch_size, lr, optimizer, seed) -> None:
    """The arguments every strategy takes, checked in the caller: each error names the argument and
    says what to pass. How many ranks this machine can hold is the launcher's check
    (``mpkit.runtime.devices.check_world_size``): ``sim.predict`` plans clusters bigger than this machine."""
    if not is_whole(world_size) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: pass a whole number >= 1")
    if not is_whole(steps) or steps < 1:
        raise ValueError(f"steps={steps!r}: pass a whole number of optimizer steps >= 1, e.g. steps=3")
    if not is_whole(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: pass a whole number >= 1, e.g. batch_size=32")
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} is unknown; use one of {', '.join(OPTIMIZERS)}")
    if not is_number(lr):
        raise ValueError(f"lr={lr!r}: the learning rate must be a number, e.g. lr=0.01")
    if not (0 < lr < math.inf):
        raise ValueError(f"lr={lr!r}: the learning rate must be positive and finite, e.g. lr=0.01")
    if not is_whole(seed) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed={seed!r}: pass a whole number from 0 to {SEED_LIMIT - 1}, e.g. seed=0")


def check_precision_name(precision) -> None:
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is unknown; use 'fp32', 'bf16' (autocast, fp32 master weights) "
                         f"or 'fp16' (the same with dynamic loss scaling)")


def check_recompute(recompute) -> None:
    """A run recomputes "full" or "selective" (``mpkit.parallel.recompute``); None or "none": not at all."""
    if recompute is not None and (recompute not in RECOMPUTE or recompute == "op"):
        known = "is priced by mpkit.sim.plan only" if recompute == "op" else "is unknown"
        raise ValueError(f"recompute={recompute!r} {known}; use 'full' (every layer), 'selective' (the attention "
                         f"core only) or None")


def _check_precision(precision, recompute, loss_scale) -> None:
    """The precision recipe and recomputation (``mpkit.parallel.precision``/``recompute``) by name."""
    check_precision_name(precision)
    check_recompute(recompute)
    if not is_number(loss_scale) or not 0 < loss_scale < math.inf:
        raise ValueError(f"loss_scale={loss_scale!r}: fp16's first loss scale must be a positive number, e.g. 2.0**16")
    if loss_scale != DEFAULT_LOSS_SCALE and precision != "fp16":
        raise ValueError(f"loss_scale={loss_scale!r} scales fp16's loss; precision={precision!r} has no loss scaler "
                         f"(pass precision='fp16', or leave loss_scale out)")


def build_config(strategy, world_size, options, defaults, *, model="mlp", steps=3, batch_size=32, lr=1e-2,
                 optimizer="adam", seed=0, data=None, loss=None, check_finite=True, precision="fp32",
                 recompute=None, loss_scale=DEFAULT_LOSS_SCALE) -> TrainConfig:
    """A ``TrainConfig`` whose shared arguments are checked; ``options`` are the strategy's own (with
    model sizes mixed in, as ``mpkit.train`` takes them), ``defaults`` its option defaults."""
    options = dict(options)
    model_cfg = model_config(model, {k: options.pop(k) for k in list(options) if k in MODEL_FIELDS}, data, loss)
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        valid = ", ".join(defaults) or "none"
        raise ValueError(f"option(s) {unknown} do not apply to strategy={strategy!r}; its options are: {valid} "
                         f"(model sizes: {', '.join(sorted(MODEL_FIELDS))})")
    _check_shared(world_size, steps, batch_size, lr, optimizer, seed)
    if not isinstance(check_finite, bool):
        raise ValueError(f"check_finite={check_finite!r} must be True (stop at a NaN/inf loss) or False")
    _check_precision(precision, recompute, loss_scale)
    return TrainConfig(strategy, int(world_size), model_cfg, int(steps), int(batch_size), float(lr), optimizer,
                       int(seed), {**defaults, **options}, check_finite, precision,
                       None if recompute == "none" else recompute, float(loss_scale))


__all__ = ["TrainConfig", "Checkpointing", "OPTIMIZERS", "PRECISIONS", "DEFAULT_LOSS_SCALE", "MODEL_FIELDS",
           "model_config", "build_config", "check_precision_name", "check_recompute"]
