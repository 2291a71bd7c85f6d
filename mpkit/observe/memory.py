"""Per-rank memory by category, measured by torch's own tracker (not estimated).

``ctx.memory.track(model, optimizer)`` records every tensor the rank allocates inside, by
category, sampled after every op that changed anything: the curve over time, the peak by
category, and the simulated device capacity check (a rank over capacity fails like a GPU). The
tracker itself (``torch_memtracker``) sits on private torch API behind a version gate; where it
cannot run, tracking is off with one warning and training goes on.
"""
from __future__ import annotations

import re
import time
import warnings
from contextlib import contextmanager

import torch
from mpkit.errors import DeviceOutOfMemory, MpkitWarning
from mpkit.observe import torch_memtracker
from mpkit.whole import is_number

# Our categories; MemTracker's Parameter+Buffer -> parameters, Gradient -> gradients,
# Optstate -> optimizer, Activation -> activations, Temp (backward temporaries)+Other -> other.
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "other")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


_warned = False


def _warn_off() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"memory tracking is off: {torch_memtracker.PROBLEM}. Runs still train; plots show no memory.",
                      MpkitWarning, stacklevel=3)


def parse_bytes(value) -> int | None:
    """``"64MiB"`` / ``"1.5GB"`` / ``4096`` -> bytes; ``None`` stays ``None`` (no capacity)."""
    if value is None:
        return None
    if is_number(value):
        number = float(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        if not match or match.group(2).lower() not in _UNITS:
            raise ValueError(f"device_memory={value!r} is not a size; write e.g. '64MiB', '2GB' or a number of bytes")
        number = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if number <= 0:
        raise ValueError(f"device_memory={value!r} must be positive")
    return int(number)


def human(n_bytes: float) -> str:
    """``1.5 MiB`` / ``20.0 KiB`` / ``512 B``: sizes readable whatever the model's scale."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{int(n_bytes)} B"


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20


class MemoryTracker:
    """``ctx.memory``: wrap the training loop in ``with ctx.memory.track(model, optimizer):``.

    Samples are (seconds, {category: bytes}) on the trace clock, so memory lines up with the
    timeline. ``capacity`` (bytes) makes the rank raise ``DeviceOutOfMemory`` when exceeded.
    """

    def __init__(self, rank=0, device=None, capacity=None, enabled=True, clock=time.perf_counter):
        self.rank = rank
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.capacity = capacity
        if enabled and torch_memtracker.PROBLEM is not None:
            if capacity is not None:
                raise RuntimeError(f"device_memory needs the memory tracker, which is off: {torch_memtracker.PROBLEM}; "
                                   f"install the pinned torch (see requirements) or drop device_memory")
            _warn_off()
            enabled = False
        self.enabled = enabled
        self.clock = clock
        self.samples: list[tuple[float, tuple[int, ...]]] = []
        self.peak_total = 0
        self.peak_breakdown = (0,) * len(CATEGORIES)
        self._max = (0,) * len(CATEGORIES)
        self._tracker = None
        self._gradients = []  # tensors that hold gradients before any backward (file_gradients)
        self.step = None

    # ---- recording ----
    @contextmanager
    def track(self, *objects):
        """Track everything allocated inside, plus the given modules/optimizers/tensors made before.
        Inside an active ``track`` (a run with a device capacity tracks the whole rank) it only
        files the given objects under their categories."""
        if not self.enabled:
            yield self
            return
        if self._tracker is not None:
            self._tracker.track_external(*objects)
            self._tracker.file_gradients(self._gradients)
            self._on_sample(self._tracker.values())
            yield self
            return
        tracker = torch_memtracker.SamplingTracker(self)
        self._tracker = tracker
        try:
            with tracker:
                tracker.track_external(*objects)
                tracker.file_gradients(self._gradients)
                self._on_sample(tracker.values())
                yield self
        finally:
            self._tracker = None

    def file_gradients(self, *tensors) -> None:
        """Count ``tensors`` as gradients from now on, in this and every later ``track``: storage
        made for gradients before any backward wrote one (``DataParallel``'s buckets), which
        would otherwise read as "other" until then, in an out-of-memory report above all."""
        if not self.enabled:
            return
        self._gradients.extend(tensors)
        if self._tracker is not None:
            self._tracker.file_gradients(tensors)
            self._on_sample(self._tracker.values())

    @contextmanager
    def communicating(self):
        """Inside, new tensors are communication buffers (gloo's reduce-scatter copies its input,
        for one): category "other", whatever phase the rank is in."""
        tracker = self._tracker
        if tracker is None:
            yield
            return
        tracker.comm_depth += 1
        try:
            yield
        finally:
            tracker.comm_depth -= 1

    def _on_sample(self, values) -> None:
        if values is None:
            return
        self.samples.append((self.clock(), values))
        total = sum(values)
        if total > self.peak_total:
            self.peak_total = total
            self.peak_breakdown = values
        if values != self._max:
            self._max = tuple(map(max, values, self._max))
        if self.capacity is not None and total > self.capacity:
            self._out_of_memory(dict(zip(CATEGORIES, values)), total)

    def _out_of_memory(self, values, total):
        raise DeviceOutOfMemory(
            f"rank {self.rank}: simulated device out of memory: tried to hold {human(total)} "
            f"but capacity is {human(self.capacity)} ("
            + ", ".join(f"{c} {human(values[c])}" for c in CATEGORIES)
            + "). Split the model across more devices, shard optimizer state, or use smaller micro-batches.")

    def current(self) -> dict[str, int]:
        if not self.samples:
            return dict.fromkeys(CATEGORIES, 0)
        return dict(zip(CATEGORIES, self.samples[-1][1]))

    def reset_peak(self) -> None:
        """Start a new peak measurement (e.g. after a warm-up step)."""
        cur = self.samples[-1][1] if self.samples else (0,) * len(CATEGORIES)
        self.peak_total = sum(cur)
        self.peak_breakdown = self._max = cur

    def report(self) -> "MemoryReport":
        cuda_peak = None
        if self.device.type == "cuda":
            cuda_peak = torch.cuda.max_memory_allocated(self.device)
        return MemoryReport(self.rank, self.capacity, self.peak_total, dict(zip(CATEGORIES, self.peak_breakdown)),
                            dict(zip(CATEGORIES, self._max)), list(self.samples), cuda_peak)


class MemoryReport:
    """What one rank's memory did, sent back to the caller (plain data, picklable)."""

    def __init__(self, rank, capacity, peak_total, peak_breakdown, max_by_category, samples, cuda_max_allocated=None):
        self.rank = rank
        self.capacity = capacity
        self.peak_total = peak_total
        self.peak_breakdown = peak_breakdown
        self.max_by_category = max_by_category
        self.samples = samples
        self.cuda_max_allocated = cuda_max_allocated

    @property
    def final_by_category(self) -> dict[str, int]:
        """{category: bytes} when tracking ended: the steady state (optimizer state without
        the optimizer step's temporaries, gradients as the loop left them)."""
        values = self.samples[-1][1] if self.samples else (0,) * len(CATEGORIES)
        return dict(zip(CATEGORIES, values))

    def timeline(self, t0=0.0):
        """[(seconds since t0, {category: bytes}), ...]."""
        return [(t - t0, dict(zip(CATEGORIES, v))) for t, v in self.samples]

    def __repr__(self):
        parts = ", ".join(f"{c}={mib(self.max_by_category[c]):.2f}MiB" for c in CATEGORIES)
        return f"MemoryReport(rank={self.rank}, peak={mib(self.peak_total):.2f}MiB, max: {parts})"
