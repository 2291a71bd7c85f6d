"""Whether this process belongs to a world that torchrun (or any env:// launcher) started."""
from __future__ import annotations

import os


def in_torchrun() -> bool:
    """True inside a process torchrun (or any env:// launcher) started."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def env_int(name, default=None) -> int:
    """An integer environment variable (torchrun's RANK, LOCAL_RANK, ...), or ``default``."""
    value = os.environ.get(name)
    return default if value is None else int(value)
