"""Distributed checkpoints on ``torch.distributed.checkpoint`` (DCP): save under one layout, load
under any other, and never lose the last good checkpoint.

The mechanism in ~20 lines (``save`` and ``load`` below, without their checks)::

    # 1. the single model's state, this rank's chunks only (views of the live tensors)
    state = {}
    for name, p in single_model_names(module):                 # DataParallel, Pipeline stages, ...
        state[f"model.{name}"] = Sharded(global_shape(p), chunks(p))   # tp slice: 1 chunk, qkv: 3
    for name, p in ...:                                        # ZeRO-1: a flat range -> <= 3 boxes
        state[f"optim.{name}.exp_avg"] = Sharded(global_shape(p), chunks(exp_avg of p))
    # 2. save: each rank writes its chunks; the coordinator de-duplicates replicas and writes
    #    the metadata (every tensor's global shape and the chunks it was saved as)
    dcp.save(state, storage_writer=FileSystemWriter(tmp), planner=SavePlanner())
    write mpkit.json (versions, step, file sizes and hashes); rename(tmp, path)    # atomic
    # 3. load into ANY layout: the same kind of dict describes the chunks this rank needs;
    #    DCP intersects them with the saved chunks (resharding) and copies the overlaps in place
    verify(path)                                               # versions, sizes, hashes
    dcp.load(state, storage_reader=FileSystemReader(path), planner=LoadPlanner())

``save``/``async_save``/``load`` take any module built from ``mpkit.parallel`` (``DataParallel``,
``tensor_parallel``, ``pipeline``, ``expert_parallel``, FSDP2's ``fully_shard``, DDP, or a plain
module) and any elementwise optimizer over it, ``ShardedOptimizer`` included. Every rank of the
world calls them together (they are collectives, on a gloo group of their own so that an
asynchronous save never interleaves with training's collectives).
"""
from __future__ import annotations

import json
import warnings
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from mpkit.parallel.checkpoint.planners import LoadPlanner, LoadReport, SavePlanner, Snapshot
from mpkit.parallel.checkpoint.state import model_state, optimizer_params, optimizer_state, placements
from mpkit.parallel.checkpoint.store import (INFO, CheckpointError, base_info, check_files, commit, complete, digests,
                                             latest, prepare, read_info, verify)
from mpkit.parallel.sharded_optimizer import ShardedOptimizer


@dataclass(frozen=True)
class Saved:
    """A committed checkpoint: its path, step, the bytes of all its files and of this rank's."""

    path: Path
    step: int
    total_bytes: int
    rank_bytes: int


@dataclass(frozen=True)
class Loaded:
    """What ``load`` restored: the step and ``extra`` saved with it, and what this rank read."""

    path: Path
    step: int
    extra: object
    read: LoadReport


def save(path, module, optimizer=None, *, step=0, extra=None, prefix="", group=None, overwrite=False) -> Saved:
    """Save ``module`` (and ``optimizer``'s state) at ``path``, a new directory, atomically.

    ``step``: the optimizer steps taken (``load`` returns it); ``extra``: anything JSON can hold
    (losses so far, a data cursor). ``prefix``: the name of the sequence a ``Pipeline`` was cut
    from inside the single model (``"layers."`` for mpkit's built-in models). ``group``: the
    ranks that save together (default: the whole world, on a gloo group of its own).
    ``overwrite=True`` replaces an existing checkpoint (for the instant between two renames the
    old one is at ``.<name>.replaced``)."""
    saving = _start(path, module, optimizer, step, extra, prefix, group, overwrite)
    with saving.world.quiet():
        metadata = dcp.save(saving.state, storage_writer=saving.writer(), planner=SavePlanner(),
                            process_group=saving.world.group, no_dist=not saving.world.distributed)
    return saving.finish(metadata)


def async_save(path, module, optimizer=None, *, step=0, extra=None, prefix="", group=None,
               overwrite=False) -> "Saving":
    """``save`` that returns once the state is copied (DCP's staging): the files are written by a
    background thread while training goes on (``dcp.async_save``). Every rank must call
    ``wait()`` on the returned handle, before its next save and before it ends; the checkpoint is
    committed (renamed into place) as soon as the last rank's files are written."""
    saving = _start(path, module, optimizer, step, extra, prefix, group, overwrite)
    saving.future = dcp.async_save(saving.state, storage_writer=saving.writer(), planner=SavePlanner(),
                                   process_group=saving.world.group, no_dist=not saving.world.distributed,
                                   async_stager=Snapshot())
    saving.state = None  # staged: the live tensors may change now
    if saving.world.rank == 0:
        saving.future.add_done_callback(saving.commit_when_written)
    return saving


def load(path, module, optimizer=None, *, prefix="", group=None) -> Loaded:
    """Load the checkpoint at ``path`` into ``module`` (and ``optimizer``), in place, whatever
    layout saved it: each rank reads the parts of the saved chunks that overlap its own.

    Refused with a ``CheckpointError`` that says what differs, on every rank, before anything
    is changed: an incomplete or corrupted checkpoint, another format version, tensors missing,
    extra or of another shape or dtype, another optimizer (or optimizer state missing)."""
    world = _World(group)
    path = Path(path)
    info = world.from_coordinator(_attempt(read_info, path) if world.rank == 0 else None)
    world.agree(info if isinstance(info, Exception) else None, coordinator=True)
    world.agree(_attempt(check_files, path, info, sorted(info["files"])[world.rank::world.size]))  # each its share
    placed = _attempt(placements, module, prefix)
    mine = {} if isinstance(placed, Exception) else {f"model.{n}": p for n, p in placed.items()}
    problem = placed if isinstance(placed, Exception) else _problem(path, _compare_model(info, mine)
                                                                      or _compare_optimizer(info, optimizer))
    gathered = world.gather((str(path.resolve()), set(mine)))
    paths = sorted({p for p, _ in gathered})
    held = set().union(*(keys for _, keys in gathered))
    extra_keys = sorted(k[6:] for k in info["tensors"] if k.startswith("model.") and k not in held)
    if len(paths) > 1:
        problem = CheckpointError(f"the ranks load different paths ({', '.join(paths)}); pass every rank the same")
    world.agree(problem or _problem(path, extra_keys and f"the checkpoint holds tensors this model does not: "
                                                   f"{_names(extra_keys)}"))
    state = model_state(placed)
    if optimizer is not None:
        inner, created, unsaved = _materialize(optimizer, placed, info)
        state.update(optimizer_state(optimizer, placed))
        problem = _problem(path, _compare_optimizer_state(info, state))
        for p in created if problem else unsaved:  # refused: as it was; else no state where none was saved
            inner.state.pop(p, None)
        world.agree(problem)
    planner = LoadPlanner()
    with world.quiet():
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), planner=planner, process_group=world.group,
                 no_dist=not world.distributed)
    if optimizer is not None:
        _restore_groups(optimizer, info["optimizer"]["param_groups"])
    return Loaded(path, info["step"], info.get("extra"), planner.report)


# ---- the two halves of a save ----

class Saving:
    """A save under way: the staged state, the world, and (``async_save``) the future of its writes."""

    def __init__(self, path, staging, state, info, world):
        self.path, self.staging, self.state, self.info, self.world = path, staging, state, info, world
        self.future = None
        self.committed = Future()

    def writer(self):
        return dcp.FileSystemWriter(self.staging, sync_files=True)

    def finish(self, metadata) -> Saved:
        """Each rank digests the files it wrote, rank 0 commits; every rank learns the outcome (and
        returns only once the checkpoint is in place)."""
        mine = sorted(f.name for f in self.staging.iterdir() if f.name.startswith(f"__{self.world.rank}_"))
        digested = {}
        for part in self.world.gather(digests(self.staging, mine)):
            digested.update(part)
        outcome = _attempt(self.commit, metadata, digested) if self.world.rank == 0 else None
        return self._result(self.world.from_coordinator(outcome), metadata)

    def commit(self, metadata, digested=None) -> dict:
        tensors = {fqn: {"shape": list(md.size), "dtype": str(md.properties.dtype).removeprefix("torch.")}
                   for fqn, md in metadata.state_dict_metadata.items() if hasattr(md, "size")}
        return commit(self.path, self.staging, {**self.info, "tensors": tensors}, digested)

    def commit_when_written(self, future) -> None:
        """Rank 0's callback on the writes' future: commit as soon as every rank's files are written."""
        try:
            self.committed.set_result(self.commit(future.result()))
        except Exception as exc:  # noqa: BLE001 - handed to wait(), on every rank
            self.committed.set_result(exc)

    def wait(self) -> Saved:
        """Block until the checkpoint is committed (a collective: every rank calls it)."""
        metadata = self.future.result()
        outcome = self.committed.result() if self.world.rank == 0 else None
        return self._result(self.world.from_coordinator(outcome), metadata)

    def _result(self, outcome, metadata) -> Saved:
        self.world.agree(outcome if isinstance(outcome, Exception) else None, coordinator=True)
        mine = sum(info.length for info in (metadata.storage_data or {}).values()
                   if info.relative_path.startswith(f"__{self.world.rank}_"))
        return Saved(self.path, self.info["step"], sum(f["bytes"] for f in outcome["files"].values()), mine)


def _start(path, module, optimizer, step, extra, prefix, group, overwrite) -> Saving:
    """Everything before DCP writes: the state dict of every rank, checked, and the staging
    directory (rank 0); any rank's error is raised on every rank."""
    world, path = _World(group), Path(path)
    built = _attempt(_build, module, optimizer, prefix, step, extra)
    paths = sorted(set(world.gather(str(path.resolve()))))
    if len(paths) > 1:
        world.agree(CheckpointError(f"the ranks save to different paths ({', '.join(paths)}); pass every rank the "
                                    f"same path, on storage every rank can reach"))
    world.agree(built if isinstance(built, Exception) else None)
    staging = world.from_coordinator(_attempt(prepare, path, overwrite) if world.rank == 0 else None)
    world.agree(staging if isinstance(staging, Exception) else None, coordinator=True)
    state, info = built
    return Saving(path, staging, state, info, world)


def _build(module, optimizer, prefix, step, extra):
    info = base_info(step, extra)
    placed = placements(module, prefix)
    state = model_state(placed)
    info["optimizer"] = None
    if optimizer is not None:
        state.update(optimizer_state(optimizer, placed))
        info["optimizer"] = {"class": _optimizer_class(optimizer), "param_groups": _groups_json(optimizer)}
    info["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
    return state, info


# ---- checks before a load changes anything ----

def _compare_model(info, mine: dict) -> str:
    saved, problems = info["tensors"], []
    missing = [k for k in mine if k not in saved]
    if missing:
        problems.append(f"missing from the checkpoint: {_names(k[6:] for k in missing)}")
    for key, placed in mine.items():
        if key in saved:
            shape, dtype = tuple(saved[key]["shape"]), saved[key]["dtype"]
            if shape != tuple(placed.shape):
                problems.append(f"{key[6:]} was saved with shape {shape}, this model's is {tuple(placed.shape)}")
            elif dtype != str(placed.tensor.dtype).removeprefix("torch."):
                problems.append(f"{key[6:]} was saved as {dtype}, this model holds "
                                f"{str(placed.tensor.dtype).removeprefix('torch.')}")
    return "; ".join(problems)


def _compare_optimizer(info, optimizer) -> str:
    saved = info.get("optimizer")
    if optimizer is None:
        return ""
    if saved is None:
        return "this checkpoint holds no optimizer state; load it with optimizer=None"
    if saved["class"] != _optimizer_class(optimizer):
        return f"it was saved with optimizer {saved['class']}, this optimizer is {_optimizer_class(optimizer)}"
    if len(saved["param_groups"]) != len(optimizer.param_groups):
        return (f"its optimizer has {len(saved['param_groups'])} parameter groups, this one "
                f"{len(optimizer.param_groups)}: build the optimizer with the same groups (the same weight-decay split)")
    return ""


def _compare_optimizer_state(info, state: dict) -> str:
    """Each parameter's state keys against the checkpoint's, for the parameters that have saved
    state. State this optimizer keeps for a parameter with none saved (a ZeRO-1 slice that covers
    a parameter which never had a gradient) stays as created, zero, and is dropped from ``state``."""
    saved, mine = _by_param(info["tensors"]), _by_param(state)
    for name, keys in mine.items():
        if name not in saved:
            for key in keys:
                del state[f"optim.{name}.{key}"]
        elif keys != saved[name]:
            return (f"the optimizer state of {name} differs: the checkpoint holds {', '.join(sorted(saved[name]))}, "
                    f"this optimizer keeps {', '.join(sorted(keys))}")
    return ""


def _by_param(keys) -> dict:
    """{parameter name: {state key}} of the ``optim.<name>.<key>`` keys."""
    out = {}
    for key in keys:
        if key.startswith("optim."):
            name, _, what = key[len("optim."):].rpartition(".")
            out.setdefault(name, set()).add(what)
    return out


def _problem(path, text):
    """A ``CheckpointError`` saying why ``path`` does not fit (None when ``text`` is empty)."""
    return CheckpointError(f"cannot load {path}: {text}") if text else None


def _names(keys, most=5) -> str:
    keys = list(keys)
    return ", ".join(keys[:most]) + (f" and {len(keys) - most} more" if len(keys) > most else "")


# ---- the optimizer ----

def _optimizer_class(optimizer) -> str:
    inner = optimizer.inner if isinstance(optimizer, ShardedOptimizer) else optimizer
    return type(inner).__name__


def _groups_json(optimizer) -> list:
    groups = []
    for g in optimizer.param_groups:
        out = {}
        for key, value in g.items():
            if key == "params":
                continue
            value = value.item() if torch.is_tensor(value) else list(value) if isinstance(value, tuple) else value
            try:
                json.dumps(value)
            except TypeError:
                raise TypeError(f"optimizer hyperparameter {key}={value!r} cannot be saved (not a number, string, "
                                f"bool or list)") from None
            out[key] = value
        groups.append(out)
    return groups


def _restore_groups(optimizer, saved: list) -> None:
    for g, values in zip(optimizer.param_groups, saved):
        for key, value in values.items():
            current = g.get(key)
            if torch.is_tensor(current):
                current.fill_(value)
            else:
                g[key] = tuple(value) if isinstance(current, tuple) else value


def _materialize(optimizer, placed: dict, info):
    """Create the state tensors the checkpoint will fill (as torch's ``set_optimizer_state_dict``
    does): one step with zero gradients and lr 0 for the parameters that have saved state and none
    yet, their new state then zeroed. Returns the optimizer that holds the state (a
    ``ShardedOptimizer``'s inner one), the parameters it created state for, and those whose
    state the checkpoint has none of (the caller drops it once the load goes ahead)."""
    names = {id(p.tensor): n for n, p in placed.items()}
    saved = _by_param(info["tensors"])
    has_saved = {id(p) for p in optimizer_params(optimizer) if names.get(id(p)) in saved}
    if isinstance(optimizer, ShardedOptimizer):
        inner = optimizer.inner
        targets = {id(s.shard) for s in optimizer.shards if s is not None and any(id(p) in has_saved for p in s.params)}
    else:
        inner, targets = optimizer, has_saved
    every = [p for group in inner.param_groups for p in group["params"]]
    fresh = [p for p in every if id(p) in targets and not inner.state.get(p)]
    unsaved = [p for p in every if id(p) not in targets and inner.state.get(p)]
    if fresh:
        _zero_step(inner, every, {id(p) for p in fresh})
    return inner, fresh, unsaved


def _zero_step(inner, every, fresh_ids) -> None:
    """One step of ``inner`` with lr 0 and zero gradients on ``fresh_ids`` only (the others have
    none, so it skips them), then their new state zeroed; every gradient and lr put back."""
    grads, lrs = [p.grad for p in every], [g.get("lr") for g in inner.param_groups]
    try:
        for p in every:
            p.grad = torch.zeros_like(p) if id(p) in fresh_ids else None
        for g in inner.param_groups:
            if "lr" in g:
                g["lr"] = torch.zeros_like(g["lr"]) if torch.is_tensor(g["lr"]) else 0.0
        with torch.no_grad():
            inner.step()
            for p in every:
                for value in inner.state[p].values() if id(p) in fresh_ids else ():
                    if torch.is_tensor(value) and value.dim() > 0:
                        value.zero_()
    finally:
        for p, grad in zip(every, grads):
            p.grad = grad
        for g, lr in zip(inner.param_groups, lrs):
            if lr is not None:
                g["lr"] = lr


# ---- the ranks, together ----

_groups = {}  # the default group -> the gloo group checkpoints use in that world


class _World:
    """The ranks of one save or load: their group (by default a gloo group of the whole world,
    created on first use), and the small object collectives that let every rank fail together."""

    def __init__(self, group=None):
        self.distributed = dist.is_available() and dist.is_initialized()
        if not self.distributed:
            self.group, self.rank, self.size = None, 0, 1
            return
        if group is None:
            world = dist.group.WORLD
            if _groups.get("world") is not world:
                _groups.update(world=world, group=dist.new_group(backend="gloo", group_desc="checkpoint"))
            group = _groups["group"]
        self.group, self.rank, self.size = group, dist.get_rank(group), dist.get_world_size(group)

    @contextmanager
    def quiet(self):
        """Without a process group DCP warns that it assumes one process: here that is the intent."""
        with warnings.catch_warnings():
            if not self.distributed:
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            yield

    def gather(self, obj) -> list:
        if not self.distributed:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def from_coordinator(self, obj):
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]

    def agree(self, error: Exception | None, coordinator: bool = False) -> None:
        """Raise on every rank if any rank has an ``error`` (``coordinator``: only rank 0's counts,
        and every rank holds it already): the rank that has one raises it, the others a
        ``CheckpointError`` naming it, so no rank goes on into DCP's collectives alone."""
        if coordinator:
            if error is not None:
                raise error if self.rank == 0 else CheckpointError(f"rank 0: {error}")
            return
        if error is not None and not self.distributed:
            raise error
        errors = self.gather(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            raise CheckpointError(f"rank {failed[0][0]} cannot go on: {failed[0][1]}")


def _attempt(fn, *args):
    """``fn(*args)``, or the exception it raised (handed to every rank before anyone raises)."""
    try:
        return fn(*args)
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        return exc


__all__ = ["save", "async_save", "load", "verify", "read_info", "latest", "complete", "INFO", "Saved", "Loaded", "Saving", "LoadReport",
           "CheckpointError"]
