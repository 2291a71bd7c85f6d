"""The machines the cost model prices, by name: ``get_hardware``.

The GPU presets come from datasheets (``hardware.py``). ``cpu-sim`` is this machine as
``mpkit.sim.calibrate()`` measured it, kept per process and in ``~/.cache/mpkit/cpu-sim.json``
(keyed by host, core count, torch version and calibration method) so a notebook measures once.
Asking for it never measures: calibration is an explicit step."""
from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from mpkit.simulator.hardware import MULTI_NODE, PRESETS, Hardware, Link, gpu_preset

DEFAULT_CACHE = Path.home() / ".cache" / "mpkit" / "cpu-sim.json"
CALIBRATION_VERSION = 15  # part of the cache key: a cache from an older method is measured again
_memory: dict[str, Hardware] = {}


def _torch_version() -> str:
    """The running torch's version where torch is loaded (always so when calibrating); else its
    installed metadata, so that planning a GPU cluster (``sim.plan``) does not import torch just
    to name a cache key. Without either, a key no calibration was saved under: nothing stale is
    reused."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


def _cache_key() -> str:
    return f"{socket.gethostname()}|{os.cpu_count()}|{_torch_version()}|v{CALIBRATION_VERSION}"


def _load(path: Path) -> Hardware | None:
    try:
        data = json.loads(path.read_text())[_cache_key()]
    except (OSError, ValueError, KeyError):
        return None
    data["p2p"], data["collective"] = Link(**data["p2p"]), Link(**data["collective"])
    return Hardware(**data)


def _save(path: Path, hw: Hardware) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        entry = asdict(hw)
        for name in ("p2p", "collective"):  # a link of no stated kind is saved as {alpha, beta}, as before
            if not entry[name]["kind"]:  # Link.kind: mpkit checkouts without it share this file
                del entry[name]["kind"]
        data[_cache_key()] = entry
        path.write_text(json.dumps(data, indent=1))
    except OSError:
        pass  # a read-only home (some Binder/CI images) only costs a re-measure next process


class NotCalibrated(ValueError):
    """``cpu-sim`` was asked for before this machine was measured."""


def keep(hw: Hardware, cache_file) -> None:
    """Remember a measurement in ``cache_file`` (None: no file) and for this process: the newest
    measurement is this process's ``cpu-sim``, whichever file it went to."""
    if cache_file is not None:
        _save(Path(cache_file), hw)
    _memory[str(cache_file)] = _memory[str(DEFAULT_CACHE)] = hw


def known(cache_file) -> Hardware | None:
    key = str(cache_file)
    if key not in _memory and cache_file is not None:
        hw = _load(Path(cache_file))
        if hw is not None:
            _memory[key] = hw
    return _memory.get(key)


def cpu_sim(cache_file: Path | str | None = DEFAULT_CACHE) -> Hardware:
    """The ``cpu-sim`` preset as ``calibrate()`` measured it; ``NotCalibrated`` says what to run
    when this machine has not been measured (predicting never starts a measurement by itself)."""
    hw = known(cache_file)
    if hw is None:
        raise NotCalibrated("hardware='cpu-sim' is this machine, measured: run mpkit.sim.calibrate() once first "
                            "(about 30 s; kept in ~/.cache/mpkit), or predict for a GPU preset such as "
                            "hardware='8xH100-nvlink'")
    return hw


def get_hardware(hardware="cpu-sim") -> Hardware:
    """A preset by name — ``cpu-sim`` once ``mpkit.sim.calibrate()`` measured this machine, the GPU
    presets, multi-node ones like ``"4x8xH100-ib"`` — or a ``Hardware`` as given."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware == "cpu-sim":
        return cpu_sim()
    preset = gpu_preset(hardware)
    if preset is None:
        raise ValueError(f"hardware={hardware!r} is unknown; use one of {', '.join(PRESETS)}, a multi-node preset "
                         f"({', '.join(MULTI_NODE)}, with N a number of nodes) or pass a mpkit.sim.Hardware")
    return preset
