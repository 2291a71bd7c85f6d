"""What this machine offers, without initialising CUDA in the calling process.

Initialising CUDA before forking ranks breaks the children, so we only ask NVML-backed
``torch.cuda.device_count()`` (no context is created) and never touch a device here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class DeviceInfo:
    kind: str                 # "cuda" or "cpu-sim"
    count: int                # GPUs, or CPU cores for simulated devices (any world size still runs)
    backend: str              # "nccl" or "gloo"
    names: list[str] = field(default_factory=list)
    cpu_cores: int = 1

    def __str__(self):
        if self.kind == "cuda":
            return f"{self.count} CUDA GPU(s) ({', '.join(self.names)}), backend nccl"
        return (f"simulated devices: CPU processes with gloo on {self.cpu_cores} core(s); "
                f"any world size runs (ranks share the cores)")


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
