"""A killed caller (a Jupyter kernel restart, ``kill -9``) leaves no rank, no rank's child and no port."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procutil import descendants, is_running, listening_sockets, listening_sockets_of

ROOT = Path(__file__).resolve().parents[1]

# Every way a rank can be busy when its caller dies: a pure-Python loop (holds the GIL), a recv
# no one answers (blocked in gloo), a sleep; rank 0 also hosts the store and started a child.
CALLER = '''
import subprocess, sys, time, torch
from pathlib import Path
import mpkit

def fn(ctx, out):
    if ctx.rank == 0:
        child = subprocess.Popen(["sleep", "120"])
        Path(out, "child.pid").write_text(str(child.pid))
    Path(out, f"rank{ctx.rank}.ready").write_text("")
    if ctx.rank == 0:
        while True:
            pass
    if ctx.rank == 1:
        ctx.comm.recv(torch.zeros(1), 2)
    time.sleep(120)

mpkit.launch(fn, 3, args=(sys.argv[1],), timeout=120)
'''


def _wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killing_the_caller_stops_every_rank_child_and_port_within_2s(sig, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path)], env=env, start_new_session=True)
    try:
        ready = [tmp_path / f"rank{r}.ready" for r in range(3)] + [tmp_path / "child.pid"]
        assert _wait_for(lambda: all(p.exists() for p in ready), 60), "the ranks never started"
        tree = descendants(caller.pid)  # 3 ranks, rank 0's child (and the launch's guardian)
        child = int((tmp_path / "child.pid").read_text())
        assert child in tree and len(tree) >= 4, tree
        ports = listening_sockets_of(tree)
        assert ports, "rank 0 should be serving the store"

        os.kill(caller.pid, sig)
        caller.wait(timeout=10)
        # A killed process reads as a zombie once its main thread is gone, while its other threads
        # may still hold its sockets for a moment: wait for both, within the same 2 s.
        def clean():
            return not any(is_running(pid) for pid in tree) and not set(ports) & set(listening_sockets())

        assert _wait_for(clean, 2.0), (f"2 s after the caller died: still running "
                                       f"{[p for p in tree if is_running(p)]}, still listening "
                                       f"{[ports[i] for i in set(ports) & set(listening_sockets())]}")
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        for pid in descendants(caller.pid) | (tree if "tree" in locals() else set()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
