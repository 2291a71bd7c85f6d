"""What this machine offers, without initialising CUDA in the calling process.

Initialising CUDA before forking ranks breaks the children, so we only ask NVML-backed
``torch.cuda.device_count()`` (no context is created) and never touch a device here.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class DeviceInfo:
    kind: str                 # "cuda" or "cpu-sim"
    count: int                # GPUs, or CPU cores for simulated devices (more ranks than cores still run)
    backend: str              # "nccl" or "gloo"
    names: list[str] = field(default_factory=list)
    cpu_cores: int = 1

    def __str__(self):
        if self.kind == "cuda":
            return f"{self.count} CUDA GPU(s) ({', '.join(self.names)}), backend nccl"
        return (f"simulated devices: CPU processes with gloo on {self.cpu_cores} core(s); "
                f"more ranks than cores run too (they share the cores)")


def cuda_count() -> int:
    """GPUs visible to this process; 0 without a CUDA build or driver. Does not initialise CUDA."""
    if not torch.backends.cuda.is_built():
        return 0
    try:
        return torch.cuda.device_count()
    except RuntimeError:
        return 0


def devices() -> DeviceInfo:
    cores = os.cpu_count() or 1
    count = cuda_count()
    if count:
        names = [torch.cuda.get_device_properties(i).name for i in range(count)] if torch.cuda.is_initialized() else [f"cuda:{i}" for i in range(count)]
        return DeviceInfo("cuda", count, "nccl", names, cores)
    return DeviceInfo("cpu-sim", cores, "gloo", [f"cpu-sim:{i}" for i in range(cores)], cores)


# What one simulated-device rank costs, measured with a forked gloo rank (torch 2.13, Linux):
# 4-5 threads; on rank 0 two file descriptors per rank (a store connection and a gloo pair,
# gloo connects every pair of ranks), about 5 MiB of private memory before any work.
_TASKS_PER_RANK = 6
_FDS_PER_RANK = 2
_MEMORY_PER_RANK = 8 * 2**20
_FD_RESERVE = 64  # the caller's and each rank's own files, libraries, pipes


def _read_int(path) -> int | None:
    try:
        with open(path) as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            line = next(line for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def _soft_limit(name) -> int | None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft = resource.getrlimit(getattr(resource, name))[0]
    return None if soft == resource.RLIM_INFINITY else soft


def rank_limits() -> list[tuple[int, str]]:
    """How many CPU ranks each of this machine's limits allows, with the reason in words.

    Every rank of a simulated-device world is a process of this machine: it needs threads, file
    descriptors (rank 0 holds two per rank) and memory, and gloo connects every pair of ranks, so N
    ranks hold N*(N-1) sockets between them. Limits that cannot be read are left out.
    """
    limits = []
    if (nofile := _soft_limit("RLIMIT_NOFILE")) is not None:
        in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
        limits.append((max(0, (nofile - in_use - _FD_RESERVE) // _FDS_PER_RANK),
                       f"open files per process: rank 0 holds {_FDS_PER_RANK} per rank and `ulimit -n` is {nofile}"))
    file_nr = (_read_int("/proc/sys/fs/file-nr"), _read_int("/proc/sys/fs/file-max"))
    if None not in file_nr:
        free = max(0, file_nr[1] - file_nr[0])
        limits.append((math.isqrt(free), f"open files on the machine: gloo connects every pair of ranks "
                                         f"(N*(N-1) sockets) and {free} of fs.file-max are free"))
    tasks = [(value, name) for value, name in ((_soft_limit("RLIMIT_NPROC"), "`ulimit -u`"),
                                               (_read_int("/proc/sys/kernel/pid_max"), "kernel.pid_max"),
                                               (_read_int("/proc/sys/kernel/threads-max"), "kernel.threads-max"))
             if value is not None]
    if tasks:
        value, name = min(tasks)
        limits.append((value // _TASKS_PER_RANK, f"processes and threads: each rank runs about {_TASKS_PER_RANK} "
                                                 f"and {name} is {value}"))
    if (memory := _available_memory()) is not None:
        limits.append((memory // _MEMORY_PER_RANK, f"memory: {memory / 2**30:.1f} GiB available, at least "
                                                   f"{_MEMORY_PER_RANK // 2**20} MiB per rank"))
    return limits


def check_world_size(world_size: int) -> None:
    """Refuse a CPU world this machine cannot hold, before any rank starts, saying which limit."""
    limits = rank_limits()
    if not limits:
        return
    most, reason = min(limits)
    if world_size > most:
        cores = os.cpu_count() or 1
        raise ValueError(f"world_size={world_size} is more ranks than this machine can hold: at most {most} "
                         f"({reason}). Every simulated device is a process sharing {cores} CPU core(s); the labs "
                         f"use 2-8. Use world_size<={most}, or torchrun on a cluster for more devices")
