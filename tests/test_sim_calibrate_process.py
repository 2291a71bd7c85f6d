"""``mpkit.sim.calibrate(cache_file=None)`` keeps its measurement for the process: a following
``predict(hardware="cpu-sim")`` uses it (it raised NotCalibrated: the process copy was kept under
the key "None" while ``cpu-sim`` looked under the default file's)."""
import pytest

from mpkit.costmodel import calibration
from mpkit.sim import Hardware, Link, predict
from mpkit.simulator import machines


@pytest.fixture
def measured(monkeypatch):
    """A stand-in for the 30 s measurement, a process memory of this test's own, and no cache file
    read or written (a list of the files saved to instead)."""
    hw = Hardware(name="cpu-sim", flops=1e10, mfu=0.5, mem_bw=1e10, p2p=Link(1e-4, 1e-9),
                  collective=Link(1e-4, 1e-9), cores=2)
    monkeypatch.setattr(calibration, "measure", lambda: hw)
    monkeypatch.setattr(machines, "_memory", {})
    saved = []
    monkeypatch.setattr(machines, "_load", lambda path: None)
    monkeypatch.setattr(machines, "_save", lambda path, hw: saved.append(path))
    return hw, saved


def test_calibrate_without_a_file_is_kept_for_the_process(measured):
    hw, saved = measured
    with pytest.raises(machines.NotCalibrated):
        predict("dp", hardware="cpu-sim", world_size=2)
    assert calibration.calibrate(cache_file=None) is hw
    assert machines.get_hardware("cpu-sim") is hw
    assert predict("dp", hardware="cpu-sim", world_size=2).step_time > 0
    assert saved == []  # cache_file=None: no file written


def test_the_newest_measurement_is_the_process_cpu_sim(measured):
    hw, saved = measured
    older = Hardware(name="cpu-sim", flops=1e9, mfu=0.5, mem_bw=1e9, cores=2)
    machines.keep(older, machines.DEFAULT_CACHE)
    assert machines.get_hardware("cpu-sim") is older
    assert calibration.calibrate(refresh=True, cache_file=None) is hw
    assert machines.get_hardware("cpu-sim") is hw
