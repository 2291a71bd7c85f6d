"""README's "your own model under mpkit.launch" example, as written there: ctx gives the rank and
world size, the rank slices its batch, ``ctx.trace.span`` records compute so the timeline shows it
beside the communication, ``ctx.memory.track`` records memory, and ``mpkit.plot.memory`` takes the
launch's result (issue 36: it raised "got float without per-rank memory reports")."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpkit
from mpkit.parallel import DataParallel


def train(ctx, steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    dp = DataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)
    x, y = x.tensor_split(ctx.world_size)[ctx.rank], y.tensor_split(ctx.world_size)[ctx.rank]  # this rank's slice
    with ctx.memory.track(model, opt):
        for step in range(steps):
            ctx.set_step(step)
            with ctx.trace.span("forward"):
                loss = F.cross_entropy(dp(x), y)
            with ctx.trace.span("backward"):
                loss.backward()
            dp.finish_gradient_synchronization()
            with ctx.trace.span("optimizer"):
                opt.step()
                opt.zero_grad()
    return loss.item()


@pytest.mark.timeout(60)
def test_readme_example_plots_compute_and_memory():
    import matplotlib
    matplotlib.use("Agg")
    out = mpkit.launch(train, world_size=2, args=(3,))
    assert len(out) == 2 and all(isinstance(v, float) for v in out)
    kinds = {e.kind for e in out.trace.events}
    assert {"forward", "backward", "optimizer", "all_reduce"} <= kinds
    mpkit.plot.timeline(out)
    fig = mpkit.plot.memory(out)
    bars = {a.get_gid() for a in fig.axes[0].patches}
    assert {"parameters", "gradients", "optimizer"} <= bars
    params = 4 * (16 * 32 + 32 + 32 * 4 + 4)
    assert [r.max_by_category["parameters"] for r in out.memory] == [params, params]
