"""``mpkit.train`` with checkpoints: every strategy resumes exactly, and a checkpoint saved under one
layout resumes under another equal to the run that never changed layout.

Exact resume (tolerance 0): ``steps=3`` with ``checkpoint_every=2`` saves after two steps; the same
strategy resumed from that checkpoint runs the one step left, and its parameters and that step's
loss are bit for bit those of the uninterrupted run (the same ops on the same values in the same
order; the data of a step is a function of the seed and the step). fp16 adds the loss
scaler: a huge first scale backs off at every overflowing step, and resumed without its state step 2
would start from the first scale again (the test compares the scale's history).

Resharding: 4-rank dp x tp with ZeRO-1 into 2-rank pp and fsdp into tp (mlp, Adam: its state is
resharded too; ``RESHARD_ATOL``), 8-rank 3d into 4-rank dp (gpt: qkv split by heads, three chunks
per rank; SGD, ``SGD_ATOL``, as ``test_strategy_3d`` checks the gpt's parameters). After the load
the new layout sums the same gradients in another order, so its step differs from the old
layout's in the last float32 bits.
"""
import pytest

import mpkit
from mpkit.parallel import checkpoint
from mpkit.strategies.checkpointing import read_history

STEPS, EVERY = 3, 2
RESHARD_ATOL = 1e-5
SGD_ATOL = 1e-6  # the gpt with SGD (as test_strategy_3d: Adam would turn rounding noise in its key bias into ~lr steps)

SMALL_GPT = {"layers": 2, "hidden": 32, "seq_len": 8, "batch_size": 8}  # sp, cp, ep split a sequence: a small gpt
SAME_LAYOUT = {  # name: (strategy, world_size, options)
    "single": ("single", 1, {}),
    "dp": ("dp", 2, {}),
    "ddp": ("ddp", 2, {}),
    "zero1": ("zero1", 2, {}),
    "zero1 fp16": ("zero1", 2, {"precision": "fp16", "loss_scale": 2.0**40}),
    "fsdp": ("fsdp", 2, {}),
    "mp": ("mp", 2, {}),
    "tp": ("tp", 2, {}),
    "pp": ("pp", 2, {"schedule": "1f1b"}),
    "sp": ("sp", 2, SMALL_GPT),
    "cp": ("cp", 2, SMALL_GPT),
    "ep": ("ep", 2, SMALL_GPT),
    "3d": ("3d", 4, {"dp": 2, "tp": 2, "zero": True}),
}

_runs = {}


def saved_run(name, directory_factory):
    """The uninterrupted run of ``name`` (saving after step 2), made once per test session."""
    if name not in _runs:
        strategy, world, options = SAME_LAYOUT[name]
        directory = directory_factory.mktemp(name.replace(" ", "_"))
        _runs[name] = mpkit.train(strategy, world_size=world, steps=STEPS, checkpoint_dir=directory,
                                  checkpoint_every=EVERY, **options)
    return _runs[name]


def assert_same_run(resumed, full, atol=0.0):
    assert resumed.first_step == EVERY and len(resumed.losses) == STEPS - EVERY
    assert max(abs(a - b) for a, b in zip(resumed.losses, full.losses[EVERY:])) <= atol
    assert resumed.params.keys() == full.params.keys()
    for name, tensor in full.params.items():
        assert (resumed.params[name] - tensor).abs().max().item() <= atol, name


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", list(SAME_LAYOUT))
def test_every_strategy_resumes_exactly(name, tmp_path_factory):
    full = saved_run(name, tmp_path_factory)
    strategy, world, options = SAME_LAYOUT[name]
    assert [p.name for p in full.checkpoints] == ["step_000002"]
    resumed = mpkit.train(strategy, world_size=world, steps=STEPS, resume_from=full.checkpoints[0], **options)
    assert_same_run(resumed, full)
    if options.get("precision") == "fp16":  # the scale came along: it had backed off before the save
        assert full.extra[0]["loss_scale"][EVERY] < options["loss_scale"]
        assert resumed.extra[0]["loss_scale"] == full.extra[0]["loss_scale"][EVERY:]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("saved, strategy, world, options", [
    ("3d", "pp", 2, {"schedule": "1f1b"}),  # 4-rank dp x tp with ZeRO-1 into a 2-rank pipeline
    ("fsdp", "tp", 2, {}),
])
def test_a_checkpoint_resumes_under_another_layout(saved, strategy, world, options, tmp_path_factory):
    full = saved_run(saved, tmp_path_factory)
    resumed = mpkit.train(strategy, world_size=world, steps=STEPS, resume_from=full.checkpoints[0], **options)
    assert_same_run(resumed, full, RESHARD_ATOL)


@pytest.mark.timeout(200)
def test_eight_rank_3d_resumes_as_four_rank_dp_with_the_history_of_both(tmp_path):
    full = mpkit.train("3d", world_size=8, dp=2, tp=2, pp=2, model="gpt", optimizer="sgd", steps=STEPS,
                       checkpoint_dir=tmp_path, checkpoint_every=EVERY)
    info = checkpoint.read_info(full.checkpoints[0])
    assert info["tensors"]["model.layers.1.attn.qkv.weight"]["shape"] == [192, 64]  # saved whole, from 3 chunks per rank
    resumed = mpkit.train("dp", world_size=4, model="gpt", optimizer="sgd", steps=STEPS, resume_from="latest",
                          checkpoint_dir=tmp_path)
    assert_same_run(resumed, full, SGD_ATOL)
    events = [(e["event"], e["step"]) for e in read_history(tmp_path)]
    assert events == [("start", 0), ("step", 0), ("step", 1), ("save", 2), ("step", 2), ("end", 3),
                      ("start", 2), ("step", 2), ("save", 3), ("end", 3)]


def test_a_rerun_into_a_used_directory_is_refused_and_a_finished_run_has_nothing_left(tmp_path_factory):
    full = saved_run("dp", tmp_path_factory)
    directory = full.config.checkpointing.directory
    with pytest.raises(ValueError, match="already holds step_000002 from an earlier run"):
        mpkit.train("dp", world_size=2, steps=STEPS, checkpoint_dir=directory, checkpoint_every=EVERY)
    with pytest.raises(ValueError, match="holds step 2, and steps=2: nothing is left to train"):
        mpkit.train("dp", world_size=2, steps=2, checkpoint_dir=directory, resume_from="latest")
