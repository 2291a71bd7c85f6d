"""The cost model's input and output checks: multi-node hardware is explicit (presets parsed,
worlds beyond a machine refused with the presets named), worlds too large to simulate fail at
once, and a prediction that does not fit in device memory says so."""
import time
from dataclasses import replace

import numpy as np
import pytest

from mpkit.layout import Layout
from mpkit.sim import GPU_PRESETS, get_hardware, predict
from mpkit.costmodel.analytic import Setup, estimate
from mpkit.simulator.hardware import USABLE_MEMORY
from mpkit.costmodel.prediction import MAX_LAYERS, MAX_RANKS, MAX_STAGES


# The memory nvidia-smi reports for each card (modal-labs/modal-client#2797), not the marketing "80GB"
H100_80GB, A100_80GB, A100_40GB = 81559 * 2**20, 81920 * 2**20, 40960 * 2**20


@pytest.mark.parametrize("name,nodes,memory,inter_gb_s", [
    ("4x8xH100-ib", 4, H100_80GB, 50 * 0.8), ("16x8xA100-ib", 16, A100_80GB, 25 * 0.8),
    ("2x8xA100-40GB-ib", 2, A100_40GB, 25 * 0.8), ("Nx8xH100-ib", None, H100_80GB, 50 * 0.8)])
def test_multi_node_presets_are_parsed(name, nodes, memory, inter_gb_s):
    hw = get_hardware(name)
    assert hw.nodes == nodes and hw.devices_per_node == 8 and hw.memory_bytes == memory
    assert hw.inter_node.bandwidth == pytest.approx(inter_gb_s * 1e9)
    assert hw.collective.bandwidth > hw.inter_node.bandwidth  # NVLink inside, InfiniBand between


def test_existing_presets_keep_their_names_and_links():
    assert GPU_PRESETS["2x8xH100-ib"].nodes == 2 and GPU_PRESETS["2x8xH100-ib"].inter_node is not None
    assert all(GPU_PRESETS[n].nodes == 1 and GPU_PRESETS[n].inter_node is None
               for n in ("8xA100-nvlink", "8xH100-nvlink", "8xH100-pcie"))


@pytest.mark.parametrize("bad", ["0x8xH100-ib", "3x8xV100-ib", "8xH100-ib", "Nx8xH100-nvlink"])
def test_unknown_presets_name_the_multi_node_forms(bad):
    with pytest.raises(ValueError, match="Nx8xA100-ib, Nx8xA100-40GB-ib, Nx8xH100-ib"):
        get_hardware(bad)


def test_a_world_beyond_one_node_needs_a_multi_node_preset():
    with pytest.raises(ValueError, match=r"world_size=64 needs 8 nodes .* '8x8xH100-ib'.*Nx8xH100-ib"):
        predict("dp", hardware="8xH100-nvlink", world_size=64, batch_size=64)
    with pytest.raises(ValueError, match="'3x8xH100-ib'"):
        predict("dp", hardware="2x8xH100-ib", world_size=24, batch_size=24)
    pred = predict("dp", hardware="8x8xH100-ib", world_size=64, batch_size=64)
    assert pred.world_size == 64
    ar = next(e for e in pred.trace.events if e.kind == "all_reduce")
    nvlink_only = predict("dp", hardware="Nx8xH100-ib", world_size=8, batch_size=64)
    ar8 = next(e for e in nvlink_only.trace.events if e.kind == "all_reduce")
    assert ar.duration > ar8.duration  # 64 ranks cross InfiniBand now


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kwargs,match", [
    (dict(strategy="dp", world_size=10**6, batch_size=10**6), f"at most {MAX_RANKS}"),
    (dict(strategy="dp", world_size=MAX_RANKS + 1, batch_size=2 * (MAX_RANKS + 1)), "mpkit.sim.plan"),
    (dict(strategy="pp", world_size=MAX_STAGES * 2, layers=MAX_STAGES * 2), f"at most {MAX_STAGES}"),
    (dict(strategy="dp", world_size=8, layers=10**4), f"at most {MAX_LAYERS}"),  # used to profile for 90 s
    (dict(strategy="single", model="gpt", layers=10**6), "mpkit.sim.plan"),
])
def test_worlds_too_large_to_play_fail_at_once(kwargs, match):
    if kwargs.get("world_size", 0) > MAX_RANKS:  # numpy's integers too (they skipped the check and ran on)
        start = time.perf_counter()
        with pytest.raises(ValueError, match=match):
            predict(hardware="Nx8xH100-ib", **{**kwargs, "world_size": np.int64(kwargs["world_size"])})
        assert time.perf_counter() - start < 5
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        predict(hardware="Nx8xH100-ib", **kwargs)
    assert time.perf_counter() - start < 5  # measured ~0.001 s


def test_a_prediction_that_does_not_fit_says_so():
    big = predict("single", hardware="8xH100-nvlink", model="mlp", hidden=65536, d_in=1024, classes=8, batch_size=8)
    assert big.peak_memory > 80e9 and not big.fits
    assert "does not fit" in big.memory_warning and "80 GiB (85.5 GB)" in big.memory_warning
    assert "WARNING: does not fit" in big.summary() and "does not fit in memory" in repr(big)
    small = predict("dp", hardware="8xH100-nvlink", world_size=8, batch_size=64)
    assert small.fits and small.memory_warning == "" and "WARNING" not in small.summary()


def test_predict_and_plan_count_the_same_usable_memory():
    # a step filling 95% of the device fits it but not the 90% a real GPU leaves (CUDA context,
    # NCCL buffers, fragmentation): predict must say so, as sim.plan drops such a layout
    h100 = get_hardware("8xH100-nvlink")
    peak = predict("dp", hardware=h100, world_size=8, batch_size=64).peak_memory
    for share, fits in ((0.95, False), (0.85, True)):
        hw = replace(h100, memory_bytes=peak / share)
        assert hw.usable_memory == pytest.approx(hw.memory_bytes * USABLE_MEMORY)
        step = predict("dp", hardware=hw, world_size=8, batch_size=64)
        assert step.fits == fits and ("GB usable" in step.memory_warning) != fits
        assert estimate("7B", hw, Setup(Layout(dp=8, pp=1, tp=1)), 512).capacity == hw.usable_memory


def test_layout_takes_numpy_integers_as_plain_ints_and_refuses_the_rest():
    # a sweep over np.arange hands numpy integers; bools and floats are mistakes, not sizes
    import numpy as np

    layout = Layout(np.int64(2), 1, np.int32(2))
    assert layout == Layout(2, 1, 2) and type(layout.dp) is int and layout.coords(3) == {"dp": 1, "pp": 0, "cp": 0, "tp": 1}
    for bad in (True, 2.0, 0):
        with pytest.raises(ValueError, match=f"dp={bad!r} must be a whole number >= 1"):
            Layout(dp=bad)


def test_the_calibration_cache_key_names_the_running_torch(monkeypatch):
    # the key is read without importing torch (sim.plan stays torch-free), but the torch that runs
    # decides where it is loaded, and without any version no saved calibration can match
    import importlib.metadata
    import sys

    import torch

    from mpkit.simulator import machines

    assert f"|{torch.__version__}|" in machines._cache_key()
    monkeypatch.setitem(sys.modules, "torch", type(sys)("torch"))
    sys.modules["torch"].__version__ = "9.9.9+elsewhere"
    assert "|9.9.9+elsewhere|" in machines._cache_key()
    monkeypatch.delitem(sys.modules, "torch")
    assert f"|{importlib.metadata.version('torch')}|" in machines._cache_key()

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(machines.metadata, "version", missing)
    assert "|not installed|" in machines._cache_key()
