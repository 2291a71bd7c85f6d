"""The labs' busy load (tests/busy_load.py, started by the root conftest.py for nbval's lab cells):
its spinners stop when asked and die with the test process however it ends, never orphaned."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from busy_load import LOAD_ENV, BusyLoad, processes_per_core
from procutil import is_running, wait_gone

HERE = Path(__file__).resolve().parent
START_AND_WAIT = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from busy_load import BusyLoad
load = BusyLoad(per_core=1)
load.start()
print(json.dumps([p.pid for p in load.procs]), flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_spinners_stop_when_asked_and_die_with_a_killed_parent():
    load = BusyLoad(per_core=1)
    load.start()
    pids = [p.pid for p in load.procs]
    assert len(pids) == len(os.sched_getaffinity(0)) and all(map(is_running, pids))
    load.stop()
    assert load.procs == [] and not any(map(is_running, pids))

    parent = subprocess.Popen([sys.executable, "-c", START_AND_WAIT, str(HERE)], stdout=subprocess.PIPE, text=True)
    orphans = json.loads(parent.stdout.readline())
    assert orphans and all(map(is_running, orphans))
    parent.send_signal(signal.SIGKILL)  # no cleanup code runs: the kernel's death signal must do it
    parent.wait()
    assert all(wait_gone(pid, timeout=10) for pid in orphans)


def test_the_load_is_set_by_its_environment_variable(monkeypatch):
    monkeypatch.setenv(LOAD_ENV, "0")
    assert processes_per_core() == 0 and BusyLoad().count == 0
    monkeypatch.setenv(LOAD_ENV, "two")
    with pytest.raises(ValueError, match="MPKIT_LAB_LOAD='two': give the spinning processes per core"):
        processes_per_core()
