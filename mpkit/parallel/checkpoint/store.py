"""The checkpoint directory: written whole or not at all, and checked before anything reads it.

A save writes into a hidden directory beside the target (``.<name>.saving``), fsyncs every file,
writes ``mpkit.json`` last (the format version, mpkit's and torch's versions, the step, the
tensors with their shapes, every file's size and SHA-256), fsyncs the directory and only then
renames it to the target: a rename within one file system is atomic, so a reader sees the old
state or the whole new checkpoint, never half of one. A save killed at any moment leaves at most
a ``.saving`` directory, which no reader takes for a checkpoint and the next save clears.

``verify`` reads ``mpkit.json`` and checks every file's size and hash, so a truncated or
corrupted file, a checkpoint of another format version or a directory that is not a checkpoint
is a ``CheckpointError`` that says what differs, before DCP unpickles anything.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from importlib import metadata
from pathlib import Path

import torch

FORMAT = "mpkit-checkpoint"
FORMAT_VERSION = 1
INFO = "mpkit.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked: incomplete, corrupted, of another format
    version, or of another model or optimizer. The message says what differs."""


def mpkit_version() -> str:
    """The installed mpkit's version (``mpkit.__version__``, as packaged)."""
    try:
        return metadata.version("mpkit")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def staging_dir(path: Path) -> Path:
    return path.with_name(f".{path.name}.saving")


def prepare(path: Path, overwrite: bool) -> Path:
    """The empty staging directory of a save to ``path`` (a crashed save's leftovers removed)."""
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; save to a new path (e.g. one per step) or pass overwrite=True")
    if path.exists() and not (path / INFO).is_file():
        raise FileExistsError(f"{path} exists and is not an mpkit checkpoint; refusing to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(path)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def digests(folder: Path, names) -> dict:
    """{file name: {"bytes", "sha256"}} of ``names`` in ``folder`` (each rank digests its own files)."""
    return {name: {"bytes": (folder / name).stat().st_size, "sha256": _sha256(folder / name)} for name in names}


def commit(path: Path, staging: Path, info: dict, digested: dict | None = None) -> dict:
    """Digest the staged files (those not in ``digested`` already), write ``mpkit.json`` last, then
    rename the staging directory to ``path``."""
    digested = dict(digested or {})
    rest = sorted(f.name for f in staging.iterdir() if f.is_file() and f.name not in digested)
    info = {**info, "files": dict(sorted({**digested, **digests(staging, rest)}.items()))}
    _write_synced(staging / INFO, json.dumps(info, indent=1, sort_keys=True))
    _fsync_dir(staging)
    if path.exists():  # overwrite=True: the old one moves aside for the two renames' instant, then goes
        replaced = path.with_name(f".{path.name}.replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        os.rename(path, replaced)
        os.rename(staging, path)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        os.rename(staging, path)
    _fsync_dir(path.parent)
    return info


def base_info(step: int, extra) -> dict:
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"extra must be JSON-serialisable (numbers, strings, lists, dicts): {exc}") from None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r} must be a whole number >= 0 (the optimizer steps taken so far)")
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "mpkit_version": mpkit_version(),
            "torch_version": torch.__version__, "step": step, "extra": extra}


def read_info(path) -> dict:
    """``mpkit.json`` of a checkpoint, its format checked (``verify`` also checks the files)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a checkpoint directory (it does not exist or is a file)")
    if not (path / INFO).is_file():
        hint = " (a save that never finished)" if path.name.endswith(".saving") else ""
        raise CheckpointError(f"{path} has no {INFO}: it is not a complete mpkit checkpoint{hint}")
    try:
        info = json.loads((path / INFO).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path / INFO} is damaged ({exc}); the checkpoint cannot be trusted") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise CheckpointError(f"{path / INFO} does not describe an mpkit checkpoint")
    if info.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {info.get('format_version')!r} (written by mpkit "
                              f"{info.get('mpkit_version')}), this mpkit {mpkit_version()} reads format version "
                              f"{FORMAT_VERSION}: load it with the mpkit that wrote it")
    if not isinstance(info.get("files"), dict) or ".metadata" not in info["files"]:
        raise CheckpointError(f"{path / INFO} lists no DCP .metadata file: the checkpoint cannot be trusted")
    return info


def verify(path) -> dict:
    """``read_info`` and every recorded file present with its size and SHA-256."""
    info = read_info(path)
    check_files(path, info, sorted(info["files"]))
    return info


def check_files(path, info: dict, names) -> None:
    """Files ``names`` of the checkpoint at ``path`` as ``info`` recorded them (a load spreads the
    files over its ranks, each digesting its share)."""
    path = Path(path)
    for name in names:
        want, f = info["files"][name], path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: file {name} is missing")
        size = f.stat().st_size
        if size != want["bytes"]:
            raise CheckpointError(f"{path}: file {name} has {size} bytes, {want['bytes']} were written: it was "
                                  f"truncated or changed after the save")
        if _sha256(f) != want["sha256"]:
            raise CheckpointError(f"{path}: file {name} does not match the SHA-256 recorded at save time: its "
                                  f"content changed (a corrupted disk or copy)")


def complete(directory) -> list[Path]:
    """``directory``'s sub-directories that are complete checkpoints, by step (unfinished saves,
    hidden, and unreadable ones skipped)."""
    directory, found = Path(directory), []
    for sub in sorted(directory.iterdir()) if directory.is_dir() else ():
        if sub.name.startswith(".") or not sub.is_dir():
            continue
        try:
            found.append((read_info(sub)["step"], sub))
        except CheckpointError:
            continue
    return [sub for _, sub in sorted(found)]


def latest(directory) -> Path | None:
    """The complete checkpoint with the highest step in ``directory``; None if there is none."""
    found = complete(directory)
    return found[-1] if found else None


def _sha256(f: Path) -> str:
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_synced(f: Path, text: str) -> None:
    with open(f, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
