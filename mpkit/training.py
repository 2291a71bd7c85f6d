"""``mpkit.train``: run one strategy on the built-in model and data, return a ``Run``.

Options are checked here, in the caller, before any rank starts: a bad combination is a
``ValueError`` that says what to change, never a hang inside the world.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from mpkit.config import Checkpointing, TrainConfig, is_whole
from mpkit.models import describe
from mpkit.observe.memory import CATEGORIES
from mpkit.observe.trace import Trace
from mpkit.parallel import checkpoint
from mpkit.runtime.context import make_context
from mpkit.runtime.env import env_int, in_torchrun
from mpkit.runtime.launch import check_torchrun_world, launch
from mpkit.runtime.result import LaunchResult
from mpkit.strategies import get_strategy, make_config
from mpkit.strategies.checkpointing import read_history, step_dir

_REFERENCE_KEYS = ("steps", "batch_size", "lr", "optimizer", "seed", "precision", "loss_scale")  # bf16 vs bf16


@dataclass(frozen=True)
class Comparison:
    """Largest absolute differences from the single-device run (losses and every parameter)."""

    loss: float
    params: float
    worst_param: str

    @property
    def max(self) -> float:
        return max(self.loss, self.params)

    def __float__(self):
        return self.max

    def __str__(self):
        return f"max |Δloss| = {self.loss:.2e}, max |Δparam| = {self.params:.2e} (worst: {self.worst_param})"


class Run:
    """The result of ``mpkit.train``: losses per step, the merged trace, per-rank memory, config."""

    def __init__(self, config: TrainConfig, outputs, launch_result):
        self.config = config
        self.strategy = config.strategy
        self.world_size = config.world_size
        self.outputs = outputs
        self.losses = next((o.losses for o in outputs if o.losses is not None), [])
        self.params = {}
        for out in outputs:  # replicated strategies repeat names: the lowest rank wins
            for name, tensor in out.params.items():
                self.params.setdefault(name, tensor)
        self.trace = launch_result.trace
        self.memory = launch_result.memory
        self.backend = launch_result.backend
        self.first_step = config.checkpointing.start_step  # > 0: resumed from a checkpoint at that step
        self._reference = None

    @property
    def mesh(self):
        """Where the ranks sit on the dp x pp x tp grid (``mpkit.parallel.Layout``: ``coords(rank)``,
        ``groups(dim)``); None for the parameter server, which has no grid."""
        return get_strategy(self.strategy).mesh(self.config)

    @property
    def extra(self):
        return [o.extra for o in self.outputs]

    def history(self) -> list[dict]:
        """The events logged in ``checkpoint_dir`` (``history.jsonl``: every run's start, steps, saves and
        end, this run's and the runs before it in that directory); ``mpkit.plot.restarts`` draws them."""
        directory = self.config.checkpointing.directory
        return [] if directory is None else read_history(directory)

    @property
    def checkpoints(self) -> list[Path]:
        """The complete checkpoints in ``checkpoint_dir`` (this run's and earlier runs'), oldest first."""
        directory = self.config.checkpointing.directory
        return [] if directory is None else checkpoint.complete(directory)

    def memory_by_category(self, kind="max") -> list[dict[str, int]]:
        """Per rank {category: bytes}: ``max`` over the run per category, or ``peak`` breakdown."""
        return [dict(m.max_by_category if kind == "max" else m.peak_breakdown) for m in self.memory]

    def step_times(self) -> list[float]:
        """Wall time of each step, from the first to the last event of that step on any rank."""
        times = []
        for step in range(self.config.steps):
            events = [e for e in self.trace.events if e.step == step]
            if events:
                times.append(max(e.end for e in events) - min(e.start for e in events))
        return times

    def step_periods(self) -> list[float]:
        """Throughput view of each step k >= 1: the time from the start of step k-1 to the start
        of step k on one rank, median over ranks. Unlike ``step_times`` it does not count the
        skew between ranks (one rank starting a step late stretches the first-to-last window)."""
        starts = {}
        for e in self.trace.events:
            if e.step is not None:
                key = (e.rank, e.step)
                starts[key] = min(starts.get(key, e.start), e.start)
        periods = []
        for step in range(1, self.config.steps):
            gaps = [starts[(r, step)] - starts[(r, step - 1)] for r in range(self.world_size)
                    if (r, step) in starts and (r, step - 1) in starts]
            if gaps:
                periods.append(statistics.median(gaps))
        return periods

    def reference(self) -> "Run":
        if self._reference is None:
            cfg = self.config
            kwargs = {"model": cfg.model, **{k: getattr(cfg, k) for k in _REFERENCE_KEYS}}
            if in_torchrun():  # this process is a rank of torchrun's world and cannot start another
                self._reference = _single_in_process(make_config("single", 1, **kwargs))
            else:
                self._reference = train("single", world_size=1, **kwargs)
        return self._reference

    def _check_reference(self, ref: "Run") -> None:
        if not isinstance(ref, Run) or ref.strategy != "single":
            raise ValueError(f"reference must be a Run of mpkit.train('single', ...); got {ref!r}")
        mine, theirs = self.config, ref.config
        differ = [k for k in _REFERENCE_KEYS if getattr(mine, k) != getattr(theirs, k)]
        if mine.model != theirs.model:
            differ.insert(0, "model")
        if differ:
            raise ValueError(f"reference was trained with different {', '.join(differ)}; run "
                             f"mpkit.train('single', ...) with the same model, steps, batch_size, lr, optimizer, seed "
                             f"and precision")

    def compare_to_reference(self, reference: "Run | None" = None) -> Comparison:
        """Max |difference| from the single-device run with the same model, data and optimizer (a
        resumed run's losses against the reference's from ``first_step`` on).

        ``reference``: a ``single`` Run you already have (same settings), reused instead of
        training a new one; by default one is trained once per Run and cached."""
        if reference is not None:
            self._check_reference(reference)
            self._reference = reference
        ref = self.reference()
        missing = sorted(set(ref.params) - set(self.params))
        if missing:
            raise RuntimeError(f"strategy {self.strategy!r} did not report parameters {missing[:5]}...")
        loss_diff = max((abs(a - b) for a, b in zip(self.losses, ref.losses[self.first_step:])), default=0.0)
        worst, param_diff = "", 0.0
        for name, ref_tensor in ref.params.items():
            diff = (self.params[name].float() - ref_tensor.float()).abs().max().item()
            if diff >= param_diff:
                worst, param_diff = name, diff
        return Comparison(loss_diff, param_diff, worst)

    def summary(self) -> str:
        mem = self.memory_by_category()
        peak = max((m.peak_total for m in self.memory), default=0) / 2**20
        return (f"{self.strategy} on {self.world_size} rank(s) [{self.backend}] — {describe(self.config.model)}\n"
                f"  losses: {', '.join(f'{x:.4f}' for x in self.losses)}\n"
                f"  peak memory per rank: {peak:.2f} MiB; rank 0: "
                + ", ".join(f"{c} {mem[0][c] / 2**20:.2f}" for c in CATEGORIES) + " MiB\n"
                f"  bubble share {self.trace.bubble_share():.1%}, comm share {self.trace.comm_share():.1%}")

    def __repr__(self):
        return f"<Run {self.strategy} world_size={self.world_size} steps={self.config.steps} losses={self.losses}>"




def train(strategy="single", world_size=None, *, timeout=120.0, backend=None, device_memory=None, trace=True,
          memory=True, checkpoint_dir=None, checkpoint_every=None, checkpoint_async=False, resume_from=None,
          simulate_failure=None, **kwargs) -> Run | None:
    """Run ``strategy`` for ``steps`` optimizer steps on ``world_size`` ranks; see README for options.

    ``world_size`` defaults to 1 for ``single`` and 4 otherwise (under torchrun: its WORLD_SIZE).
    Under torchrun every rank calls this; rank 0 gets the Run and the other ranks ``None``.

    Checkpoints (``mpkit.parallel.checkpoint``): ``checkpoint_dir`` saves the model and optimizer
    into ``<dir>/step_000004`` etc. after every ``checkpoint_every`` steps (default: after the
    last), ``checkpoint_async=True`` with DCP's asynchronous save. ``resume_from``: a checkpoint
    (or a directory of them: the newest) to start from, saved by any strategy and layout; the
    run then trains from its step up to ``steps`` (counted from the very first step), and its
    ``losses`` are those of the steps it ran. ``resume_from="latest"``: the newest checkpoint in
    ``checkpoint_dir`` if there is one, else a fresh start (what a restarted job passes).
    ``simulate_failure=(step, rank)``: that rank kills itself (SIGKILL) as it starts that step, once
    per ``checkpoint_dir`` (a marker there remembers it), as a machine that fails mid-run.
    """
    if world_size is None:
        world_size = 1 if strategy == "single" else (env_int("WORLD_SIZE") if in_torchrun() else 4)
    elif in_torchrun() and is_whole(world_size):
        check_torchrun_world(world_size)
    cfg = make_config(strategy, world_size, **kwargs)
    cfg = replace(cfg, checkpointing=checkpointing(cfg, checkpoint_dir, checkpoint_every, checkpoint_async,
                                                   resume_from, simulate_failure))
    result = launch(get_strategy(strategy).run_rank, world_size=cfg.world_size, args=(cfg,), timeout=timeout, backend=backend,
                    device_memory=device_memory, trace=trace, memory=memory)
    if result is None:  # a rank other than 0 under torchrun: rank 0 holds the Run
        return None
    return Run(cfg, list(result), result)


def checkpointing(cfg, directory, every, asynchronous, resume_from, failure=None) -> Checkpointing:
    """``train``'s checkpoint arguments checked, and ``resume_from`` resolved to one checkpoint."""
    if directory is None and (every is not None or asynchronous or failure is not None):
        raise ValueError("checkpoint_every=, checkpoint_async= and simulate_failure= go with checkpoint_dir=<a "
                         "directory to save into>")
    _check_failure(failure, cfg)
    if directory is not None and not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"checkpoint_dir={directory!r} must be a path (a str or pathlib.Path)")
    if every is not None and (not is_whole(every) or every < 1):
        raise ValueError(f"checkpoint_every={every!r}: pass a whole number of steps >= 1 between saves")
    if not isinstance(asynchronous, bool):
        raise ValueError(f"checkpoint_async={asynchronous!r} must be True (dcp.async_save) or False")
    reason = get_strategy(cfg.strategy).no_checkpoint
    if reason and (directory is not None or resume_from is not None):
        raise ValueError(f"strategy={cfg.strategy!r} does not take checkpoints: {reason}")
    resume, start = _resolve_resume(resume_from, directory)
    if start >= cfg.steps:
        raise ValueError(f"the checkpoint {resume} holds step {start}, and steps={cfg.steps}: nothing is left to "
                         f"train; steps counts from the very first step, so pass steps > {start}")
    plan = Checkpointing(None if directory is None else os.path.abspath(directory),
                         None if every is None else int(every), resume, start, not asynchronous,
                         None if failure is None else (int(failure[0]), int(failure[1])))
    taken = [step_dir(plan.directory, k).name for k in range(start + 1, cfg.steps + 1)
             if plan.due(k, cfg.steps) and step_dir(plan.directory, k).exists()]
    if taken:
        raise ValueError(f"checkpoint_dir={directory!r} already holds {', '.join(taken)} from an earlier run, which "
                         f"this run would save again; continue that run with resume_from='latest', or pass an empty "
                         f"checkpoint_dir (checkpoints are never written over)")
    return plan


def _check_failure(failure, cfg) -> None:
    if failure is None:
        return
    if (not isinstance(failure, (tuple, list)) or len(failure) != 2 or not all(is_whole(v) for v in failure)
            or not 0 <= failure[0] < cfg.steps or not 0 <= failure[1] < cfg.world_size):
        raise ValueError(f"simulate_failure={failure!r}: pass (step, rank) with 0 <= step < steps={cfg.steps} and "
                         f"0 <= rank < world_size={cfg.world_size}, e.g. simulate_failure=(1, 0)")


def _resolve_resume(resume_from, directory) -> tuple[str | None, int]:
    """(the checkpoint to load, its step); (None, 0) for a fresh start."""
    if resume_from is None:
        return None, 0
    if resume_from == "latest":
        if directory is None:
            raise ValueError("resume_from='latest' resumes from checkpoint_dir: pass checkpoint_dir= too")
        found = checkpoint.latest(directory)
        return (None, 0) if found is None else (str(found), checkpoint.read_info(found)["step"])
    if not isinstance(resume_from, (str, os.PathLike)):
        raise TypeError(f"resume_from={resume_from!r} must be a path to a checkpoint (or to a directory of them), "
                        f"or 'latest'")
    path = Path(resume_from)
    if not path.is_dir():
        raise ValueError(f"resume_from={str(resume_from)!r} is not a checkpoint directory (it does not exist or is a "
                         f"file); pass a checkpoint, a directory of them, or 'latest'")
    if not (path / checkpoint.INFO).exists():
        found = checkpoint.latest(path)
        if found is None:
            raise ValueError(f"resume_from={str(resume_from)!r} holds no complete checkpoint; pass a checkpoint "
                             f"directory (one with {checkpoint.INFO}) or a directory of them")
        path = found
    return str(path.resolve()), checkpoint.read_info(path)["step"]


def _single_in_process(cfg) -> Run:
    """The 1-rank reference run right here: ``single`` needs no process group."""
    ctx = make_context(0, 1, 0, "gloo")
    out = get_strategy("single").run_rank(ctx, cfg)
    return Run(cfg, [out], LaunchResult([out], Trace.merge([ctx.trace]), [ctx.memory.report()], [""], "gloo"))


__all__ = ["train", "Run", "Comparison"]
