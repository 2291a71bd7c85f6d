"""DualPipeV as schedule data: each rank's computations in the order torch 2.13's
``ScheduleDualPipeV`` builds (its ``OVERLAP_F_B`` pairs unfolded into their forward and whole
backward, as torch's runtime runs them), lists that run without deadlock on the V placement,
parity of ``pp`` with ``single``, and torch's own V-shaped pipelining case through the adapter of
``tests/test_pipeline_torch_cases.py`` (gradients against the whole model and against torch's class)."""
from collections import Counter
from types import SimpleNamespace

import pytest
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, _ComputationType

import mpkit
from mpkit.parallel.pipeline.schedules import (Backward, BackwardInput, BackwardWeight, Forward, compute_orders,
                                               placement, schedule, simulate)
from test_pipeline_torch_cases import run_case

KINDS = {_ComputationType.FORWARD: Forward, _ComputationType.FULL_BACKWARD: Backward,
         _ComputationType.BACKWARD_INPUT: BackwardInput, _ComputationType.BACKWARD_WEIGHT: BackwardWeight}
SIZES = [(2, 4), (2, 5), (2, 8), (3, 6), (3, 9), (4, 8), (4, 12), (4, 16)]


def torch_order(p, m, rank):
    """torch's ``pipeline_order[rank]`` (computations only, before it adds the messages), with each
    OVERLAP_F_B unfolded into its sub-actions in their order."""
    state = SimpleNamespace(pp_group_size=p, _n_microbatches=m)  # all the method reads of the schedule
    order = []
    for action in ScheduleDualPipeV._calculate_single_rank_operations(state, rank):
        subs = action.sub_actions if action.computation_type == _ComputationType.OVERLAP_F_B else (action,)
        order += [KINDS[a.computation_type](a.microbatch_index, a.stage_index) for a in subs]
    return order


@pytest.mark.parametrize("p,m", SIZES)
def test_compute_order_is_torchs(p, m):
    ours = compute_orders("dualpipev", p, m)
    for rank in range(p):
        assert ours[rank] == torch_order(p, m, rank), f"rank {rank}"


@pytest.mark.parametrize("p,m", SIZES)
def test_runs_on_the_v_each_micro_batch_once_per_stage(p, m):
    programs = schedule("dualpipev", p, m)
    sim = simulate(programs)  # raises on a deadlock, a mismatched message or a missing input
    where = placement("dualpipev", p)
    assert where == [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    for rank, prog in enumerate(programs):
        ops = [i for i in prog if isinstance(i, (Forward, Backward, BackwardInput, BackwardWeight))]
        assert {where[op.stage] for op in ops} == {rank}
        forwards = Counter(op.stage for op in ops if isinstance(op, Forward))
        backwards = Counter(op.stage for op in ops if isinstance(op, (Backward, BackwardInput)))
        assert set(forwards.values()) == set(backwards.values()) == {m} and len(forwards) == 2
        for i, op in enumerate(ops):  # a W only after its own B, and every B has its W
            if isinstance(op, BackwardWeight):
                assert BackwardInput(op.mb, op.stage) in ops[:i]
        assert (sum(isinstance(op, BackwardInput) for op in ops) == sum(isinstance(op, BackwardWeight) for op in ops))
        # both kinds of backward: whole ones (paired with a forward in the main phase) and split ones at the edges
        assert any(isinstance(op, Backward) for op in ops) and any(isinstance(op, BackwardInput) for op in ops)
    assert 0 < sim.bubble < 1


@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 16)])
def test_less_bubble_than_1f1b_on_unit_costs(p, m):
    # F = 1, B = 2 (W = 1 where split): the V and the split W at the edges beat 1F1B's (p-1)/(m+p-1);
    # the overlap of a pair's compute and communication, DualPipe's point, is not in unit costs
    assert simulate(schedule("dualpipev", p, m)).bubble < simulate(schedule("1f1b", p, m)).bubble


def test_too_few_micro_batches_say_what_to_change():
    with pytest.raises(ValueError, match=r"schedule='dualpipev' needs micro_batches >= 2\*\(pipeline ranks\)=8"):
        schedule("dualpipev", 4, 6)
    with pytest.raises(ValueError, match=r"micro_batches >= 2\*\(pipeline ranks\)=4"):
        mpkit.train("pp", 2, schedule="dualpipev", micro_batches=2, steps=1)


# as tests/test_pp_zero_bubble.py: micro-batching and the B/W split change only float32 summation
# order; 1e-5 leaves an order of magnitude over the ~1e-6 seen. The gpt runs SGD, as there: Adam
# divides by sqrt(v), so a parameter whose gradient is ~0 moves by lr on a float32 rounding (2e-5 seen)
ATOL = 1e-5


@pytest.mark.timeout(200)
@pytest.mark.parametrize("world_size,model,sizes,optimizer", [(2, "mlp", {"layers": 8}, "adam"),
                                                              (2, "gpt", {"layers": 6}, "sgd"),
                                                              (4, "mlp", {"layers": 8}, "adam")])
def test_pp_matches_single(world_size, model, sizes, optimizer):
    m = 2 * world_size
    run = mpkit.train("pp", world_size, model=model, steps=3, schedule="dualpipev", micro_batches=m, batch_size=8 * m,
                      optimizer=optimizer, **sizes)
    ref = run.reference()
    assert max(abs(a - b) for a, b in zip(run.losses, ref.losses)) <= ATOL
    assert set(run.params) == set(ref.params)
    for k, t in ref.params.items():
        assert (run.params[k] - t).abs().max().item() <= ATOL, k
    kinds = Counter(e.name for e in run.trace.events if e.kind == "backward")
    assert kinds[""] and kinds["B"] and kinds["W"] == kinds["B"]  # whole backwards and split ones, in the trace


# ---- torch's V-shaped case (test_schedule_multiproc.py's ZBV/DualPipeV test) through the adapter ----

@pytest.mark.timeout(200)
@pytest.mark.parametrize("world_size", [2, 4])
def test_torch_case_from_a_whole_nn_sequential(world_size):
    # pipeline() cuts an ordinary nn.Sequential of 2p MLP blocks and keeps this rank's V (2 ranks: stages 0 and 3, 1 and 2)
    p = world_size
    run_case(p, "ScheduleDualPipeV", {r: [r, 2 * p - 1 - r] for r in range(p)}, m=2 * p, whole_model=True)


@pytest.mark.timeout(200)
def test_torch_case_on_4_ranks_from_own_stages():
    run_case(4, "ScheduleDualPipeV", {r: [r, 7 - r] for r in range(4)}, m=8)
