"""Bad input, as users type it: each is refused in the caller, before any rank starts, with an error
that names the argument and says what to pass (never a hang, a silent wrong run, or a traceback
from the command line).

Some bad input only shows once training runs: a learning rate so large that the loss overflows.
That stops at the first NaN/inf loss with an error naming the step and the rank (the end of this
file), unless ``check_finite=False``.
"""
import math
import re

import pytest
from torch import nn

import mpkit
import mpkit.runtime.launch as launch_module
from mpkit.cli import main
from mpkit.parallel import Split


@pytest.fixture
def no_rank_starts(monkeypatch, no_leftovers):
    """Fail loudly if a launch got as far as starting ranks (its guardian is made just before)."""
    def refuse():
        raise AssertionError("ranks were started: the input should have been refused before")

    monkeypatch.setattr(launch_module, "Guardian", refuse)


def shallow_net():
    """Three layers, the middle one without parameters: a third stage would hold only the Tanh."""
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def tied_net():
    """A language-model-like Sequential whose output layer reuses the embedding's weight."""
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    return nn.Sequential(emb, nn.Linear(4, 4), nn.Tanh(), head)


def mine(factory):
    """Your own model: ``factory`` and a data function that the checks never call."""
    return dict(model=factory, data=lambda step, batch_size: None)


TRAIN = [  # (train keyword arguments, what the error must say)
    (dict(steps=True), "steps=True: pass a whole number of optimizer steps >= 1"),
    (dict(steps=0), "steps=0: pass a whole number of optimizer steps >= 1"),
    (dict(steps=2.5), "steps=2.5: pass a whole number"),
    (dict(steps="3"), "steps='3': pass a whole number"),
    (dict(batch_size=True), "batch_size=True: pass a whole number >= 1"),
    (dict(batch_size=0), "batch_size=0: pass a whole number >= 1"),
    (dict(batch_size=-8), "batch_size=-8: pass a whole number >= 1"),
    (dict(lr="fast"), "lr='fast': the learning rate must be a number"),
    (dict(lr=None), "lr=None: the learning rate must be a number"),
    (dict(lr=True), "lr=True: the learning rate must be a number"),
    (dict(lr=float("inf")), "lr=inf: the learning rate must be positive and finite"),
    (dict(lr=float("nan")), "lr=nan: the learning rate must be positive and finite"),
    (dict(lr=0), "lr=0: the learning rate must be positive and finite"),
    (dict(lr=-0.1), "lr=-0.1: the learning rate must be positive and finite"),
    (dict(seed="abc"), "seed='abc': pass a whole number from 0 to 4294967295"),
    (dict(seed=1.5), "seed=1.5: pass a whole number"),
    (dict(seed=-1), "seed=-1: pass a whole number from 0"),
    (dict(seed=2**40), f"seed={2**40}: pass a whole number from 0 to 4294967295"),
    (dict(seed=True), "seed=True: pass a whole number"),
    (dict(optimizer="adamw"), "optimizer='adamw' is unknown; use one of adam, sgd"),
    (dict(optimizer=["adam"]), "optimizer=['adam'] is unknown"),
    (dict(world_size=0), "world_size=0: pass a whole number >= 1"),
    (dict(world_size=2.0), "world_size=2.0: pass a whole number >= 1"),
    (dict(world_size="4"), "world_size='4': pass a whole number >= 1"),
    (dict(world_size=10**6, batch_size=10**6), "world_size=1000000 is more ranks than this machine can hold"),
    (dict(strategy="warp"), "strategy='warp' is unknown"),
    (dict(model="resnet"), "model='resnet' is unknown; use one of mlp, gpt"),
    (dict(model=None), "model=None is unknown"),
    (dict(foo=1), "option(s) ['foo'] do not apply to strategy='dp'"),
    (dict(layers=0), "layers=0 must be a positive whole number"),
    (dict(layers=True), "layers=True must be a positive whole number"),
    (dict(hidden=-1), "hidden=-1 must be a positive whole number"),
    (dict(layer_ms=-1), "layer_ms=-1 must be a number of milliseconds >= 0"),
    (dict(model="gpt", hidden=30), "hidden=30 is not divisible by heads=4"),
    (dict(device_memory="lots"), "device_memory='lots' is not a size"),
    (dict(device_memory=0), "device_memory=0 must be positive"),
    (dict(timeout=0), "timeout=0: pass a positive, finite number of seconds"),
    (dict(timeout="60"), "timeout='60': pass a positive, finite number of seconds"),
    (dict(timeout=float("inf")), "timeout=inf: pass a positive, finite number of seconds"),
    (dict(backend="mpi"), "backend='mpi' is unknown; use one of gloo, nccl"),
    (dict(backend="nccl"), "backend='nccl' needs CUDA GPUs and this machine has none"),
    (dict(strategy="single", world_size=2), "strategy='single' runs on one device; use world_size=1"),
    (dict(strategy="pp", micro_batches=3), "micro_batches=3 does not divide batch_size=32"),
    (dict(strategy="pp", schedule="zigzag"), "schedule='zigzag' is unknown; use one of 'gpipe', '1f1b'"),
    (dict(strategy="mp", world_size=8), "world_size=8 is more than the 4 layers of the model"),
    (dict(strategy="tp", world_size=3, model="gpt"), "tp size world_size=3 does not divide heads=4"),
    (dict(strategy="pp", world_size=3, **mine(shallow_net)), "rank 1 would hold only stage 1 (layers [1]: Tanh), "
                                                             "which has no parameters"),
    (dict(strategy="mp", world_size=3, **mine(shallow_net)), "This model has 2 (0: Linear, 2: Linear): use at most "
                                                             "2 stages"),
    (dict(strategy="pp", **mine(tied_net)), "parameter '0.weight' of stage 0 is shared with '3.weight' of stage 1"),
    (dict(strategy="pp", **mine(lambda: nn.Linear(4, 2))), "Return an nn.Sequential from the model factory"),
    (dict(strategy="pp", schedule="interleaved", **mine(shallow_net)), "cannot cut 3 layers into 4 non-empty stages"),
    # an instance is callable too: calling it ran forward() with no input, in a rank
    (dict(model=shallow_net(), data=lambda step, batch_size: None), "model= takes a function that builds your "
                                                                   "model (model=MyNet or model=lambda: MyNet(...))"),
    (dict(model=shallow_net, data=[(1, 2)]), "data= must be callable, got a list"),
    (dict(strategy="tp", world_size=3, plan={"0": "column", "2": "row"}, **mine(shallow_net)),
     "layer 0: tp size 3 does not divide out_features=8"),
    (dict(strategy="tp", plan={"fc": "column"}, **mine(shallow_net)),
     "plan names 'fc', but the module has no such layer"),
    (dict(strategy="tp", plan={"1": "column"}, **mine(shallow_net)),
     "ColumnParallelLinear slices an nn.Linear; 1 is a Tanh"),
    (dict(strategy="tp", plan={"3": "column"}, **mine(tied_net)), "layer '3' shares a parameter with '0.weight'"),
    # a column layer alone: its split output met the next layer's full weight, in a rank, as a shape error
    (dict(strategy="tp", plan={"0": "column"}, **mine(shallow_net)), "plan splits 0 by columns but no layer by rows"),
    # train splits in one call: a slice kept for "a later call" has no row layer to take it, nor a row its input
    (dict(strategy="tp", plan={"0": Split("column", gather_output=False)}, **mine(shallow_net)),
     "plan splits 0 by columns but no layer by rows"),
    (dict(strategy="tp", plan={"2": "row"}, **mine(shallow_net)), "plan splits 2 by rows but no layer by columns"),
    (dict(strategy="ps", world_size=1), "ps needs a server and at least one worker: use world_size>=2"),
    (dict(strategy="ps", mode="eventual"), "mode='eventual' is unknown; use one of sync, async"),
    # 3d refuses the schedule itself first: not a micro-batch count the schedule would then be refused with
    (dict(strategy="3d", world_size=4, dp=2, pp=2, schedule="dualpipev", micro_batches=2),
     "3d runs 'gpipe', '1f1b' or 'interleaved'; the zero-bubble, DualPipeV and looped schedules run under "
     "strategy 'pp'"),
    (dict(strategy="pp", world_size=4, schedule="dualpipev", micro_batches=4),
     "schedule='dualpipev' needs micro_batches >= 2*(pipeline ranks)=8"),
    # checkpoints (lab 12): every argument checked before any rank starts or any file is written
    (dict(checkpoint_every=2), "checkpoint_every=, checkpoint_async= and simulate_failure= go with checkpoint_dir"),
    (dict(checkpoint_dir="never-made", checkpoint_every=0), "checkpoint_every=0: pass a whole number of steps >= 1"),
    (dict(checkpoint_dir=42), "checkpoint_dir=42 must be a path"),
    (dict(checkpoint_dir="never-made", checkpoint_async="yes"), "checkpoint_async='yes' must be True"),
    (dict(checkpoint_dir="never-made", simulate_failure=(9, 0)), "simulate_failure=(9, 0): pass (step, rank) with "
                                                                  "0 <= step < steps=3"),
    (dict(resume_from="latest"), "resume_from='latest' resumes from checkpoint_dir: pass checkpoint_dir= too"),
    (dict(resume_from=42), "resume_from=42 must be a path to a checkpoint"),
    (dict(resume_from="never-made"), "resume_from='never-made' is not a checkpoint directory"),
    (dict(strategy="ps", checkpoint_dir="never-made"), "strategy='ps' does not take checkpoints: its parameters and "
                                                       "optimizer live on the server"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kwargs, message", TRAIN, ids=[re.sub(" at 0x[0-9a-f]+", "", repr(k)) for k, _ in TRAIN])
def test_train_refuses_bad_input_before_any_rank_starts(kwargs, message, no_rank_starts):
    call = {"strategy": "dp", "world_size": 2, **kwargs}
    with pytest.raises((ValueError, TypeError)) as info:
        mpkit.train(**call)
    assert message in str(info.value)


LAUNCH = [  # (launch keyword arguments, error class, what the error must say)
    (dict(fn=42), TypeError, "fn must be a function fn(ctx, *args); got int"),
    (dict(args=5), TypeError, "args=5: pass fn's extra arguments as a tuple, e.g. args=(5,)"),
    (dict(world_size=10**6), ValueError, "world_size=1000000 is more ranks than this machine can hold"),
    (dict(world_size=True), ValueError, "world_size=True: pass a whole number of ranks >= 1"),
    (dict(timeout=True), ValueError, "timeout=True: pass a positive, finite number of seconds"),
    (dict(timeout=-1), ValueError, "timeout=-1: pass a positive, finite number of seconds"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kwargs, error, message", LAUNCH, ids=[repr(k) for k, _, _ in LAUNCH])
def test_launch_refuses_bad_input_before_any_rank_starts(kwargs, error, message, no_rank_starts):
    call = {"fn": lambda ctx: ctx.rank, "world_size": 2, "timeout": 10, **kwargs}
    with pytest.raises(error) as info:
        mpkit.launch(**call)
    assert message in str(info.value)


CLI = [  # (arguments after `mpkit run --strategy dp`, what stderr must say)
    (["--option", "seed=abc"], "seed='abc': pass a whole number from 0 to 4294967295"),
    (["--option", "steps=True"], "steps=True: pass a whole number of optimizer steps"),
    (["--option", "lr=fast"], "lr='fast': the learning rate must be a number"),
    (["--lr", "inf"], "lr=inf: the learning rate must be positive and finite"),
    (["--steps", "0"], "steps=0: pass a whole number of optimizer steps >= 1"),
    (["--seed", "1", "--option", "seed=2"], "seed is given twice (--seed 1 and --option seed=2); give it once"),
    (["--option", "layers=2", "--option", "layers=3"], "layers is given twice (--option layers=2 and --option layers=3)"),
    (["--option", "strategy=tp"], "strategy is given twice (--strategy dp and --option strategy='tp')"),
    (["--world-size", "1000000", "--batch-size", "1000000"], "more ranks than this machine can hold"),
    (["--option", "device_memory=lots"], "device_memory='lots' is not a size"),
    (["--option", "timeout=abc"], "timeout='abc': pass a positive, finite number of seconds"),
    (["--seed", "abc"], "argument --seed: invalid int value: 'abc'"),
    (["--option", "mode"], "'mode' is not key=value"),
    (["--chrome-trace", "."], "argument --chrome-trace: '.' is a folder; give a file name"),
    (["--chrome-trace", "no/such/folder/trace.json"], "folder 'no/such/folder' does not exist"),
    (["--checkpoint-every", "2"], "checkpoint_every=, checkpoint_async= and simulate_failure= go with checkpoint_dir"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args, message", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_cli_run_refuses_bad_input_in_one_line(args, message, capsys, no_rank_starts):
    try:
        code = main(["run", "--strategy", "dp", *args])
    except SystemExit as exit_:  # argparse's own errors (usage line + one error line)
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err



@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy,world_size", [("single", 1), ("dp", 2), ("pp", 2), ("tp", 2)])
def test_a_loss_that_overflows_stops_naming_the_step(strategy, world_size):
    with pytest.raises(mpkit.LaunchError, match=r"NonFiniteLoss: step \d+: the loss is (nan|inf) on rank \d+\. "
                                                r"Lower the learning rate \(lr=1e\+12\)"):
        mpkit.train(strategy, world_size, optimizer="sgd", lr=1e12, steps=4)


@pytest.mark.timeout(120)
def test_check_finite_false_keeps_training():
    run = mpkit.train("dp", 2, optimizer="sgd", lr=1e12, steps=4, check_finite=False)
    assert len(run.losses) == 4 and not all(math.isfinite(loss) for loss in run.losses)


@pytest.mark.timeout(120)
def test_the_command_line_says_it_in_one_line(capsys):
    assert main(["run", "--strategy", "dp", "--world-size", "2", "--optimizer", "sgd", "--lr", "1e12",
                 "--steps", "4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the loss is" in err[0] and "Lower the learning rate" in err[0], err


def _rank_of(ctx):
    return ctx.rank


@pytest.mark.timeout(60)
def test_numpy_numbers_are_numbers_everywhere_and_bools_nan_inf_are_not():
    # a sweep over np.linspace / np.arange hands numpy scalars (np.float32 and np.int64 are no
    # float or int); each check here said "pass a number" to them. One predicate decides now
    # (mpkit.whole.is_number), and each check keeps its own range and message
    import numpy as np
    from mpkit.models import ModelConfig
    from mpkit.parallel.buckets import check_bucket_mb
    from mpkit.plot.comm import comm
    from mpkit.tf import distribute as tfdist

    assert mpkit.launch(_rank_of, 1, timeout=np.float32(30)) == [0]
    assert check_bucket_mb(np.float32(25)) == 25.0 and ModelConfig(layer_ms=np.int64(2)).layer_ms == 2
    bad = (True, math.nan, math.inf)
    for value in bad:
        with pytest.raises(ValueError, match="pass a positive, finite number of seconds"):
            mpkit.launch(_rank_of, 1, timeout=value)
        with pytest.raises(ValueError, match="must be a number of MiB >= 0"):
            check_bucket_mb(value)
        with pytest.raises(ValueError, match="must be a number of milliseconds >= 0"):
            ModelConfig(layer_ms=value)
        with pytest.raises(ValueError, match="payload size S in bytes"):
            comm(mpkit.train("single", steps=1), all_reduce_payload=value)
        with pytest.raises(ValueError, match="pass a positive number of seconds"):
            tfdist.run_isolated("ps_train", timeout=value)
