"""mpkit.parallel.precision and recompute as mechanisms, in one process: autocast per layer with fp32
master weights, the dynamic loss scaler against torch.amp.GradScaler, recomputation's gradients,
and the errors that say what to pass."""
import pytest
import torch
from torch import nn

import mpkit
from mpkit.models import ModelConfig, build_model
from mpkit.parallel.precision import LossScaler, MixedPrecision, autocast_layers
from mpkit.parallel.recompute import recompute_layers


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_layers_compute_low_keep_fp32_master(precision, dtype):
    net = _net()
    seen = []
    net[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    autocast_layers([net], precision)  # the whole stack as one layer: its Linears run inside
    out = net(torch.randn(5, 8))
    out.sum().backward()
    assert seen == [dtype]  # the matmul inside ran in low precision ...
    assert out.dtype == torch.float32  # ... and the next layer (or a pipeline's send) gets fp32
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in net.parameters())
    assert [n for n, _ in net.named_parameters()] == [n for n, _ in _net().named_parameters()]


def test_fp16_without_a_scaler_says_what_to_pass():
    with pytest.raises(ValueError, match="LossScaler|bf16"):
        MixedPrecision("fp16")
    with pytest.raises(ValueError, match="precision='fp8' is unknown"):
        MixedPrecision("fp8")


def test_loss_scaler_follows_torch_grad_scaler():
    """The same gradients (some with an inf) through LossScaler and torch.amp.GradScaler: the same
    scale after every step, the same steps skipped, the same parameters."""
    ours, theirs = _net(), _net()
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(theirs.parameters(), lr=0.1)
    mine = MixedPrecision("fp16", LossScaler(init_scale=2.0**10, growth_interval=2))
    ref = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    x = torch.randn(6, 8)
    for step, poison in enumerate([False, True, False, False, False, True, True, False]):
        for net, scale in ((ours, mine.scaler.scale), (theirs, ref.scale)):
            scale(net(x).square().mean()).backward()
            if poison:
                net[0].weight.grad[0, 0] = float("inf")
        stepped = mine.step(opt_a, ours.parameters())
        ref.step(opt_b)
        ref.update()
        assert stepped == (not poison)
        assert mine.scaler.value == ref.get_scale(), step
        opt_a.zero_grad()
        opt_b.zero_grad()
    assert mine.scaler.skipped == [1, 5, 6]
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_gives_the_same_gradients(mode):
    cfg = ModelConfig(kind="gpt", layers=2)
    x = torch.randint(0, cfg.vocab, (4, cfg.seq_len))
    grads = []
    for recompute in (None, mode):
        model = build_model(cfg, seed=0)
        recompute_layers(list(model.layers), recompute)
        model(x).square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)  # the same ops again: equal up to float reordering


def test_selective_needs_an_attention_core():
    with pytest.raises(ValueError, match="recompute='full'"):
        recompute_layers(list(_net()), "selective")


def test_train_refuses_precision_where_not_taken():
    with pytest.raises(ValueError, match="strategy='ps' does not take precision=.*single, dp, ddp, zero1, fsdp, mp, tp, pp"):
        mpkit.train("ps", 3, precision="bf16")
    with pytest.raises(ValueError, match="recompute='half' is unknown"):
        mpkit.train("single", recompute="half")
    with pytest.raises(ValueError, match="loss_scale"):
        mpkit.train("single", precision="fp16", loss_scale=0)
    with pytest.raises(ValueError, match="pass precision='fp16'"):
        mpkit.train("single", precision="bf16", loss_scale=2.0**10)


class _Attend(nn.Module):
    """A user's block around torch's nn.MultiheadAttention (selective recomputation's target there)."""

    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(16, 4, batch_first=True)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.mha(x, x, x, need_weights=False)[0])


def test_selective_on_a_user_model_recomputes_its_multihead_attention():
    x = torch.randn(3, 5, 16)
    grads = []
    for mode in (None, "selective"):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 16), _Attend())
        recompute_layers(list(net), mode)
        net(x).square().mean().backward()
        grads.append([p.grad for p in net.parameters()])
    assert type(net[1].mha.forward).__name__ == "_Checkpointed"
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
