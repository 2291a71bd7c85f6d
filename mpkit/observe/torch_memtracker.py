"""The one place mpkit touches torch's private memory tracker, behind a version gate.

``torch.distributed._tools.mem_tracker.MemTracker`` is a TorchDispatchMode that sees every tensor
a rank allocates and labels it Parameter / Buffer / Gradient / Activation / Temp / Optstate /
Other. It is private API: ``SamplingTracker`` below subclasses it and overrides private methods
to sample cheaply after every op (its own per-module statistics deep-copy a snapshot per op).
Everything it relies on is listed in ``PRIVATE_NAMES``; ``problem()`` says why it cannot be used
with the installed torch (a version outside ``TESTED`` or a name gone), and then
``mpkit.observe.memory`` turns memory tracking off with a warning instead of breaking every run.
``tests/test_memtracker_contract.py`` checks the list against the pinned torch.
"""
from __future__ import annotations

import importlib
import weakref

import torch
from torch import nn

TESTED = ("2.13",)  # torch major.minor versions this module was written and measured against

# (module, dotted attribute) of every private torch name used here.
PRIVATE_NAMES = (
    ("torch.distributed._tools.mem_tracker", "MemTracker"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._track"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._update_snap"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._delete_callback"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._track_module_params_and_buffers"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._update_and_maybe_create_winfos"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._should_skip_dynamo"),
    ("torch.distributed._tools.mem_tracker", "MemTracker.track_external"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._pre_fw_hook"),
    ("torch.distributed._tools.mem_tracker", "MemTracker._post_fw_hook"),
    ("torch.distributed._tools.mem_tracker", "_TOTAL_KEY"),
    ("torch.distributed._tools.mem_tracker", "_MemRefType.ACT"),
    ("torch.distributed._tools.mem_tracker", "_MemRefType.GRAD"),
    ("torch.distributed._tools.mem_tracker", "_MemRefType.OPT"),
    ("torch.distributed._tools.mem_tracker", "_MemRefType.OTH"),
    ("torch.distributed._tools.mem_tracker", "_MemRefType.TEMP"),
    ("torch.distributed._tools.mem_tracker", "_UpdateType.ADD"),
    ("torch.distributed._tools.mem_tracker", "_UpdateType.DEL"),
    ("torch.distributed._tools.mem_tracker", "_UpdateType.SIZE"),
    ("torch.distributed._tools.mem_tracker", "_UpdateType.REF"),
    ("torch.distributed._tools.mem_tracker", "_WeakRefInfo.create_winfo"),
    ("torch.distributed._tools.mem_tracker", "_WeakRefInfo.update_mem_consumed"),
    ("torch._guards", "active_fake_mode"),
    ("torch._C", "_current_graph_task_id"),
)
# MemTracker's instance attributes we read or set (created in its __init__ / __enter__).
PRIVATE_ATTRIBUTES = ("_mod_tracker", "_WINFO", "_curr_mem_snap", "_in_opt", "_in_ac", "_ac_mod",
                      "_ref_class", "_fake_mode_on_entry")
# Its snapshot keys, and the category of ``mpkit.observe.memory.CATEGORIES`` each one counts in.
SNAPSHOT_KEYS = {"Parameter": 0, "Buffer": 0, "Gradient": 1, "Optstate": 2, "Activation": 3, "Temp": 4, "Other": 4}


def _resolve(module, dotted):
    obj = importlib.import_module(module)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def problem(version: str | None = None) -> str | None:
    """Why the tracker cannot run with this torch (None: it can)."""
    version = torch.__version__ if version is None else version
    if ".".join(version.split("+")[0].split(".")[:2]) not in TESTED:
        return f"torch {version} is not a version mpkit's memory tracker was tested with ({', '.join(TESTED)})"
    missing = []
    for module, dotted in PRIVATE_NAMES:
        try:
            _resolve(module, dotted)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{dotted}")
    if missing:
        return f"torch {version} lacks private names the memory tracker uses: {', '.join(missing)}"
    return None


PROBLEM = problem()

if PROBLEM is None:
    from torch._guards import active_fake_mode
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType, _UpdateType, _WeakRefInfo
    from torch.distributed.tensor import DTensor
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

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


    class SamplingTracker(MemTracker):
        """MemTracker that samples after every op instead of keeping per-module snapshots.

        The module hooks keep only what categorisation needs: parameters seen in a forward get
        gradient hooks, and a forward re-run inside backward marks an activation-checkpoint region.
        """

        def __init__(self, owner):
            super().__init__()
            self._mod_tracker = _ForwardHooks()
            self._owner = owner
            self._seen_modules = weakref.WeakSet()
            self._by_address = {}  # storage address -> MemTracker's (winfo, weakref) for live storages
            self._changed = False  # the snapshot changed since the last sample
            self.comm_depth = 0  # > 0 inside a traced collective: its own buffers are "other", not activations

        def values(self):
            """(parameters, gradients, optimizer, activations, other) bytes on the owner's device now,
            in ``mpkit.observe.memory.CATEGORIES`` order (None: nothing there yet)."""
            dev = self._curr_mem_snap.get(self._owner.device)
            if dev is None:
                return None
            get = dev.get  # spelled out (SNAPSHOT_KEYS): this runs after every op that changed memory
            return (get("Parameter", 0) + get("Buffer", 0), get("Gradient", 0), get("Optstate", 0),
                    get("Activation", 0), get("Temp", 0) + get("Other", 0))

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
            if self.comm_depth:
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
                self._owner._on_sample(self.values())
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

        def file_gradients(self, tensors) -> None:
            """File ``tensors``' storages as gradients (``MemoryTracker.file_gradients``)."""
            for t in tensors:
                self._update_and_maybe_create_winfos(t, _MemRefType.GRAD)

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
                if any(p.is_meta for p in module.parameters()):
                    # ``torch.func.functional_call`` on meta stand-ins (a pipeline's shape probe): its
                    # parameters are swapped out for this forward only. Marking the module seen now
                    # would leave its real parameters without gradient hooks (gradients read as
                    # "other"), so wait for a forward on its own parameters. A meta model's forward
                    # recomputed in backward (the cost model profiling activation checkpointing) is
                    # still one, as below.
                    self._enter_recompute(module)
                    return
                self._seen_modules.add(module)
                # MemTracker hooks the gradient of every parameter, and torch refuses a hook on a
                # frozen one: track them all, then hook only those that will get a gradient.
                self._track_module_params_and_buffers(module, install_grad_hooks=False)
                trainable = [p for p in module.parameters() if p.requires_grad]
                if trainable:
                    self._track_module_params_and_buffers(nn.ParameterList(trainable), install_grad_hooks=True)
            else:
                self._enter_recompute(module)

        def _enter_recompute(self, module) -> None:
            """A forward during backward is activation checkpointing's recomputation (MemTracker's rule)."""
            if self._mod_tracker.is_bw and self._ac_mod is None:
                self._ac_mod = weakref.ref(module)
                self._in_ac = True

        def _post_fw_hook(self, module, inputs, outputs) -> None:
            if self._mod_tracker.is_bw and self._ac_mod is not None and self._ac_mod() is module:
                self._ac_mod = None
                self._in_ac = False
