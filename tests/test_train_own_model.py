"""``mpkit.train`` on a learner's model (a factory, tied weights, an unused branch) for every
strategy that takes one, against the single-device reference. Models and tolerance:
``parallel_models``."""
import torch
import torch.nn.functional as F

import pytest

import mpkit
from parallel_models import ATOL, deep_data, deep_net, make_net


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy,options", [("dp", {}), ("ddp", {}), ("zero1", {}), ("fsdp", {}),
                                              ("tp", {"plan": {"*.mlp.up": "column", "*.mlp.down": "row"}}),
                                              ("pp", {"schedule": "1f1b"}), ("mp", {}), ("ps", {})])
def test_train_accepts_a_model_factory(strategy, options):
    world = 3 if strategy == "ps" else 2
    run = mpkit.train(strategy, world, model=deep_net, data=deep_data, loss=F.cross_entropy, steps=3,
                      batch_size=8, optimizer="adam", **options)
    assert run.compare_to_reference().max <= ATOL
    assert len(run.losses) == 3 and run.trace.events


def token_data(step, batch_size):
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, 16, (batch_size, 4), generator=g), torch.randint(0, 16, (batch_size,), generator=g)


@pytest.mark.timeout(200)
def test_train_fsdp_on_a_model_with_tied_weights_and_an_unused_branch():
    # FSDP2 refuses a parameter in two units ("use fully_shard([module_a, module_b])", which a
    # train user cannot do): the tied embedding and output layer stay with the root unit. Every
    # rank's gradient shard is reduce-scattered in float32: the 1e-5 tolerance of the others
    run = mpkit.train("fsdp", 2, model=make_net, data=token_data, steps=3, batch_size=8, optimizer="adam")
    assert run.compare_to_reference().max <= ATOL


@pytest.mark.timeout(200)
@pytest.mark.parametrize("strategy", ["dp", "ddp"])
def test_train_on_a_model_with_an_unused_branch(strategy):
    # Net has an unused branch (and a frozen layer and tied weights): dp, and torch's DDP in its
    # own words, ask for the option by name; then with it both train as one device does. dp
    # traces its used-parameter mask; DDP's bitmap all-reduce runs inside DDP, off the timeline,
    # and the cost model prices both the same way
    with pytest.raises(mpkit.LaunchError, match="find_unused_parameters=True"):
        mpkit.train(strategy, 2, model=make_net, data=token_data, steps=2, batch_size=8)
    run = mpkit.train(strategy, 2, model=make_net, data=token_data, steps=3, batch_size=8, optimizer="adam",
                      find_unused_parameters=True)
    assert run.compare_to_reference().max <= ATOL
    assert any(e.name == "used-parameter mask" for e in run.trace.events) == (strategy == "dp")
    predicted = mpkit.sim.predict(strategy, world_size=2, hardware="8xH100-nvlink", find_unused_parameters=True)
    assert len([e for e in predicted.trace.events if e.name == "used-parameter mask"]) == 2  # one per rank
    with pytest.raises(ValueError, match="find_unused_parameters='yes' must be True"):
        mpkit.train(strategy, 2, find_unused_parameters="yes")
