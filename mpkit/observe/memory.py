"""Per-rank memory by category, measured by torch's own tracker (not estimated).

``torch.distributed._tools.mem_tracker.MemTracker`` is a TorchDispatchMode that sees every tensor
a rank allocates and labels it Parameter / Buffer / Gradient / Activation / Temp / Optstate /
Other. We keep its bookkeeping and replace its per-module peak statistics (which deep-copy a
snapshot per op) with a cheap per-op sample: that gives the curve over time, the peak by
category, and the simulated device capacity check (a rank over capacity fails like a GPU).
"""
from __future__ import annotations

import re
import time
import weakref
from contextlib import contextmanager

import torch
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType, _UpdateType, _WeakRefInfo
from torch._guards import active_fake_mode
from torch.distributed.tensor import DTensor
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from mpkit.errors import DeviceOutOfMemory

# Our categories; MemTracker's Parameter+Buffer -> parameters, Gradient -> gradients,
# Optstate -> optimizer, Activation -> activations, Temp (backward temporaries)+Other -> other.
CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "other")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(value) -> int | None:
    """``"64MiB"`` / ``"1.5GB"`` / ``4096`` -> bytes; ``None`` stays ``None`` (no capacity)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
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


class _ForwardHooks:
    """What MemTracker needs of its ModTracker here: global module forward hooks and ``is_bw``.

    ModTracker also hangs multi-grad hooks on every module's inputs and outputs, in every
    forward, to know the module hierarchy during backward; we never ask for it, and it was about
    a third of the tracker's cost per step. Backward hooks are accepted and not called.
    """

    def __init__(self):
        self._hooks = (None, None)
        self._handles = ()

    @property
    def is_bw(self) -> bool:
        return torch._C._current_graph_task_id() != -1  # exactly ModTracker's test

    def register_user_hooks(self, pre_fw_hook=None, post_fw_hook=None, pre_bw_hook=None, post_bw_hook=None):
        self._hooks = (pre_fw_hook, post_fw_hook)

    def clear_user_hooks(self):
        self._hooks = (None, None)

    def __enter__(self):
        pre, post = self._hooks
        self._handles = (register_module_forward_pre_hook(pre), register_module_forward_hook(post, always_call=True))
        return self

    def __exit__(self, *args):
        for handle in self._handles:
            handle.remove()
        self._handles = ()


class _SamplingTracker(MemTracker):
    """MemTracker that samples after every op instead of keeping per-module snapshots.

    The module hooks keep only what categorisation needs: parameters seen in a forward get
    gradient hooks, and a forward re-run inside backward marks an activation-checkpoint region.
    """

    def __init__(self, owner: "MemoryTracker"):
        super().__init__()
        self._mod_tracker = _ForwardHooks()
        self._owner = owner
        self._seen_modules = weakref.WeakSet()
        self._by_address = {}  # storage address -> MemTracker's (winfo, weakref) for live storages
        self._changed = False  # the snapshot changed since the last sample
        self._in_comm = 0  # inside ctx.comm: a collective's own buffers are "other", not activations

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Keeps ``__torch_dispatch__`` unwrapped by ``torch._disable_dynamo``, whose frame
        # switching cost more per op than our bookkeeping; nothing here runs torch.compile.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # The parent's logic without its pytree walk over outputs (a tensor or a flat tuple here).
        if DTensor in types:
            return NotImplemented  # let DTensor desugar into local ops, which we then see
        res = func(*args, **(kwargs or {}))
        if self._in_comm:
            reftype = _MemRefType.OTH
        elif self._in_opt:
            reftype = _MemRefType.OPT
        elif torch._C._current_graph_task_id() != -1 and not self._in_ac:  # ModTracker's is_bw
            reftype = _MemRefType.TEMP
        else:
            reftype = _MemRefType.ACT
        for out in (res if isinstance(res, (tuple, list)) else (res,)):
            if type(out) is torch.Tensor:
                self._track_plain(reftype, out)
            elif isinstance(out, torch.Tensor):
                if active_fake_mode() is not self._fake_mode_on_entry:
                    return res  # DTensor's sharding propagation on fake tensors: no real memory
                super()._track(reftype, out)
        if self._changed:  # a sample per change: the curve is a step function
            self._changed = False
            self._owner._on_op(self._curr_mem_snap)
        return res

    def _track_plain(self, reftype, t) -> None:
        """MemTracker's ``_track`` for a plain tensor (one storage, never fake): no subclass walk,
        no set, and storages looked up by address in a plain dict, not a weak-key dictionary
        (a dying storage leaves both in ``_delete_callback``, before its address can be reused)."""
        st = t.untyped_storage()
        known = self._by_address.get(st._cdata)
        if known is None:
            known = self._WINFO.get(st)  # made outside ``_track_plain`` (parameters, gradients)
            if known is None:
                known = _WeakRefInfo.create_winfo(st, t.device, reftype, self._delete_callback)
                self._WINFO[st] = known
                if known[0].mem_consumed > 0:
                    self._update_snap(_UpdateType.ADD, known[0])
            known[0].address = st._cdata
            self._by_address[st._cdata] = known
        elif known[0].size != st.size():
            winfo, old = known[0], known[0].mem_consumed
            winfo.update_mem_consumed(st)
            self._update_snap(_UpdateType.SIZE, winfo, old_mem_consumed=old)

    def _delete_callback(self, winfo, w_st) -> None:
        self._by_address.pop(getattr(winfo, "address", None), None)
        super()._delete_callback(winfo, w_st)

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        """MemTracker's, minus a fresh zeroed dict built on every call as ``setdefault``'s default."""
        snap = self._curr_mem_snap.get(winfo.device)
        if snap is None:
            snap = self._curr_mem_snap[winfo.device] = dict.fromkeys(self._ref_class, 0)
            snap[_TOTAL_KEY] = 0
        self._changed = True
        if u_type == _UpdateType.REF:
            snap[old_reftype] -= winfo.mem_consumed
            snap[winfo.reftype] += winfo.mem_consumed
            return
        if u_type == _UpdateType.ADD:
            change = winfo.mem_consumed
        elif u_type == _UpdateType.DEL:
            change = -winfo.mem_consumed
        else:  # SIZE
            change = winfo.mem_consumed - old_mem_consumed
        snap[winfo.reftype] += change
        snap[_TOTAL_KEY] += change
        if u_type != _UpdateType.ADD and snap[_TOTAL_KEY] == 0:
            del self._curr_mem_snap[winfo.device]

    def _pre_fw_hook(self, module, inputs) -> None:
        if module not in self._seen_modules:
            self._seen_modules.add(module)
            self._track_module_params_and_buffers(module, install_grad_hooks=True)
        elif self._mod_tracker.is_bw and self._ac_mod is None:
            self._ac_mod = weakref.ref(module)
            self._in_ac = True

    def _post_fw_hook(self, module, inputs, outputs) -> None:
        if self._mod_tracker.is_bw and self._ac_mod is not None and self._ac_mod() is module:
            self._ac_mod = None
            self._in_ac = False



class MemoryTracker:
    """``ctx.memory``: wrap the training loop in ``with ctx.memory.track(model, optimizer):``.

    Samples are (seconds, {category: bytes}) on the trace clock, so memory lines up with the
    timeline. ``capacity`` (bytes) makes the rank raise ``DeviceOutOfMemory`` when exceeded.
    """

    def __init__(self, rank=0, device=None, capacity=None, enabled=True, clock=time.perf_counter):
        self.rank = rank
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.capacity = capacity
        self.enabled = enabled
        self.clock = clock
        self.samples: list[tuple[float, tuple[int, ...]]] = []
        self.peak_total = 0
        self.peak_breakdown = (0,) * len(CATEGORIES)
        self._max = (0,) * len(CATEGORIES)
        self._tracker = None
        self.step = None

    # ---- recording ----
    @contextmanager
    def track(self, *objects):
        """Track everything allocated inside, plus the given modules/optimizers/tensors made before."""
        if not self.enabled:
            yield self
            return
        tracker = _SamplingTracker(self)
        self._tracker = tracker
        with tracker:
            tracker.track_external(*objects)
            self._on_op(tracker._curr_mem_snap)
            yield self
        self._tracker = None

    @contextmanager
    def communicating(self):
        """Inside, new tensors are communication buffers (gloo's reduce-scatter copies its input,
        for one): category "other", whatever phase the rank is in."""
        tracker = self._tracker
        if tracker is None:
            yield
            return
        tracker._in_comm += 1
        try:
            yield
        finally:
            tracker._in_comm -= 1

    def _on_op(self, snapshot) -> None:
        dev = snapshot.get(self.device)
        if dev is None:
            return
        get = dev.get
        values = (get("Parameter", 0) + get("Buffer", 0), get("Gradient", 0), get("Optstate", 0),
                  get("Activation", 0), get("Temp", 0) + get("Other", 0))
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
