"""The line every benchmark prints about the machine it ran on: cores, CPU, torch, date and load.

On a shared machine a figure taken under load is not comparable with one taken quiet, so each
table is quoted with the load average printed next to it.
"""
from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout, not installed

import torch  # noqa: E402


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def machine_info() -> str:
    return (f"machine: {os.cpu_count()} cores, {cpu_model()}; torch {torch.__version__}, "
            f"Python {platform.python_version()}; {datetime.datetime.now():%Y-%m-%d %H:%M}; {load()}")


def load() -> str:
    """Load average: on a shared machine, numbers taken under load are not comparable."""
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
