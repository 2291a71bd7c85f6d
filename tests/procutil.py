"""Read /proc to prove a launch left nothing behind: processes, listening sockets, /dev/shm, fds."""
from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass


def _stat(pid) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1])


def descendants(pid: int | None = None) -> set[int]:
    """Children, grandchildren, ... of ``pid`` (default: this process), zombies included."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            parents[int(entry)] = stat[1]
    found, frontier = set(), {os.getpid() if pid is None else pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def is_running(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` has exited; a SIGKILL is delivered asynchronously, so poll briefly."""
    deadline = time.monotonic() + timeout
    while is_running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def listening_sockets() -> dict[int, int]:
    """{socket inode: port} of every TCP socket in LISTEN state on this host."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A":  # TCP_LISTEN
                found[int(cols[9])] = int(cols[1].rsplit(":", 1)[1], 16)
    return found


def socket_inodes(pids) -> set[int]:
    """Inodes of the sockets the given processes hold open."""
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, PermissionError):
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def listening_sockets_of(pids) -> dict[int, int]:
    """{socket inode: port} of the TCP sockets in LISTEN state that the given processes hold."""
    held = socket_inodes(pids)
    return {inode: port for inode, port in listening_sockets().items() if inode in held}


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def thread_count() -> int:
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith("Threads:")).split()[1])


@dataclass
class Snapshot:
    listening: set[int]
    shm: set[str]

    @classmethod
    def take(cls) -> "Snapshot":
        return cls(set(listening_sockets()), set(os.listdir("/dev/shm")))

    def leftovers(self) -> list[str]:
        """What exists now that a finished launch should have removed.

        Listening sockets count only if this process or a descendant holds them: other
        sessions on this host open and close ports of their own while we run.
        """
        problems = []
        if children := multiprocessing.active_children():
            problems.append(f"multiprocessing children alive: {children}")
        if tree := descendants():
            problems.append(f"descendant processes left: {sorted(tree)}")
        if ports := sorted(port for inode, port in listening_sockets_of({os.getpid(), *tree}).items()
                           if inode not in self.listening):
            problems.append(f"ports still listening: {ports}")
        if shm := set(os.listdir("/dev/shm")) - self.shm:
            problems.append(f"new /dev/shm entries: {sorted(shm)}")
        return problems
