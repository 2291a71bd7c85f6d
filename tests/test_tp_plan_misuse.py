"""A tensor-parallel plan with column and row reversed names the layer and the fix (issue 36):
torch alone says only "mat1 and mat2 shapes cannot be multiplied"."""
import pytest
import torch
from torch import nn

import mpkit
from mpkit.parallel import Split, tensor_parallel


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 32)
        self.down = nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _run(ctx, plan):
    torch.manual_seed(0)
    model = tensor_parallel(MLP(), plan)
    return model(torch.randn(3, 8)).shape


@pytest.mark.timeout(60)
def test_reversed_plan_names_the_layer_and_the_fix():
    with pytest.raises(mpkit.LaunchError, match=r"tensor-parallel layer up \(row-parallel, rank \d\) received the full "
                                                r"input \(8 features\), not this rank's slice of 4 .*is the plan "
                                                r"reversed\?.*'mlp.up': 'column', 'mlp.down': 'row'"):
        mpkit.launch(_run, 2, args=({"up": "row", "down": "column"},), timeout=30)
    assert mpkit.launch(_run, 2, args=({"up": "column", "down": "row"},), timeout=30) == [(3, 8)] * 2


def test_a_column_layer_fed_a_slice_says_so():
    """Without a process group (rank/world_size given): a column layer after a column layer."""
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    tensor_parallel(model, {"0": Split("column", gather_output=False), "1": Split("column", gather_output=True)},
                    rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"layer 1 \(column-parallel, rank 0\) received a slice of 4 of its 8 input "
                                         r"features: a column layer takes the full input"):
        model(torch.randn(3, 8))
