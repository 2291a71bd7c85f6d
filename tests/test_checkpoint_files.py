"""``mpkit.parallel.checkpoint`` in one process: an ordinary model (tied weights, a frozen layer, an
unused branch, two parameter groups, AdamW, torch's default ``zero_grad()``) resumes exactly, and a
checkpoint that cannot be trusted or does not fit is refused with an error that says what differs,
before anything is changed. No world: DCP runs in one process."""
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mpkit.parallel import checkpoint
from mpkit.parallel.checkpoint import CheckpointError
from parallel_models import Net, batch, make_net, param_groups


def train(model, opt, steps, start=0):
    for step in range(start, steps):
        x, y = batch(step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()  # torch's default: set_to_none=True


def fresh(seed=1):
    model = make_net(seed)
    return model, torch.optim.AdamW(param_groups(model), lr=1e-2)


def snapshot(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(opt.state.values())})


def assert_same(a, b):
    assert a[0].keys() == b[0].keys()
    for k in a[0]:
        assert torch.equal(a[0][k], b[0][k]), k
    assert a[1].keys() == b[1].keys()
    for i in a[1]:
        for k in a[1][i]:
            assert torch.equal(a[1][i][k], b[1][i][k]), (i, k)


@pytest.fixture
def saved(tmp_path):
    """A model and AdamW after 3 steps, saved at tmp_path/ckpt."""
    model, opt = fresh(0)
    train(model, opt, 3)
    checkpoint.save(tmp_path / "ckpt", model, opt, step=3, extra={"note": "three steps"})
    return tmp_path / "ckpt", model, opt


def test_an_ordinary_model_resumes_exactly(saved):
    """Tolerance 0: the same ops on the same values in the same order, before and after the load."""
    path, model, opt = saved
    other, other_opt = fresh(1)
    loaded = checkpoint.load(path, other, other_opt)
    assert (loaded.step, loaded.extra) == (3, {"note": "three steps"})
    assert_same(snapshot(model, opt), snapshot(other, other_opt))
    assert other.head.weight is other.emb.weight  # still tied: loaded once, into the one tensor
    assert not other.frozen.weight.requires_grad
    assert other_opt.state.get(other.unused.weight) is None  # never had a gradient, none saved
    assert [g["weight_decay"] for g in other_opt.param_groups] == [0.1, 0.0]
    train(model, opt, 5, 3)
    train(other, other_opt, 5, 3)
    assert_same(snapshot(model, opt), snapshot(other, other_opt))


def test_mpkit_json_records_versions_step_tensors_and_files(saved):
    path, _, _ = saved
    info = checkpoint.verify(path)
    assert info["format_version"] == 1 and info["step"] == 3 and info["optimizer"]["class"] == "AdamW"
    assert info["tensors"]["model.emb.weight"] == {"shape": [16, 8], "dtype": "float32"}
    assert "model.head.weight" not in info["tensors"]  # tied to emb.weight: saved once
    assert info["tensors"]["optim.body.0.weight.step"]["shape"] == []
    assert set(info["files"]) == {".metadata", "__0_0.distcp"}


def _truncate(path):
    f = path / "__0_0.distcp"
    f.write_bytes(f.read_bytes()[:-100])


def _flip(name, offset):
    def damage(path):
        data = bytearray((path / name).read_bytes())
        data[offset] ^= 0x01
        (path / name).write_bytes(bytes(data))
    return damage


def _version(path):
    info = json.loads((path / "mpkit.json").read_text())
    info["format_version"] = 99
    (path / "mpkit.json").write_text(json.dumps(info))


def _no_info(path):
    (path / "mpkit.json").unlink()


def _garbage_info(path):
    (path / "mpkit.json").write_text('{"format": "mpkit-checkpoint", "step": ')


@pytest.mark.parametrize("damage, said", [
    (_truncate, "were written: it was truncated"), (_flip(".metadata", 40), "SHA-256"), (_flip("__0_0.distcp", 2000), "SHA-256"),
    (_version, "format version 99"), (_no_info, "not a complete mpkit checkpoint"), (_garbage_info, "damaged"),
])
def test_a_damaged_checkpoint_is_refused_and_nothing_changes(saved, damage, said):
    path, _, _ = saved
    damage(path)
    model, opt = fresh(1)
    before = snapshot(model, opt)
    with pytest.raises(CheckpointError, match=said):
        checkpoint.load(path, model, opt)
    assert_same(before, snapshot(model, opt))


class Wider(Net):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 9), nn.Tanh(), nn.Linear(9, 8))


class Extra(Net):
    def __init__(self):
        super().__init__()
        self.more = nn.Linear(8, 8)


class Fewer(Net):
    def __init__(self):
        super().__init__()
        del self.unused

    def forward(self, idx):
        return self.head(self.body(self.frozen(self.emb(idx).mean(1))))


def _model(cls):
    torch.manual_seed(1)
    return cls()


@pytest.mark.parametrize("model, opt, said", [
    (lambda: _model(Wider), None, "body.0.weight was saved with shape (8, 8), this model's is (9, 8)"),
    (lambda: _model(Extra), None, "missing from the checkpoint: more.weight, more.bias"),
    (lambda: _model(Fewer), None, "holds tensors this model does not: unused.bias, unused.weight"),
    (lambda: make_net(1).double(), None, "saved as float32, this model holds float64"),
    (lambda: make_net(1), lambda m: torch.optim.SGD(m.parameters(), lr=0.1), "saved with optimizer AdamW, this "
                                                                             "optimizer is SGD"),
    (lambda: make_net(1), lambda m: torch.optim.AdamW(m.parameters()), "2 parameter groups, this one 1"),
    (lambda: make_net(1), lambda m: torch.optim.AdamW(param_groups(m), amsgrad=True), "max_exp_avg_sq"),
])
def test_another_model_or_optimizer_is_refused_saying_what_differs(saved, model, opt, said):
    path, _, _ = saved
    model = model()
    opt = opt(model) if opt else None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=said.replace("(", r"\(").replace(")", r"\)")):
        checkpoint.load(path, model, opt)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # refused before any change
    assert opt is None or not opt.state  # the state the check needed was created, then taken back


def test_a_model_only_checkpoint_says_so_when_an_optimizer_is_passed(tmp_path):
    model, opt = fresh(0)
    checkpoint.save(tmp_path / "m", model)
    with pytest.raises(CheckpointError, match="holds no optimizer state; load it with optimizer=None"):
        checkpoint.load(tmp_path / "m", *fresh(1))
    assert checkpoint.load(tmp_path / "m", make_net(1)).step == 0


def test_save_refuses_an_existing_path_and_overwrite_replaces_it(saved):
    path, model, opt = saved
    with pytest.raises(FileExistsError, match="overwrite=True"):
        checkpoint.save(path, model, opt, step=4)
    checkpoint.save(path, model, opt, step=4, overwrite=True)
    assert checkpoint.verify(path)["step"] == 4
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt"]  # nothing left beside it


def test_latest_takes_the_highest_complete_step_and_skips_an_unfinished_save(saved):
    path, model, opt = saved
    checkpoint.save(path.parent / "b", model, opt, step=7)
    shutil.copytree(path.parent / "b", path.parent / "c")
    (path.parent / "c" / "mpkit.json").unlink()  # as a save killed before its commit leaves it
    (path.parent / ".d.saving").mkdir()
    assert checkpoint.latest(path.parent) == path.parent / "b"
    assert [p.name for p in checkpoint.complete(path.parent)] == ["ckpt", "b"]


def test_bad_arguments_say_what_to_pass(tmp_path):
    model, opt = fresh(0)
    with pytest.raises(TypeError, match="extra must be JSON-serialisable"):
        checkpoint.save(tmp_path / "x", model, opt, extra={"t": torch.zeros(1)})
    with pytest.raises(ValueError, match="step=-1 must be a whole number"):
        checkpoint.save(tmp_path / "x", model, opt, step=-1)
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        checkpoint.load(tmp_path / "nowhere", model, opt)
    assert not (tmp_path / "x").exists()
