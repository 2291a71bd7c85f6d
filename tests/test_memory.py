"""Memory by category, measured by torch's MemTracker: exact bytes on a model whose sizes we know."""
import pickle

import pytest
import torch

import mpkit
from mpkit.observe.memory import CATEGORIES, MemoryTracker, parse_bytes


def _model_and_adam():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _param_bytes(model):
    return sum(p.numel() * 4 for p in model.parameters())  # float32


def _one_step(tracker, model, opt):
    """Forward, backward, step inside ``track``; returns the sample index at each phase boundary."""
    marks = {}
    with tracker.track(model, opt):
        x = torch.randn(64, 16)
        marks["forward"] = len(tracker.samples)
        loss = model(x).sum()
        marks["backward"] = len(tracker.samples)
        loss.backward()
        marks["step"] = len(tracker.samples)
        opt.step()
        marks["end"] = len(tracker.samples)
    return marks


@pytest.fixture
def stepped():
    model, opt = _model_and_adam()
    tracker = MemoryTracker()
    marks = _one_step(tracker, model, opt)
    return model, opt, tracker, marks


def test_parameters_and_gradients_are_exact(stepped):
    model, _, tracker, _ = stepped
    report = tracker.report()
    assert report.max_by_category["parameters"] == _param_bytes(model) == 3232
    assert report.max_by_category["gradients"] == _param_bytes(model)


def test_adam_state_after_the_first_step(stepped):
    model, opt, tracker, _ = stepped
    params = list(model.parameters())
    # Adam keeps exp_avg and exp_avg_sq (each the parameter's size) and, on CPU without
    # capturable/fused, a float32 scalar tensor "step" per parameter (4 bytes each).
    assert {k: v.dtype for k, v in opt.state[params[0]].items()} == {
        "step": torch.float32, "exp_avg": torch.float32, "exp_avg_sq": torch.float32}
    held_by_torch = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    assert tracker.current()["optimizer"] == held_by_torch == 2 * _param_bytes(model) + 4 * len(params)


def test_a_frozen_layer_is_tracked_without_a_gradient_hook():
    """A learner's model with a frozen layer (fine-tuning): torch refuses a gradient hook on a
    frozen parameter, so tracking must hook only the trainable ones, and count every parameter."""
    model, _ = _model_and_adam()
    model[0].requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    tracker = MemoryTracker()
    _one_step(tracker, model, opt)
    report = tracker.report()
    assert report.max_by_category["parameters"] == _param_bytes(model)
    assert report.max_by_category["gradients"] == _param_bytes(model[2])
    assert model[0].weight.grad is None and model[2].weight.grad is not None


def _activations(tracker, start, stop):
    return [values[CATEGORIES.index("activations")] for _, values in tracker.samples[start:stop]]


def test_activations_rise_in_forward_and_fall_in_backward(stepped):
    _, _, tracker, marks = stepped
    forward = _activations(tracker, marks["forward"], marks["backward"])
    backward = _activations(tracker, marks["backward"], marks["step"])
    assert min(forward) > 0  # the input batch is an activation from the start
    assert max(forward) > forward[0]
    assert backward[-1] < max(forward) and backward[-1] < backward[0]


def test_samples_are_on_the_trace_clock_and_in_order(stepped):
    _, _, tracker, _ = stepped
    times = [t for t, _ in tracker.report().timeline()]
    assert times == sorted(times) and len(times) == len(tracker.samples)


def test_report_is_picklable(stepped):
    report = stepped[2].report()
    copy = pickle.loads(pickle.dumps(report))
    assert (copy.rank, copy.peak_total, copy.max_by_category, copy.samples) == (
        report.rank, report.peak_total, report.max_by_category, report.samples)


def test_capacity_raises_device_out_of_memory_with_the_amounts():
    tracker = MemoryTracker(rank=2, capacity=2**20)
    with pytest.raises(mpkit.DeviceOutOfMemory) as info:
        with tracker.track():
            torch.empty(2**19)  # 2 MiB of float32
    assert "rank 2" in str(info.value)
    assert "hold 2.0 MiB" in str(info.value) and "capacity is 1.0 MiB" in str(info.value)


def test_disabled_tracker_records_nothing():
    tracker = MemoryTracker(enabled=False)
    model, opt = _model_and_adam()
    _one_step(tracker, model, opt)
    assert tracker.samples == [] and tracker.report().peak_total == 0


def _tracked_step(ctx):
    model, opt = _model_and_adam()
    _one_step(ctx.memory, model, opt)
    return _param_bytes(model)


@pytest.mark.timeout(30)
def test_each_rank_reports_its_memory_through_launch():
    out = mpkit.launch(_tracked_step, 2, timeout=20)
    assert [m.rank for m in out.memory] == [0, 1]
    assert [m.max_by_category["parameters"] for m in out.memory] == out


@pytest.mark.parametrize("text, expected", [
    ("64MiB", 64 * 2**20), ("2GB", 2 * 10**9), (4096, 4096), ("1.5 KiB", 1536), ("512b", 512), (None, None)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "64 MiBs", "", "-1MB", "1e3", True, 0, "0GB"])
def test_parse_bytes_rejects_non_sizes(text):
    with pytest.raises(ValueError) as info:
        parse_bytes(text)
    assert repr(text) in str(info.value)


def _dtensor_matmul(ctx):
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    w, x = torch.randn(256, 256), torch.randn(64, 256)

    def work():
        dw = distribute_tensor(w, mesh, [Shard(0)])
        (distribute_tensor(x, mesh, [Replicate()]) @ dw.T).full_tensor()

    with ctx.memory.track():
        work()
    reference = MemTracker()
    with reference:
        work()
    return ctx.memory.report().peak_total, reference.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.timeout(60)
def test_dtensor_sharding_propagation_is_not_counted():
    """DTensor computes output shapes on fake tensors; only the local shards are real memory."""
    for ours, reference in mpkit.launch(_dtensor_matmul, 2, timeout=40):
        assert ours == reference > 0


def _allocates_outside_track(ctx, mib):
    held = torch.zeros(mib * 2**18)  # mib MiB of float32, outside any ctx.memory.track()
    with ctx.memory.track():
        torch.ones(16)
    return held.numel() * 4


@pytest.mark.timeout(60)
def test_a_capacity_counts_everything_the_rank_allocates():
    """With device_memory set the whole rank is tracked: a tensor made before (outside) the
    strategy's ``ctx.memory.track`` still fills the simulated device."""
    with pytest.raises(mpkit.DeviceOutOfMemory, match=r"rank \d: simulated device out of memory: tried to hold "
                                                       r"4\.0 MiB but capacity is 2\.0 MiB"):
        mpkit.launch(_allocates_outside_track, 2, args=(4,), device_memory="2MiB", timeout=50)
    fits = mpkit.launch(_allocates_outside_track, 2, args=(1,), device_memory="2MiB", timeout=50)
    assert fits == [2**20, 2**20] and all(m.peak_total >= 2**20 for m in fits.memory)
