"""The training loop's checkpoints: resume before the first step, save after every k-th.

A strategy hands ``run_steps`` what it trains as a ``Resumable`` (its module as built from
``mpkit.parallel``, its optimizer, the name prefix of its pipeline stages, its precision recipe);
``LoopCheckpoints`` loads the run's ``resume_from`` into it and saves it into the run's
``checkpoint_dir`` (``mpkit.parallel.checkpoint``: any layout in, any layout out). The data of
step k is a function of (seed, k), so a run resumed at step k sees the batches it would have seen.

With a directory, rank 0 also appends one JSON line per event to ``<dir>/history.jsonl`` (the
run's start and the step it resumed from, every step's start, every save, the end), with its
process id and torchrun's restart count: an elastic run's failure, restart and replayed steps can
be drawn from it after the failed attempt's processes are gone. (Each "start" begins an attempt;
the count is the node's own, ``TORCHELASTIC_RESTART_COUNT``, which stays 0 on a node whose
workers were healthy and restarted only because another node's failed: pytorch/pytorch#108158.)
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from mpkit.parallel import checkpoint
from mpkit.parallel.precision import MixedPrecision

HISTORY = "history.jsonl"


@dataclass
class Resumable:
    """What a checkpoint of a strategy holds: ``module`` (as ``checkpoint.save`` takes it), its
    ``optimizer``, ``prefix`` (the single model's name of a pipeline's layer sequence) and ``mp``
    (fp16's loss scale is part of the state)."""

    module: object
    optimizer: object
    prefix: str = ""
    mp: MixedPrecision | None = None


def step_dir(directory, step: int) -> Path:
    return Path(directory) / f"step_{step:06d}"


class LoopCheckpoints:
    """Resume and save for one rank's ``run_steps`` (nothing at all when the run asks for neither)."""

    def __init__(self, ctx, cfg, state: Resumable | None):
        self.ctx, self.plan, self.state, self.steps = ctx, cfg.checkpointing, state, cfg.steps
        self.pending = None  # an async save under way
        if state is None and (self.plan.saves or self.plan.resume_from):
            raise ValueError(f"strategy {cfg.strategy!r} does not take checkpoints")

    def resume(self) -> int:
        """Load ``resume_from`` (if any); the first step to run."""
        if self.plan.resume_from is None:
            start = 0
        else:
            with self.ctx.trace.span("compute", name="checkpoint load"):
                loaded = checkpoint.load(self.plan.resume_from, self.state.module, self.state.optimizer,
                                         prefix=self.state.prefix)
            _set_loss_scale(self.state.mp, (loaded.extra or {}).get("loss_scale"))
            start = loaded.step
        self._log("start", start)
        return start

    def before_step(self, k: int) -> None:
        self._log("step", k)
        if self.plan.failure == (k, self.ctx.rank):
            marker = Path(self.plan.directory) / f".simulated_failure_step{k}_rank{self.ctx.rank}"
            if not marker.exists():  # once: the restarted job goes past this step
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)

    def after_step(self, steps_done: int) -> None:
        if not self.plan.due(steps_done, self.steps):
            return
        path = step_dir(self.plan.directory, steps_done)
        extra = {"loss_scale": _loss_scale(self.state.mp)}
        started = time.perf_counter()
        with self.ctx.trace.span("compute", name="checkpoint save"):
            self._wait()
            args = (path, self.state.module, self.state.optimizer)
            kwargs = {"step": steps_done, "extra": extra, "prefix": self.state.prefix}
            if self.plan.blocking:
                saved = checkpoint.save(*args, **kwargs)
            else:
                self.pending = checkpoint.async_save(*args, **kwargs)
        self._log("save", steps_done, seconds=time.perf_counter() - started,
                  bytes=saved.total_bytes if self.plan.blocking else None, blocking=self.plan.blocking)

    def finish(self) -> None:
        self._wait()
        self._log("end", self.steps)

    def _wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.wait()

    def _log(self, event: str, step: int, **fields) -> None:
        if not self.plan.saves or self.ctx.rank != 0:
            return
        line = {"event": event, "step": step, "time": time.time(),
                "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)), "pid": os.getpid(), **fields}
        Path(self.plan.directory).mkdir(parents=True, exist_ok=True)
        with open(Path(self.plan.directory) / HISTORY, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")


def read_history(directory) -> list[dict]:
    """The events ``LoopCheckpoints`` logged into ``directory``, in order."""
    path = Path(directory) / HISTORY
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _loss_scale(mp: MixedPrecision | None):
    scaler = mp.scaler if mp is not None else None
    return None if scaler is None else {"value": scaler.value, "good": scaler.good, "steps": scaler.steps}


def _set_loss_scale(mp: MixedPrecision | None, saved) -> None:
    scaler = mp.scaler if mp is not None else None
    if scaler is not None and saved is not None:
        scaler.value, scaler.good, scaler.steps = float(saved["value"]), int(saved["good"]), int(saved["steps"])
