"""A save killed at any moment never costs a checkpoint: 120 times, a forked writer saving one new
checkpoint after another is SIGKILLed at a random instant (anywhere in DCP's writes, the hashing,
``mpkit.json``, the fsyncs or the rename); each time the checkpoint saved before it still loads and
equals what was saved, and every directory that looks complete is complete (its files match the
sizes and hashes it recorded; every 10th time also loaded and compared with its step's values).
One process at a time, no world: a few seconds in all on an idle machine."""
import os
import random
import shutil
import signal
import time

import pytest
import torch
from torch import nn

from mpkit.parallel import checkpoint

KILLS = 120


def model_at(step):
    """The model and optimizer state a writer saves at ``step``: values that name the step."""
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    opt = torch.optim.Adam(model.parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(step)
            opt.state[p] = {"step": torch.tensor(float(step)), "exp_avg": torch.full_like(p, step),
                            "exp_avg_sq": torch.full_like(p, step / 10)}
    return model, opt


def assert_holds_step(path, step):
    model, opt = model_at(-1)
    assert checkpoint.load(path, model, opt).step == step
    want, want_opt = model_at(step)
    for p, q in zip(model.parameters(), want.parameters()):
        assert torch.equal(p, q)
        assert all(torch.equal(opt.state[p][k], want_opt.state[q][k]) for k in want_opt.state[q])


def writer(directory, first, ready):
    """The forked child: save step after step until killed; says on ``ready`` (a pipe) when its first
    save starts, so the parent's random instant counts from there, not from a fork whose cost varies."""
    torch.set_num_threads(1)  # a forked child of a torch process (see DESIGN: OpenMP after fork)
    step = first
    model, opt = model_at(step)
    os.write(ready, b"s")
    while True:
        checkpoint.save(directory / f"step_{step:06d}", model, opt, step=step)
        step += 1
        model, opt = model_at(step)


def run_writer(directory, first, seconds):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        try:
            os.close(read_end)
            writer(directory, first, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"s", "the writer died before its first save"
        time.sleep(seconds)
    finally:
        os.close(read_end)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


@pytest.mark.timeout(120)
def test_a_save_killed_at_any_moment_leaves_every_complete_checkpoint_whole(tmp_path):
    model, opt = model_at(1)
    checkpoint.save(tmp_path / "step_000001", model, opt, step=1)
    started = time.perf_counter()
    model, opt = model_at(2)
    checkpoint.save(tmp_path / "probe", model, opt, step=2)
    one_save = time.perf_counter() - started  # measured here, so the kills spread over whole saves under any load
    shutil.rmtree(tmp_path / "probe")
    rng = random.Random(44)
    interrupted = 0
    for kill in range(KILLS):
        run_writer(tmp_path, 2, rng.uniform(0.0, 1.5 * one_save))
        assert_holds_step(tmp_path / "step_000001", 1)
        for path in checkpoint.complete(tmp_path):  # a complete one: its files are those it recorded, and
            checkpoint.verify(path)                 # (every 10th kill, to keep this cheap) its values its step's
            if kill % 10 == 0:
                assert_holds_step(path, checkpoint.read_info(path)["step"])
        interrupted += (tmp_path / ".step_000002.saving").exists() or (tmp_path / ".step_000003.saving").exists()
        for path in tmp_path.iterdir():  # the next writer starts again from step 2
            if path.name != "step_000001":
                shutil.rmtree(path)
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000001"
    assert interrupted > KILLS // 4, f"only {interrupted} of {KILLS} kills landed inside a save"
