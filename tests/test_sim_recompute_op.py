"""recompute="op": torchtitan's op-level selective checkpointing (keeps the attention output and every
other matmul's output, recomputes the rest), the selective recomputation that still does something
under flash attention; torchtitan's own 8B runs did not fit the planner's memory model without it."""
import pytest

from mpkit.sim import plan
from mpkit.costmodel.analytic import MODELS, _matmuls, activation_bytes

KW = dict(model=MODELS["llama3-8b"], hardware="8xH100-96GB-nvlink", gpus=8, global_batch=16, zero=3, tp=1, pp=1,
          micro_batch=2, sequence_parallel=False, flash=True)


def test_op_keeps_less_than_none_and_more_than_full_and_costs_in_between():
    by = {rc: (plan(**KW, recompute=rc).rows + plan(**KW, recompute=rc).dropped)[0] for rc in ("none", "op", "full")}
    act = {rc: e.memory["activations"] for rc, e in by.items()}
    assert act["full"] < act["op"] < act["none"]
    assert by["none"].step_time < by["op"].step_time < by["full"].step_time
    assert not by["none"].fits and by["op"].fits  # torchtitan ran it: 82.4 GiB measured
    assert by["none"].hfu == by["none"].mfu and by["op"].mfu < by["op"].hfu  # HFU counts the recomputed matmuls


def test_op_keeps_the_odd_numbered_matmuls_outputs_by_hand():
    m = MODELS["llama3-8b"]  # q 4096, k 1024, v 1024, o 4096, w1 14336, w3 14336, w2 4096 wide
    assert [w for w, _ in _matmuls(m, 1)] == [4096, 1024, 1024, 4096, 14336, 14336, 4096]
    # the block input + the attention output + q, v, w1, w2: 2 bytes each
    assert activation_bytes(m, 1, False, "op", True) == 2 * (4096 + 4096 + 4096 + 1024 + 14336 + 4096)


def test_op_is_priced_only_when_pinned():
    searched = plan("13B", "8xH100-nvlink", gpus=8, global_batch=16)
    assert "op" not in {e.setup.recompute for e in searched.rows + searched.dropped}
    with pytest.raises(ValueError, match="recompute='some' is unknown; use one of 'none', 'selective', 'full', 'op'"):
        plan("13B", "8xH100-nvlink", gpus=8, global_batch=16, recompute="some")
