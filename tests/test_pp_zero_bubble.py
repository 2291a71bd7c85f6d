"""LoopedBFS and the zero-bubble schedules (backward split into B and W) as data: lists that run
without deadlock, every micro-batch once per stage, W after its B, less bubble than 1F1B on unit
costs; the V placement of ``zbv``; parity of ``pp`` with ``single`` under each; building only a
rank's own stages; ``losses``/``outputs`` and ``scale_grads``."""
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import mpkit
from test_pipeline_misuse import batch, net  # a 5-layer nn.Sequential and one batch for it
from mpkit.parallel.pipeline.schedules import (Backward, BackwardInput, BackwardWeight, Forward, placement, schedule,
                                               simulate)

NEW = [("looped_bfs", 2), ("interleaved_zb", 1), ("interleaved_zb", 2), ("zbv", 2)]


def computations(programs):
    return [[ins for ins in prog if isinstance(ins, (Forward, Backward, BackwardInput, BackwardWeight))]
            for prog in programs]


SIZES = [(2, 1), (2, 4), (2, 8), (3, 6), (4, 4), (4, 8), (4, 12)]


@pytest.mark.parametrize("name,v,p,m", [(n, v, p, m) for n, v in NEW for p, m in SIZES
                                        if not (n == "interleaved_zb" and v > 1 and m % p)])  # groups of p
def test_no_deadlock_each_micro_batch_once_per_stage_and_w_after_b(name, v, p, m):
    programs = schedule(name, p, m, v)
    sim = simulate(programs)  # raises on a deadlock, a mismatched message or a missing input
    where = placement(name, p, v)
    kinds = (Forward, BackwardInput, BackwardWeight) if name != "looped_bfs" else (Forward, Backward)
    for rank, ops in enumerate(computations(programs)):
        for op in ops:
            assert where[op.stage] == rank
        counts = Counter((type(op), op.stage) for op in ops)
        assert all(n == m for n in counts.values()) and {k for k, _ in counts} == set(kinds)
        if BackwardWeight in kinds:  # W only after its own B
            for i, op in enumerate(ops):
                if isinstance(op, BackwardWeight):
                    assert BackwardInput(op.mb, op.stage) in ops[:i]
    assert 0 <= sim.bubble < 1


@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 12)])
def test_zero_bubble_fills_the_waits_of_1f1b_with_w(p, m):
    # unit costs F = 1, B = W = 1 (backward 2): W runs where 1F1B's ranks wait
    one_f_one_b = simulate(schedule("1f1b", p, m)).bubble
    zb_h1 = simulate(schedule("interleaved_zb", p, m, 1)).bubble
    zbv = simulate(schedule("zbv", p, m)).bubble
    assert zb_h1 < one_f_one_b and zbv < zb_h1
    # ZB-H1 keeps 1F1B's memory within one micro-batch: W runs at the latest after as many B as
    # the rank's warm-up had forwards
    ours = simulate(schedule("interleaved_zb", p, m, 1)).peak_in_flight
    theirs = simulate(schedule("1f1b", p, m)).peak_in_flight
    assert all(a <= b + 1 for a, b in zip(ours, theirs))


def test_looped_bfs_runs_every_micro_batch_through_a_chunk_before_the_next():
    ops = computations(schedule("looped_bfs", 2, 4, 2))[0]
    forwards = [op.stage for op in ops if isinstance(op, Forward)]
    assert forwards == [0] * 4 + [2] * 4
    backwards = [(op.stage, op.mb) for op in ops if isinstance(op, Backward)]
    assert backwards == [(2, 3), (2, 2), (2, 1), (2, 0), (0, 3), (0, 2), (0, 1), (0, 0)]


def test_zbv_folds_the_stages_in_a_v_and_hands_over_without_a_message():
    assert placement("zbv", 4) == [0, 1, 2, 3, 3, 2, 1, 0]
    last_rank = schedule("zbv", 4, 4)[3]
    # stage 3 -> stage 4 both on rank 3: no SendAct from stage 3, no RecvAct into stage 4
    assert not [i for i in last_rank if type(i).__name__ == "SendAct" and i.stage == 3]
    assert not [i for i in last_rank if type(i).__name__ == "RecvAct" and i.stage == 4]


# ---- parity with single ------------------------------------------------------------------------

# as tests/test_strategy_pp.py: micro-batching and the B/W split change only float32 summation
# order; 1e-5 leaves an order of magnitude over the ~1e-6 seen
ATOL = 1e-5


@pytest.mark.timeout(150)
@pytest.mark.parametrize("model,sizes,optimizer", [("mlp", {"layers": 8}, "adam"), ("gpt", {"layers": 6}, "sgd")])
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("name", ["looped_bfs", "interleaved_zb", "zbv"])
def test_pp_matches_single(name, world_size, model, sizes, optimizer):
    run = mpkit.train("pp", world_size, model=model, steps=3, schedule=name, micro_batches=4, optimizer=optimizer,
                      **sizes)
    ref = run.reference()
    assert max(abs(a - b) for a, b in zip(run.losses, ref.losses)) <= ATOL
    assert set(run.params) == set(ref.params)
    for k, t in ref.params.items():
        assert (run.params[k] - t).abs().max().item() <= ATOL, k
    kinds = {e.name for e in run.trace.events if e.kind == "backward"}
    assert kinds == ({""} if name == "looped_bfs" else {"B", "W"})  # the split shows in the trace


# ---- a rank builds only its own stages -----------------------------------------------------------


def _own_stages(ctx, scale_grads):
    from mpkit.parallel import pipeline
    full = net()
    stages = {0: full[:2], 1: full[2:]}  # every rank could build only its own; the others are dropped here
    loss_fn = (lambda out, y: F.cross_entropy(out, y, reduction="sum")) if not scale_grads else F.cross_entropy
    pipe = pipeline({ctx.rank: stages[ctx.rank]}, num_stages=2, schedule="1f1b", micro_batches=4, loss_fn=loss_fn,
                    scale_grads=scale_grads)
    losses, outputs = [], []
    total = pipe.step(*batch(), losses=losses, outputs=outputs)
    grads = {k: p.grad.clone() for k, p in stages[ctx.rank].named_parameters()}
    return total, [v.item() for v in losses], torch.cat(outputs) if outputs else None, grads


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scale_grads", [True, False])
def test_own_stages_return_outputs_and_losses_and_scale_grads_picks_the_reduction(scale_grads):
    model, (x, y) = net(), batch()
    out = model(x)
    loss = F.cross_entropy(out, y, reduction="mean" if scale_grads else "sum")
    loss.backward()
    res = mpkit.launch(_own_stages, 2, args=(scale_grads,), timeout=40)
    total, losses, outputs, _ = res[1]
    assert res[0][0] is None and len(losses) == 4
    assert abs(total - loss.item()) < 1e-5 * max(1, abs(loss.item()))  # mean of 4 means, or sum of 4 sums
    assert abs((sum(losses) / (4 if scale_grads else 1)) - loss.item()) < 1e-5 * max(1, abs(loss.item()))
    assert torch.allclose(outputs, out, atol=1e-6)
    for rank, layers in ((0, (0,)), (1, (2, 4))):  # slices of an nn.Sequential keep the layer indices
        for i in layers:
            assert torch.allclose(res[rank][3][f"{i}.weight"], model[i].weight.grad, atol=1e-5)


def _wrong_placement(ctx):
    from mpkit.parallel import pipeline
    full = net()
    stages = {0: full[:2], 1: full[2:]}
    pipeline({1 - ctx.rank: stages[1 - ctx.rank]}, num_stages=2, schedule="1f1b", loss_fn=F.cross_entropy)


@pytest.mark.timeout(60)
def test_own_stages_on_the_wrong_rank_are_refused():
    with pytest.raises(mpkit.LaunchError, match=r"rank 0 holds stages \[1\], but the schedule puts stages \[0\] there"):
        mpkit.launch(_wrong_placement, 2, timeout=40)


@pytest.mark.parametrize("options,match", [
    ({"schedule": "zbv"}, r"world_size\*2=4\*2 \(schedule='zbv' holds two stages per rank\): stages=8 is more than "
                          r"the 4 layers"),
    ({"schedule": "looped_bfs", "virtual_stages": 1}, "virtual_stages=1: schedule='looped_bfs' needs virtual_stages >= 2"),
    ({"schedule": "interleaved_zb", "micro_batches": 2, "layers": 8}, "needs micro_batches to be a multiple of world_size=4"),
])
def test_bad_options_say_what_to_change(options, match):
    from mpkit.strategies import make_config
    with pytest.raises(ValueError, match=match):
        make_config("pp", 4, **options)
