"""Ranks die with their caller, also when the caller is killed (a Jupyter kernel restart, ``kill -9``).

Two independent guards, because neither alone covers everything:

- ``die_with_parent`` (in each rank): the kernel sends the rank SIGKILL when the caller dies
  (Linux ``prctl(PR_SET_PDEATHSIG)``). It needs no cooperation from the rank, but reaches only the
  rank itself, not what the rank started.
- ``Guardian`` (one small shell process per launch, in a session of its own): it learns each
  rank's process group and, if the caller goes away without releasing it, SIGKILLs those groups:
  the ranks and everything they started (a ``subprocess.Popen`` inside ``fn``).

What a rank starts in a session of its own (``setsid``, ``start_new_session=True``, a double fork)
leaves the rank's process group: each rank is a child subreaper (Linux), so such processes stay
its descendants, and ``kill_descendants`` stops them before the rank itself ends.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

# The guardian is a few lines of POSIX shell: started with vfork+exec it costs ~3 ms, where forking
# the caller (torch loaded, hundreds of MiB mapped) costs 15-70 ms. It reads one process-group id
# per line; "0" means the launch stopped its ranks itself. End of input without "0" means every
# holder of the pipe's other end is gone: the caller died, and the kernel killed its ranks.
_GUARDIAN = """
groups=""
while read -r pgid; do
    [ "$pgid" = 0 ] && exit 0
    groups="$groups $pgid"
done
for pgid in $groups; do kill -9 "-$pgid" "$pgid" 2>/dev/null; done
exit 0
"""


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when ``parent_pid`` (the process that forked it) dies.

    If the parent is already gone (it died before this line ran), exit now. A no-op where prctl
    does not exist (not Linux); the guardian still covers the rank there.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def become_subreaper() -> None:
    """Orphans among this process's descendants (a double fork) become its children, not init's, so
    ``kill_descendants`` still finds them. A no-op off Linux."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _state(pid):
    """(state letter, parent pid) of ``pid`` from /proc, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1])


def _children() -> dict:
    """{parent pid: [live child pids]} from /proc (zombies left out: they are already dead)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            state = _state(entry)
            if state is not None and state[0] != "Z":
                out.setdefault(state[1], []).append(int(entry))
    return out


def _stop(pids, wait_s=1.0) -> None:
    """SIGSTOP ``pids`` and wait until each is stopped (or gone): a stopped process starts nothing."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait_s
    for pid in pids:
        while time.monotonic() < deadline:
            state = _state(pid)
            if state is None or state[0] in "TtZX":
                break
            time.sleep(0.001)


def kill_descendants(pids, stop=False) -> None:
    """SIGKILL every descendant of ``pids`` (not ``pids`` themselves), in whatever session or group,
    until none is left: a killed process's children reparent to the subreaper above and are found
    on the next pass. ``stop=True`` first stops ``pids`` (another process's ranks, which could
    otherwise start a child between the last pass and their own end). Linux only; ~1 ms per pass."""
    if not os.path.isdir("/proc/self"):
        return
    if stop:
        _stop(pids)
    for _ in range(20):
        children, found, todo = _children(), [], list(pids)
        while todo:
            kids = children.get(todo.pop(), [])
            found += kids
            todo += kids
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class Guardian:
    """A watchdog process that kills the ranks' process groups if the caller dies mid-launch.

    ``guard(pgid)`` after starting each rank, ``release()`` once the launch has stopped its ranks
    itself (normal end or error): the guardian then exits and is reaped. It runs in a session of
    its own (a kernel restart that kills the caller's process group, or Ctrl-C, does not reach
    it) and holds none of the caller's files or sockets. Forked ranks inherit the pipe's write end
    and must close it (``write_fd``) so that the caller's death reads as end of input.
    """

    def __init__(self):
        self._proc = subprocess.Popen(["/bin/sh", "-c", _GUARDIAN], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True, text=True)
        self.write_fd = self._proc.stdin.fileno()

    def guard(self, pgid: int) -> None:
        self._proc.stdin.write(f"{pgid}\n")
        self._proc.stdin.flush()

    def release(self) -> None:
        """Tell the guardian the ranks are handled, and reap it."""
        if self._proc.stdin.closed:
            return
        try:
            self._proc.stdin.write("0\n")
            self._proc.stdin.close()
        except BrokenPipeError:  # pragma: no cover - the guardian was killed from outside
            pass
        self._proc.wait()
