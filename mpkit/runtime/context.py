"""What ``fn(ctx, ...)`` sees on each rank: who it is, its device, and the recorders."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from mpkit.observe.comm import Comm
from mpkit.observe.memory import MemoryTracker
from mpkit.observe.trace import Trace


@dataclass
class RankContext:
    rank: int
    world_size: int
    device: torch.device
    backend: str
    trace: Trace
    memory: MemoryTracker
    local_rank: int = 0
    launcher: str = "mpkit"  # "torchrun" when torchrun made the world (its env:// store serves rpc too)
    comm: Comm = field(init=False)

    def __post_init__(self):
        self.comm = Comm(self)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier()

    def set_step(self, step: int | None) -> None:
        """Tag the events recorded from now on with the optimizer step they belong to."""
        self.trace.step = step
        self.memory.step = step


_current: RankContext | None = None


def current() -> RankContext | None:
    """The context of the rank this process is running ``fn`` for, or None in the caller.

    A launch inside a rank would start a second world from inside the first; ``launch`` reads
    this to refuse it with a clear error.
    """
    return _current


def set_current(ctx: RankContext | None) -> None:
    global _current
    _current = ctx


def make_context(rank, world_size, local_rank, backend, *, device_memory=None, trace=True, memory=True,
                 launcher="mpkit") -> RankContext:
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return RankContext(
        rank=rank, world_size=world_size, local_rank=local_rank, device=device, backend=backend, launcher=launcher,
        trace=Trace(rank=rank, enabled=trace),
        memory=MemoryTracker(rank=rank, device=device, capacity=device_memory, enabled=memory),
    )
