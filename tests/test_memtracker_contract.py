"""The private torch names the memory tracker relies on, checked against the installed torch, and
what happens when they change: memory tracking turns off with a warning, training goes on."""
import importlib

import pytest
import torch

import mpkit
from mpkit.observe import memory, torch_memtracker


@pytest.mark.parametrize("module,dotted", torch_memtracker.PRIVATE_NAMES)
def test_every_private_name_exists_in_this_torch(module, dotted):
    obj = importlib.import_module(module)
    for part in dotted.split("."):
        obj = getattr(obj, part)


def test_memtracker_instance_has_the_private_attributes():
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    with tracker:  # some are made on entry
        missing = [a for a in torch_memtracker.PRIVATE_ATTRIBUTES if not hasattr(tracker, a)]
    assert missing == []


def test_the_pinned_torch_passes_the_gate():
    assert torch_memtracker.PROBLEM is None
    assert torch.__version__.startswith(torch_memtracker.TESTED)


def test_an_untested_torch_version_is_named():
    assert "torch 3.0.0 is not a version" in torch_memtracker.problem("3.0.0")


def test_fallback_when_the_private_api_changed(monkeypatch):
    monkeypatch.setattr(torch_memtracker, "PROBLEM", "torch 9.9 lacks private names ...: MemTracker._track")
    monkeypatch.setattr(memory, "_warned", False)
    with pytest.warns(RuntimeWarning, match="memory tracking is off: torch 9.9 lacks"):
        tracker = memory.MemoryTracker()
    assert not tracker.enabled
    with tracker.track(torch.nn.Linear(2, 2)):
        torch.ones(4)
    assert tracker.samples == [] and tracker.peak_total == 0  # nothing recorded, nothing broken
    with pytest.raises(RuntimeError, match="device_memory needs the memory tracker"):
        memory.MemoryTracker(capacity=2**20)


@pytest.mark.timeout(60)
def test_a_run_trains_without_the_tracker(monkeypatch):
    monkeypatch.setattr(torch_memtracker, "PROBLEM", "torch 9.9 changed MemTracker")
    monkeypatch.setattr(memory, "_warned", True)  # the warning itself is tested above
    run = mpkit.train("dp", 2, steps=2)  # forked ranks inherit the patched gate
    assert len(run.losses) == 2 and all(m.peak_total == 0 for m in run.memory)


def test_the_snapshot_keys_are_memtrackers_categories():
    from torch.distributed._tools.mem_tracker import _MemRefType

    assert {m.value for m in _MemRefType} == set(torch_memtracker.SNAPSHOT_KEYS)
