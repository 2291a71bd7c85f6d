"""A busy laptop for the labs' nbval run: processes that spin on the CPU beside the notebooks.

The labs must hold where a learner runs them, a laptop busy with other programs, so CI runs them
beside ``MPKIT_LAB_LOAD`` spinning processes per core (default 2; 0 turns it off). Each one dies
with the test process however that ends (``mpkit.runtime.lifeline.die_with_parent``, loaded from
its file so the spinner imports neither mpkit nor torch), and ``stop()`` kills and reaps them.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LOAD_ENV = "MPKIT_LAB_LOAD"
LIFELINE = Path(__file__).resolve().parents[1] / "mpkit" / "runtime" / "lifeline.py"
SPIN = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("lifeline", sys.argv[1])
lifeline = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lifeline)
lifeline.die_with_parent(int(sys.argv[2]))
while True:
    pass
"""


def processes_per_core() -> int:
    """``MPKIT_LAB_LOAD`` as a whole number >= 0 (a clear error otherwise), default 2."""
    text = os.environ.get(LOAD_ENV, "2")
    if not text.isdigit():
        raise ValueError(f"{LOAD_ENV}={text!r}: give the spinning processes per core, a whole number (0: none)")
    return int(text)


class BusyLoad:
    """``start()`` the spinners (once), ``stop()`` them (idempotent)."""

    def __init__(self, per_core: int | None = None):
        self.per_core = processes_per_core() if per_core is None else per_core
        self.procs: list[subprocess.Popen] = []

    @property
    def count(self) -> int:
        return self.per_core * len(os.sched_getaffinity(0))

    def start(self) -> None:
        if self.procs or not self.count:
            return
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(LIFELINE), str(os.getpid())],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for _ in range(self.count)]

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs = []
