"""The cost model prices a run's precision and recomputation with the same plan the run uses:
bytes per parameter by recipe, and the checkpointed layers profiled as they run (their memory,
their recomputed forward in the backward's price)."""
import math

import pytest

import mpkit
from mpkit.sim import formulas
from mpkit.simulator.engine import Compute
from mpkit.costmodel.memory import recipe
from mpkit.pricing.pricing import Pricer
from mpkit.models import ModelConfig
from mpkit.simulator.hardware import Hardware, Link
from mpkit.simulator.machines import get_hardware

# an fp32 machine that needs no calibration (cpu-sim is this machine, measured); memory does not
# depend on its speeds, and the backward's price only on its flop count here
IDEAL = Hardware(name="ideal", flops=1e9, mfu=1.0, mem_bw=math.inf,
                 op_overhead={"forward": 0.0, "backward": 0.0, "optimizer": 0.0},
                 p2p=Link(0.0, 0.0), collective=Link(0.0, 0.0))
GPT = dict(model="gpt", batch_size=32, hardware=IDEAL)


def test_bytes_per_parameter_by_recipe():
    assert formulas.bytes_per_parameter("fp32") == 4 + 4 + 8
    assert formulas.bytes_per_parameter("autocast") == 4 + 4 + 8  # fp32 master weights: autocast saves no state
    assert formulas.bytes_per_parameter("mixed") == 2 + 2 + 12
    assert formulas.bytes_per_parameter("mixed_fp32_grads") == 18
    with pytest.raises(ValueError, match="fp32, autocast"):
        formulas.bytes_per_parameter("fp8")


def test_recipe_follows_the_run_and_the_machine():
    cfg = ModelConfig(kind="gpt")
    cpu, gpu = IDEAL, get_hardware("8xA100-nvlink")
    assert recipe(Pricer(cpu, cfg, 1, 32, {})) == "fp32"
    assert recipe(Pricer(cpu, cfg, 1, 32, {}, precision="bf16")) == "autocast"
    assert recipe(Pricer(gpu, cfg, 1, 32, {})) == "mixed"


def _backward_seconds(pred):
    return sum(i.seconds for i in pred.programs[0] if isinstance(i, Compute) and i.kind == "backward")


@pytest.mark.parametrize("strategy, world, options", [("single", 1, {}), ("dp", 2, {"overlap": True}),
                                                      ("zero1", 2, {}), ("pp", 2, {"schedule": "1f1b"})])
def test_recompute_priced_in_memory_and_backward(strategy, world, options):
    plain = mpkit.sim.predict(strategy, world_size=world, **GPT, **options)
    full = mpkit.sim.predict(strategy, world_size=world, recompute="full", **GPT, **options)
    selective = mpkit.sim.predict(strategy, world_size=world, recompute="selective", **GPT, **options)
    act = [max(m["activations"] for m in p.memory_by_category()) for p in (plain, selective, full)]
    assert act[2] < act[1] <= act[0]
    # the backward recomputes the forward: full adds about one forward, selective the attention cores
    assert _backward_seconds(plain) < _backward_seconds(selective) < _backward_seconds(full)


@pytest.mark.timeout(120)
def test_predicted_recompute_memory_matches_a_run():
    """The profile runs the same checkpointed layers on the meta device with the same tracker:
    activations within 15% of the run's (the run's tracker sees its own allocator's timing)."""
    for mode in ("full", "selective"):
        run = mpkit.train("single", 1, steps=2, recompute=mode, model="gpt", batch_size=32)
        pred = mpkit.sim.predict("single", recompute=mode, **GPT)
        measured, predicted = run.memory_by_category()[0]["activations"], pred.memory_by_category()[0]["activations"]
        assert abs(predicted - measured) <= 0.15 * measured, (mode, predicted, measured)


def test_autocast_states_priced_as_fp32_master():
    fp32 = mpkit.sim.predict("zero1", world_size=2, **GPT).memory_by_category()[0]
    bf16 = mpkit.sim.predict("zero1", world_size=2, precision="bf16", **GPT).memory_by_category()[0]
    assert {k: bf16[k] for k in ("parameters", "gradients", "optimizer")} == {
        k: fp32[k] for k in ("parameters", "gradients", "optimizer")}
