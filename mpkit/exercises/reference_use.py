"""Telling a learner's own mechanism from a call into mpkit's reference code.

An exercise asks the learner to write a mechanism that mpkit already has (``mpkit.parallel``, the
strategies, ``mpkit.exercises.solutions``); calling mpkit's would pass every value check. While the
learner's code runs, a profile hook (and, for every recorded message or collective, the stack of
that call) looks for a frame of that reference code whose nearest caller outside torch and the
standard library is the learner's own code. What an exercise hands the learner on purpose
(``DataParallel`` for ``no_sync``, the f/g regions of the MLP: what the learner's call is given)
is allowed. The function or class given to ``check`` may not be mpkit's own either (a notebook's
``from mpkit.exercises.solutions import ring_all_reduce``), unless ``MPKIT_EXERCISES_TRUST_REFERENCE=1``:
mpkit's own tests check the reference solutions themselves.
"""
from __future__ import annotations

import os
import sys
import threading

import torch.nn.modules.module as module
import torch.optim.optimizer as optimizer

from mpkit.exercises.result import Text

TRUST = "MPKIT_EXERCISES_TRUST_REFERENCE"
REFERENCE = ("mpkit.parallel", "mpkit.strategies", "mpkit.exercises.solutions")
_LIBRARIES = ("torch", "mpkit", "typing_extensions", "numpy")


def _module(frame) -> str:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else ""


def _module_of(obj) -> str:
    name = getattr(obj, "__module__", "")
    return name if isinstance(name, str) else ""


def _is_reference(name: str) -> bool:
    return any(name == ref or name.startswith(ref + ".") for ref in REFERENCE)


def _is_library(name: str) -> bool:
    top = name.partition(".")[0]
    return top in _LIBRARIES or top in sys.stdlib_module_names


_DATA = ("__init__", "__post_init__", "__new__", "__repr__", "__eq__", "__hash__")


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _codes(obj) -> set:
    """The code objects of a provided function, class (its methods and those of its reference bases)
    or autograd Function."""
    out = set()
    if isinstance(obj, type):
        for cls in obj.__mro__:
            if _is_reference(_module_of(cls)):
                for member in vars(cls).values():
                    out |= _codes(getattr(member, "__func__", getattr(member, "fget", member)))
        return out
    obj = getattr(obj, "__func__", obj)
    while obj is not None:  # a decorated function (``@contextmanager``): the function it wraps too
        code = getattr(obj, "__code__", None)
        if code is not None:
            out |= _nested(code)
        obj = getattr(obj, "__wrapped__", None)
    return out


def _nested(code) -> set:
    """``code`` and the functions defined inside it (closures, hooks), at any depth."""
    out = {code}
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            out |= _nested(const)
    return out


class UsedReference(Exception):
    """The learner's code called mpkit's own ``function`` (defined in ``path``) on ``rank``."""

    def __init__(self, rank: int, function: str, path: str):
        super().__init__(f"your code calls mpkit's own {function} ({path}); the exercise asks you to write it")
        self.rank, self.function, self.path = rank, function, path

    @property
    def detail(self) -> Text:
        return Text(f"여러분의 코드가 mpkit에 이미 있는 {self.function}({self.path})을(를) 부릅니다: 이 연습은 그것을 직접 "
                    f"만드는 것입니다. mpkit의 구현이나 모범 답안 대신 torch.distributed(또는 ctx.comm)로 작성하세요.",
                    f"your code calls mpkit's own {self.function} ({self.path}); the exercise asks you to write it. "
                    f"Use torch.distributed (or ctx.comm), not mpkit's implementation or its reference solution.")


class ReferenceWatch:
    """Finds the first call from the learner's code into mpkit's reference code (``found``)."""

    def __init__(self):
        self.allowed, self.found = set(), None   # found: (qualified name, path) of the first reference call
        self._in_reference = {}  # code object -> whether its module is reference code (the hook sees every call)

    def provide(self, objects, _seen=None) -> None:
        """Allow what the exercise hands the learner: the reference objects among ``objects`` (the
        arguments of the learner's call) and those a judge's closure among them refers to."""
        seen = set() if _seen is None else _seen
        for obj in objects:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            target = obj if isinstance(obj, type) or hasattr(obj, "__code__") else type(obj)
            if _is_reference(_module_of(target)):
                self.allowed |= _codes(target)
            elif _module_of(obj).startswith("mpkit.exercises") and hasattr(obj, "__code__"):
                cells = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
                named = [obj.__globals__[n] for n in obj.__code__.co_names if n in obj.__globals__]
                self.provide(cells + named, seen)

    def handed(self, fn) -> None:
        """Note ``fn`` (what a judge runs as the learner's: a function, a class, a method of an
        instance) if it is mpkit's own reference object."""
        owner = fn if isinstance(fn, type) or hasattr(fn, "__code__") else type(fn)
        if self.found is None and _is_reference(_module_of(owner)) and os.environ.get(TRUST) != "1":
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            path = (code.co_filename if code else sys.modules[owner.__module__].__file__ or "")
            self.found = (getattr(fn, "__qualname__", owner.__qualname__), path[path.rfind("mpkit/"):])

    def look(self, frame):
        """Check the stack from ``frame`` outwards: the reference function the learner's code called
        (kept in ``found``), or None. torch's and Python's frames in between do not count; a chain
        entered by mpkit's own code, by a provided object or by constructing a reference record
        (``__init__``, a dataclass's generated code) is allowed."""
        entry = None
        while frame is not None:
            name, code = _module(frame), frame.f_code
            if _is_reference(name):
                if code in self.allowed or code.co_name in _DATA or code.co_filename.startswith("<"):
                    return None
                entry = frame
            elif entry is not None and not _is_library(name):
                if _is_import(entry):
                    return None
                if self.found is None:
                    path = entry.f_code.co_filename
                    self.found = (entry.f_code.co_qualname, path[path.rfind("mpkit/"):])
                return self.found
            elif entry is not None and name.startswith("mpkit"):
                return None   # mpkit's own code (the exercise, ctx.comm) called it
            frame = frame.f_back
        return None

    def _profile(self, frame, event, arg):
        if event != "call" or self.found is not None:
            return
        code = frame.f_code
        reference = self._in_reference.get(code)
        if reference is None:
            reference = self._in_reference[code] = _is_reference(_module(frame))
        if reference:
            self.look(frame)

    def start(self) -> None:
        self.provide(_global_hooks())  # mpkit's guards torch runs for every optimizer step, not a mechanism
        sys.setprofile(self._profile)
        threading.setprofile(self._profile)

    def stop(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


def _global_hooks() -> list:
    """The hooks torch runs for every optimizer and module (``register_optimizer_step_pre_hook``...)."""
    tables = [getattr(optimizer, name, {}) for name in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")]
    tables += [getattr(module, name, {}) for name in ("_global_forward_pre_hooks", "_global_forward_hooks",
                                                       "_global_backward_pre_hooks", "_global_backward_hooks")]
    return [hook for table in tables for hook in list(table.values())]


def _is_import(frame) -> bool:
    """A reference module's own code running while it is imported (its decorators, its tables)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
