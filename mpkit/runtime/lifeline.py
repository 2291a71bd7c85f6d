"""Ranks die with their caller, also when the caller is killed (a Jupyter kernel restart, ``kill -9``).

Two independent guards, because neither alone covers everything:

- ``die_with_parent`` (in each rank): the kernel sends the rank SIGKILL when the caller dies
  (Linux ``prctl(PR_SET_PDEATHSIG)``). It needs no cooperation from the rank, but reaches only the
  rank itself, not what the rank started.
- ``Guardian`` (one small process per launch, in a process group of its own): it learns each
  rank's process group and, if the caller goes away without releasing it, SIGKILLs those groups:
  the ranks and everything they started (a ``subprocess.Popen`` inside ``fn``).
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import struct
import sys

_PR_SET_PDEATHSIG = 1
_RECORD = struct.Struct("=i")  # one rank's process-group id; 0 = the launch ended normally
_POLL_S = 0.05  # the guardian also notices a dead caller by polling its parent pid


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


class Guardian:
    """A forked watchdog that kills the ranks' process groups if the caller dies mid-launch.

    ``guard(pgid)`` after starting each rank, ``release()`` when the launch has stopped its ranks
    itself (normal end or error): the guardian then exits and is reaped. It holds none of the
    caller's files or sockets (all closed after the fork) and ignores Ctrl-C, which the caller
    handles.
    """

    def __init__(self):
        read_fd, self._write_fd = os.pipe()
        caller = os.getpid()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - runs in the forked guardian (tested from outside)
            try:
                _watch(read_fd, caller)
            finally:
                os._exit(0)
        os.close(read_fd)

    def guard(self, pgid: int) -> None:
        os.write(self._write_fd, _RECORD.pack(pgid))

    def release(self) -> None:
        """Tell the guardian the ranks are handled, and reap it."""
        if self._write_fd is None:
            return
        try:
            os.write(self._write_fd, _RECORD.pack(0))
        except BrokenPipeError:  # pragma: no cover - the guardian was killed from outside
            pass
        os.close(self._write_fd)
        self._write_fd = None
        os.waitpid(self.pid, 0)


def _watch(read_fd: int, caller: int) -> None:  # pragma: no cover - runs in the forked guardian
    os.setpgid(0, 0)  # signals sent to the caller's process group (a kernel restart) miss us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.closerange(3, read_fd)  # hold no copy of the caller's files, pipes or listening sockets
    os.closerange(read_fd + 1, os.sysconf("SC_OPEN_MAX"))
    groups, pending = [], b""
    while True:
        readable, _, _ = select.select([read_fd], [], [], _POLL_S)
        if readable:
            chunk = os.read(read_fd, 4096)
            if not chunk:  # the caller died (its end of the pipe closed without a release)
                break
            pending += chunk
            while len(pending) >= _RECORD.size:
                (pgid,), pending = _RECORD.unpack(pending[:_RECORD.size]), pending[_RECORD.size:]
                if pgid == 0:
                    return
                groups.append(pgid)
        elif os.getppid() != caller:  # reparented: the caller died while another process holds the pipe
            break
    for pgid in groups:
        for kill in (os.killpg, os.kill):  # the group (rank + its children), or the rank if not yet a group
            try:
                kill(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
